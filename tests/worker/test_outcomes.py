"""sdk_seam.Outcomes: a request's record kept as vastai 1.9.1's Metrics keeps it, without its private methods.

Differential, in the worker venv: the same random runs of requests (plain ones and ones inside a session,
reqnums that repeat, every outcome in the orders the route handler and the guards report them) are reported
to one real SDK Metrics through its own `_request_*` methods and to another through bakery's Outcomes. After
every step the two must hold the same counters, the same requests received, in flight and ended (each with
the same state), the same `update_pending`, and log the same lines at the same levels.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

from tests.worker.helpers import WORKER_DIR

SCRIPT = textwrap.dedent("""
    import json, logging, random, sys
    sys.path.insert(0, sys.argv[1])
    import vastai  # noqa: F401 (loads the serverless worker, as run() does)
    from types import SimpleNamespace
    from vastai.serverless.server.lib.data_types import RequestMetrics, Session
    from vastai.serverless.server.lib.metrics import Metrics
    from control import sdk_seam

    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append([record.levelname, record.getMessage()])

    log = sdk_seam.metrics_logger()
    log.setLevel(logging.DEBUG)
    log.addHandler(Keep())
    log.propagate = False

    def state(metrics, records):
        m = metrics.model_metrics
        entry = lambda r: [r.request_idx, r.reqnum, r.workload, r.status, r.success, r.work_completed_at > 0]
        return {"counts": [m.workload_pending, m.workload_received, m.workload_served, m.workload_errored,
                           m.workload_cancelled, m.workload_rejected],
                "received": sorted(m.requests_recieved),
                "working": {str(k): entry(v) for k, v in m.requests_working.items()},
                "deleting": [entry(r) for r in m.requests_deleting], "update_pending": metrics.update_pending,
                "served": metrics.last_request_served > 0, "records": [entry(r) for r in records]}

    ENDINGS = [["start", "success", "end"], ["start", "errored", "end"], ["start", "canceled", "end"], ["reject"],
               ["start", "end"]]
    rng = random.Random(int(sys.argv[2]))
    sdk, ours = Metrics(), Metrics()
    told = sdk_seam.Outcomes(SimpleNamespace(metrics=ours))
    session = Session(session_id="s", lifetime=60.0, expiration=0.0, on_close_route="", on_close_payload={},
                      auth_data=None, created_at=0.0, request_idx=99)
    runs = {"steps": 0, "differ": [], "lines": 0, "kinds": set()}
    records = {"sdk": [], "ours": []}
    for i in range(400):
        reqnum = rng.randrange(40)  # repeats: the SDK keys its in-flight requests by reqnum
        workload = rng.choice([0.0, 1.0, 2.5, 100.0, 1e-3])
        in_session = rng.random() < 0.15
        is_session = not in_session and rng.random() < 0.05  # a session's own record
        steps = rng.choice(ENDINGS)
        made = []
        for side, metrics in (("sdk", sdk), ("ours", ours)):
            record = RequestMetrics(request_idx=i, reqnum=reqnum, workload=workload, status="Created",
                                    is_session=is_session)
            if in_session:
                record.session = session
                record.session_reqnum = rng.randrange(5) if side == "sdk" else made[0].session_reqnum
            made.append(record)
            records[side].append(record)
        for step in steps:
            before = len(lines)
            for side, record in zip(("sdk", "ours"), made):
                if side == "sdk":
                    method = getattr(sdk, "_request_" + step)
                    method(record, "engine down") if step == "errored" else method(record)
                else:
                    method = getattr(told, step)
                    method(record, "engine down") if step == "errored" else method(record)
            half = (len(lines) - before) // 2
            if lines[before:before + half] != lines[before + half:]:
                runs["differ"].append(["lines", i, step, lines[before:]])
            runs["kinds"].add(step)
            a, b = state(sdk, records["sdk"]), state(ours, records["ours"])
            if a != b:
                runs["differ"].append(["state", i, step, a, b])
            runs["steps"] += 1
            sdk.update_pending = ours.update_pending = False
        runs["lines"] = len(lines)
    runs["kinds"] = sorted(runs["kinds"])
    runs["differ"] = runs["differ"][:3]
    print(json.dumps(runs))
""")


def run_differential(worker_python: Path, seed: int) -> dict:
    env = {**os.environ, "CONTAINER_ID": "5", "REPORT_ADDR": "http://127.0.0.1:9", "PUBLIC_IPADDR": "203.0.113.7",
           "USE_SSL": "false", "WORKER_PORT": "3000", "VAST_TCP_PORT_3000": "41234"}  # what the SDK's Metrics reads
    done = subprocess.run([str(worker_python), "-c", SCRIPT, str(WORKER_DIR), str(seed)], capture_output=True,
                          text=True, timeout=120, check=False, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_outcomes_keep_the_record_as_the_sdks_metrics_do(worker_python: Path) -> None:
    for seed in (5, 11):
        runs = run_differential(worker_python, seed)
        assert runs["differ"] == [], runs["differ"]
        assert runs["kinds"] == ["canceled", "end", "errored", "reject", "start", "success"]
        assert runs["steps"] > 800 and runs["lines"] > 2 * runs["steps"] * 0.9  # each side logged each step
