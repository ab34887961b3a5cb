"""own_handler.py: bakery's route handler against the SDK's own Backend.__handle_request.

Differential, in the worker venv: the same request meets the SDK's handler (vastai 1.9.1, the real
method on a Backend) and bakery's, each with a recorder for Metrics, and every scenario the SDK's
handler distinguishes (served; JSON it cannot parse; missing fields; a refused signature; a queue
over max_queue_time; an engine call or a response that fails; a client gone mid-call) must give the
same answer (status and body), the same outcome calls on Metrics in the same order with the same
request state, and the same engine calls. A session request goes to the SDK's handler (sessions are the
SDK's); a queued route (bakery makes none) is served as the SDK serves it. The whole worker test suite runs
on bakery's handler besides (core.run installs it as every route's).
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.worker.helpers import WORKER_DIR

SCRIPT = textwrap.dedent("""
    import asyncio, json, sys
    sys.path.insert(0, sys.argv[1])
    import vastai  # noqa: F401 (loads the serverless worker, as run() does)
    from collections import deque
    from vastai.serverless.server.lib.backend import Backend
    from vastai.serverless.server.lib.data_types import JsonDataException
    from aiohttp import web
    from control import own_handler, sdk_seam
    from types import SimpleNamespace

    class ModelMetrics:
        wait_time = 0.0

    class Recorder:
        def __init__(self, calls):
            self.calls, self.model_metrics = calls, ModelMetrics()
            self.system_metrics = SimpleNamespace(model_is_loaded=True)
        def note(self, name, rm, *rest):
            self.calls.append([name, rm.request_idx, rm.reqnum, rm.workload, rm.status, rm.success,
                               rm.work_started_at > 0, *rest])
        def _request_start(self, rm): self.note("start", rm)
        def _request_end(self, rm): self.note("end", rm)
        def _request_success(self, rm): self.note("success", rm)
        def _request_errored(self, rm, message): self.note("errored", rm, message)
        def _request_canceled(self, rm): self.note("canceled", rm)
        def _request_reject(self, rm): self.note("reject", rm)
        async def _Metrics__send_delete_requests_and_reset(self): pass  # what sdk_seam.Outcomes finds

    class Auth:
        def __init__(self, d): self.request_idx, self.reqnum = d["request_idx"], d["reqnum"]

    class Payload:
        def __init__(self, d): self.d = d
        def count_workload(self): return float(len(self.d.get("prompt", "")))

    class Handler:
        remote_function = None
        def __init__(self, scenario):
            self.allow_parallel_requests = scenario != "queued"
            self.max_queue_time = 600.0 if scenario != "no_queue_limit" else None
            self.scenario = scenario
        def get_data_from_request(self, data):
            missing = {k: "field missing" for k in ("auth_data", "payload") if k not in data}
            if missing:
                raise JsonDataException(missing)
            return Auth(data["auth_data"]), Payload(data["payload"]), data.get("session_id")
        async def generate_client_response(self, request, answer):
            if self.scenario == "respond_fails":
                raise ValueError("the answer could not be written")
            return web.Response(status=answer["status"], text=answer["text"])

    class Request:
        def __init__(self, body): self.body = body
        async def json(self): return json.loads(self.body)

    GOOD = {"auth_data": {"request_idx": 7, "reqnum": 11}, "payload": {"prompt": "hello"}}
    BODIES = {"invalid_json": "{not json", "missing": json.dumps({"auth_data": GOOD["auth_data"]}),
              "session": json.dumps({**GOOD, "session_id": "s-1"})}

    def backend(scenario, calls):
        b = object.__new__(Backend)
        b.metrics = Recorder(calls)
        b.queue, b._queue_lock = deque(), asyncio.Lock()
        b.sessions, b._sessions_lock = {}, asyncio.Lock()
        b.metrics.model_metrics.wait_time = 601.0 if scenario == "queue_full" else 599.0
        b._Backend__check_signature = lambda auth: (calls.append(["signature", auth.reqnum])
                                                     or scenario != "unsigned")
        async def call_backend(handler, payload):
            calls.append(["engine", payload.d])
            if scenario == "engine_fails":
                raise ConnectionError("the engine went away")
            if scenario == "cancelled":
                await asyncio.Event().wait()
            return {"status": 200, "text": "served"}
        b._Backend__call_backend = call_backend
        return b

    async def run(scenario, own):
        calls = []
        b = backend(scenario, calls)
        request = Request(BODIES.get(scenario, json.dumps(GOOD)))
        handler = Handler(scenario)
        if own:  # bakery's chains are the ones the SDK's handler calls here: only the handler differs
            ctx = SimpleNamespace(outcomes=sdk_seam.Outcomes(b), check_signature=b._Backend__check_signature,
                                  call_engine=b._Backend__call_backend)
            _, handle = own_handler.install(ctx, b)
            task = asyncio.ensure_future(handle(handler)(request))
        else:
            task = asyncio.ensure_future(b._Backend__handle_request(handler=handler, request=request))
        if scenario == "cancelled":
            for _ in range(20):
                await asyncio.sleep(0)
            task.cancel()
        response = await task
        return {"status": response.status, "body": response.text, "calls": calls}

    async def main():
        scenarios = ["served", "no_queue_limit", "invalid_json", "missing", "unsigned", "queue_full",
                     "engine_fails", "respond_fails", "cancelled", "session", "queued"]
        out = {}
        for scenario in scenarios:
            out[scenario] = [await run(scenario, own=False), await run(scenario, own=True)]
        print(json.dumps(out))

    asyncio.run(main())
""")

SCENARIOS = ("served", "no_queue_limit", "invalid_json", "missing", "unsigned", "queue_full", "engine_fails",
             "respond_fails", "cancelled", "session", "queued")


@pytest.fixture(scope="module")
def outcomes(worker_python: Path) -> dict:
    env = {**os.environ, "CONTAINER_ID": "5", "REPORT_ADDR": "http://127.0.0.1:9", "PUBLIC_IPADDR": "203.0.113.7",
           "USE_SSL": "false", "WORKER_PORT": "3000", "VAST_TCP_PORT_3000": "41234"}  # what the SDK reads
    done = subprocess.run([str(worker_python), "-c", SCRIPT, str(WORKER_DIR)], capture_output=True, text=True,
                          timeout=120, check=False, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_bakerys_handler_answers_and_reports_as_the_sdks(outcomes: dict, scenario: str) -> None:
    sdk, own = outcomes[scenario]
    assert own == sdk


def test_the_scenarios_reach_every_branch(outcomes: dict) -> None:
    """The differential above is worth what the scenarios cover: each one's answer and outcome
    calls, as the SDK gives them."""
    status = {name: pair[0]["status"] for name, pair in outcomes.items()}
    assert status == {"served": 200, "no_queue_limit": 200, "invalid_json": 422, "missing": 422, "unsigned": 401,
                      "queue_full": 429, "engine_fails": 500, "respond_fails": 500, "cancelled": 499,
                      "session": 410, "queued": 200}
    names = {name: [call[0] for call in pair[0]["calls"]] for name, pair in outcomes.items()}
    assert names["served"] == ["signature", "start", "engine", "success", "end"]
    assert names["unsigned"] == ["signature", "reject"]
    assert names["queue_full"] == ["signature", "reject"]
    assert names["engine_fails"] == ["signature", "start", "engine", "errored", "end"]
    assert names["cancelled"] == ["signature", "start", "engine", "canceled", "end"]
    assert names["invalid_json"] == names["missing"] == names["session"] == []
    assert json.loads(outcomes["missing"][0]["body"]) == {"payload": "field missing"}
