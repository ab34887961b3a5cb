"""queue_wait.py: the SDK's queue estimate kept as requests come and go, not summed per request.

The SDK answers 429 once `ModelMetrics.wait_time` (the workload in flight over the measured
throughput) exceeds max_queue_time, and computes it by summing every request in flight on every
request. These tests hold the kept sum to the exact sum of what is in flight after every change, in
any order of changes, and, on the real SDK in the worker venv, hold the installed `wait_time` to the
SDK's own through its own request start and end.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from control import queue_wait
from control.queue_wait import Working
from tests.worker.helpers import WORKER_DIR


@dataclass
class Request:
    workload: Any
    is_session: bool = False


def expected(mirror: dict[int, Request]) -> float | None:
    shares = [r.workload for r in mirror.values() if not r.is_session]
    if any(not math.isfinite(w) for w in shares):
        return None
    return math.fsum(shares)


def test_the_sum_follows_every_change_exactly() -> None:
    """Random starts, ends, replacements and bulk changes; workloads with fractions (the routes'
    multiples of the unit), sessions and, now and then, one that is not finite."""
    rng = random.Random(24)  # noqa: S311 (a reproducible sequence, not a secret)
    working, mirror = Working(), {}
    for step in range(20_000):
        op = rng.random()
        key = rng.randrange(300)
        if op < 0.45:
            workload = rng.choice([0.1, 0.7, 1.0, 3.3, 8.0]) * rng.choice([1, 500, 2048]) * rng.random()
            if rng.random() < 0.002:
                workload = rng.choice([math.inf, math.nan])
            request = Request(workload, is_session=rng.random() < 0.05)
            working[key] = request
            mirror[key] = request
        elif op < 0.85:
            assert working.pop(key, None) is mirror.pop(key, None)
        elif op < 0.9 and key in mirror:
            del working[key]
            del mirror[key]
        elif op < 0.93 and mirror:
            assert working.popitem() == mirror.popitem()
        elif op < 0.96:
            batch = {rng.randrange(300): Request(rng.random() * 100) for _ in range(5)}
            working.update(batch)
            mirror.update(batch)
        elif op < 0.97:
            working |= {key: Request(2.5)}
            mirror[key] = Request(2.5)
            working[key] = mirror[key]
        elif op < 0.98:
            assert working.setdefault(key, Request(1.5)) is mirror.setdefault(key, working[key])
        elif op < 0.985:
            working.clear()
            mirror.clear()
        assert dict(working) == mirror, step
        assert working.total() == expected(mirror), step
        if not mirror:
            assert working.units == 0, step
    assert len(mirror) > 50  # the loop ended with many in flight


def test_pop_without_default_raises_as_a_dict_does() -> None:
    working = Working()
    with pytest.raises(KeyError):
        working.pop(7)
    assert working.pop(7, "none") == "none"


def test_made_from_what_is_already_in_flight() -> None:
    working = Working({1: Request(2.0), 2: Request(0.5), 3: Request(9.0, is_session=True)})
    assert working.total() == 2.5
    assert working.pop(1).workload == 2.0
    assert working.total() == 0.5


def test_the_estimate_reads_the_kept_sum_and_falls_back_otherwise() -> None:
    calls: list[Any] = []

    def sdk_wait_time(metrics: Any) -> float:
        calls.append(metrics)
        return -1.0

    wait_time = queue_wait.estimate(sdk_wait_time)

    @dataclass
    class Metrics:
        requests_working: dict
        max_throughput: float

    assert wait_time(Metrics(Working(), 0.0)) == 0.0
    assert wait_time(Metrics(Working({1: Request(30.0), 2: Request(10.0)}), 4.0)) == 10.0
    assert wait_time(Metrics(Working({1: Request(1.0)}), 0.0)) == 1.0 / 0.00001  # the SDK's floor
    assert calls == []
    plain = Metrics({1: Request(30.0)}, 4.0)
    assert wait_time(plain) == -1.0  # a dict the worker did not make: the SDK's own sum
    unsummable = Metrics(Working({1: Request(math.inf)}), 4.0)
    assert wait_time(unsummable) == -1.0
    assert calls == [plain, unsummable]


REAL_SDK = textwrap.dedent("""
    import json, random, sys
    sys.path.insert(0, sys.argv[1])
    import vastai  # noqa: F401 (loads the serverless worker, as run() does)
    from vastai.serverless.server.lib.data_types import ModelMetrics, RequestMetrics
    from vastai.serverless.server.lib.metrics import Metrics
    from types import SimpleNamespace
    from control import queue_wait, sdk_seam

    sdk_wait_time = ModelMetrics.wait_time.fget
    metrics = Metrics()
    metrics.model_metrics.max_throughput = 37.5
    plane = sdk_seam.ControlPlane(SimpleNamespace(metrics=metrics))
    installed = [queue_wait.install(plane), queue_wait.install(plane)]
    kept = type(metrics.model_metrics.requests_working).__name__
    rng = random.Random(5)
    in_flight, worst, steps, over = [], 0.0, 0, []
    for i in range(4000):
        ending = 0.3 if (i // 500) % 2 == 0 else 0.7  # in flight grows, then shrinks, four times
        if in_flight and rng.random() < ending:
            metrics._request_end(in_flight.pop(rng.randrange(len(in_flight))))
        else:
            workload = rng.choice([0.1, 0.25, 1.0, 8.0]) * 500 * rng.random()
            request = RequestMetrics(request_idx=i, reqnum=i, workload=workload, status="",
                                     is_session=rng.random() < 0.05)
            metrics._request_start(request)
            in_flight.append(request)
        ours, theirs = metrics.model_metrics.wait_time, sdk_wait_time(metrics.model_metrics)
        worst = max(worst, abs(ours - theirs) / max(abs(theirs), 1e-300))
        over.append([ours > 600.0, theirs > 600.0])  # bakery's max_queue_time: 429 above it
        steps += 1
    while in_flight:
        metrics._request_end(in_flight.pop())
    print(json.dumps({"installed": installed, "kept": kept, "worst": worst, "steps": steps,
                      "decisions_differ": sum(a != b for a, b in over),
                      "crossings": sum(a[0] != b[0] for a, b in zip(over, over[1:])),
                      "empty": metrics.model_metrics.wait_time,
                      "wraps_the_sdks": ModelMetrics.wait_time.fget.original is sdk_wait_time}))
""")


@pytest.mark.slow
def test_real_sdk_wait_time_is_the_sdks(worker_python: Path) -> None:
    """In the worker venv: through the SDK's own request start and end, the installed estimate is the
    SDK's sum to within rounding (the SDK adds left to right; this one is the exact sum, rounded
    once), the 429 decisions at bakery's 600 s limit are the same, and installing twice is once."""
    env = {**os.environ, "CONTAINER_ID": "5", "REPORT_ADDR": "http://127.0.0.1:9", "PUBLIC_IPADDR": "203.0.113.7",
           "USE_SSL": "false", "WORKER_PORT": "3000", "VAST_TCP_PORT_3000": "41234"}  # what the SDK's Metrics reads
    done = subprocess.run([str(worker_python), "-c", REAL_SDK, str(WORKER_DIR)], capture_output=True,
                          text=True, timeout=120, check=False, env=env)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["installed"] == [True, True]
    assert got["kept"] == "Working"
    assert got["steps"] == 4000
    assert got["worst"] < 1e-12, got
    assert got["crossings"] >= 4, got  # the limit was crossed both ways
    assert got["decisions_differ"] == 0
    assert got["wraps_the_sdks"] is True
    assert got["empty"] == 0.0
