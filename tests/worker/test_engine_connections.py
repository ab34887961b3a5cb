"""The worker keeps its engine connection alive between requests, and never reuses one it cut.

Read from the stand-in's own access lines, which name the client's address and port as uvicorn's do
(`INFO:     127.0.0.1:54321 - "POST /v1/completions HTTP/1.1" 200 OK`): requests one after another
through the worker arrive on one engine connection (the SDK opened a new one per request); after a
client went away mid-stream, that connection is closed and the next request comes on a new one; a
connection idle for longer than the worker keeps it is never reused, so the engine's own keep-alive
timeout never closes one under a request. A loaded worker has opened its first burst's connections
(BAKERY_ENGINE_READY_CONNECTIONS), counted in /proc/net/tcp.
"""

from __future__ import annotations

import ast
import re
import resource
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bakery.paths import REPO_ROOT
from policy import admission
from tests.worker.helpers import Harness
from tests.worker.serving import MODEL, EventStream, envelope, wait_record

pytestmark = pytest.mark.slow
ACCESS = re.compile(r'127\.0\.0\.1:(\d+) - "POST (/v1/\S+) HTTP/1\.1" (\d+)')
GUARDS = REPO_ROOT / "worker" / "policy" / "guards.py"
# The engines close an idle connection after 5 s (uvicorn's default, which vLLM and SGLang keep, and
# llama.cpp's HTTP server); the worker must let go of it first, with room for a slow loop turn.
ENGINES_KEEPALIVE = 5.0
MARGIN = 1.0
OTHERS = 4  # engine connections besides the pool's: the SDK's benchmark, its aiohttp session's


def engine_keepalive() -> float:
    """guards.ENGINE_KEEPALIVE, read from the source (aiohttp is in the worker venv, not here)."""
    for node in ast.parse(GUARDS.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["ENGINE_KEEPALIVE"]:
            return float(ast.literal_eval(node.value))
    raise AssertionError(f"{GUARDS} no longer assigns ENGINE_KEEPALIVE")


def one_answer(port: int, route: str, idx: int) -> None:
    stream = EventStream(port, route, envelope(
        {"model": MODEL, "messages": [{"role": "user", "content": f"n{idx}"}], "max_tokens": 2}, idx))
    assert stream.status == 200, stream.rest()
    stream.rest()
    stream.close()


def engine_ports(log: Path, path: str) -> list[int]:
    """The client port of each POST to `path` in the stand-in's log, in order."""
    return [int(m.group(1)) for m in ACCESS.finditer(log.read_text()) if m.group(2) == path]


def test_requests_share_one_engine_connection_and_a_cut_one_is_not_reused(harness: Harness) -> None:
    steps, record = harness.tmp / "steps", harness.tmp / "record.jsonl"
    steps.mkdir()
    engine = harness.standin("vllm", STANDIN_STEP_DIR=str(steps), STANDIN_STREAM_RECORD=str(record),
                             STANDIN_REPLY_TOKENS="20")
    # One process's pool (a front process has its own: requests on new connections alternate), and no
    # connections opened at load: while those still open, a request may be handed a newer one (a busy
    # machine's fresh run saw [a, b, b]).
    served, log = harness.serve("vllm", engine, MODEL_NAME=MODEL, BAKERY_FRONT_PROCESSES="0",
                                BAKERY_ENGINE_READY_CONNECTIONS="0"), engine.log
    route = "/v1/chat/completions"
    before = len(engine_ports(log, route))
    for idx in range(3):
        one_answer(served.port, route, idx + 1)
    ports = engine_ports(log, route)[before:]
    assert len(ports) == 3 and len(set(ports)) == 1, ports

    # A stream the client leaves: its engine connection is closed, never handed to the next request.
    held = EventStream(served.port, route, envelope(
        {"model": MODEL, "messages": [{"role": "user", "content": "left"}], "stream": True}, 9))
    assert held.status == 200 and held.next_event()
    held.close()
    served.worker.wait_for("cancelled (client disconnect)")
    (steps / "go-all").touch()
    assert wait_record(record, "left")["outcome"] in {"BrokenPipeError", "ConnectionResetError"}
    stream = EventStream(served.port, route, envelope(
        {"model": MODEL, "messages": [{"role": "user", "content": "after"}], "max_tokens": 2}, 10))
    assert stream.status == 200
    stream.rest()
    stream.close()
    cut, after = engine_ports(log, route)[-2:]
    assert cut != after and after not in ports, (ports, cut, after)


def test_an_idle_engine_connection_is_reused_until_the_worker_lets_it_go(harness: Harness) -> None:
    keepalive = engine_keepalive()
    assert keepalive <= ENGINES_KEEPALIVE - MARGIN, f"ENGINE_KEEPALIVE {keepalive} s is too close to the engines' 5 s"
    engine = harness.standin("vllm", STANDIN_REPLY_TOKENS="2")
    # The pool's own rule, without renewal between bursts (engine_warm.py; test_engine_warm.py).
    served, log = harness.serve("vllm", engine, MODEL_NAME=MODEL, BAKERY_ENGINE_KEEP_WARM="0",
                                BAKERY_FRONT_PROCESSES="0", BAKERY_ENGINE_READY_CONNECTIONS="0"), engine.log  # as above
    assert "idle engine connections: not renewed (BAKERY_ENGINE_KEEP_WARM=0)" in served.worker.text
    route = "/v1/chat/completions"
    before = len(engine_ports(log, route))
    one_answer(served.port, route, 1)
    time.sleep(keepalive - MARGIN)
    one_answer(served.port, route, 2)  # idle for less than the keep-alive: the same connection
    time.sleep(keepalive + 0.5)
    one_answer(served.port, route, 3)  # idle for longer: a new one, before the engine would drop it
    first, reused, fresh = engine_ports(log, route)[before:]
    assert reused == first, (first, reused)
    assert fresh != first, (first, fresh)


def open_to(port: int) -> int:
    """Established TCP connections on this machine whose far end is 127.0.0.1:`port` (/proc/net/tcp):
    the worker's ends of its engine connections, when `port` is the engine's."""
    far = f"0100007F:{port:04X}"
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for line in lines if line.split()[2] == far and line.split()[3] == "01")


def until(count: Callable[[], int], at_least: int, seconds: float = 20.0) -> int:
    """`count()` once it reaches `at_least`, or its last value after `seconds`."""
    end = time.monotonic() + seconds
    seen = count()
    while seen < at_least and time.monotonic() < end:
        time.sleep(0.1)
        seen = count()
    return seen


def test_a_loaded_worker_has_opened_its_first_bursts_engine_connections(harness: Harness) -> None:
    """vLLM's default (engine_warm.py): 256 connections opened once the model is loaded, before any
    request; the SDK's benchmark and its own aiohttp session (health probes) may hold a few more."""
    engine = harness.standin("vllm", STANDIN_REPLY_TOKENS="2")
    served = harness.serve("vllm", engine, MODEL_NAME=MODEL)
    assert re.search(r"256 opened when the model is loaded(, 128 by each of the worker's processes)? "
                     r"\(BAKERY_ENGINE_READY_CONNECTIONS\)", served.worker.text), served.worker.text
    assert 256 <= until(lambda: open_to(engine.port), 256) <= 256 + OTHERS
    one_answer(served.port, "/v1/chat/completions", 1)  # served on one of them: none more opened
    assert open_to(engine.port) <= 256 + OTHERS


def test_with_none_asked_only_requests_open_engine_connections(harness: Harness) -> None:
    engine = harness.standin("vllm", STANDIN_REPLY_TOKENS="2")
    served = harness.serve("vllm", engine, MODEL_NAME=MODEL, BAKERY_ENGINE_READY_CONNECTIONS="0")
    assert "none opened before the first request (BAKERY_ENGINE_READY_CONNECTIONS=0)" in served.worker.text
    time.sleep(1.0)
    assert open_to(engine.port) <= OTHERS


def max_open_files(pid: int) -> int:
    """The soft open-files limit of process `pid` (/proc/PID/limits)."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError(f"/proc/{pid}/limits names no open-files limit")


def test_connections_opened_at_load_count_in_the_open_files_limit(harness: Harness) -> None:
    """More engine connections asked at load than BAKERY_MAX_CONNECTIONS admits: the worker, started
    with a soft limit of 1024 open files, raises it to hold the cap's client connections, the 1024
    engine ones and the rest (admission.fds_needed), and opens them all."""
    engine = harness.standin("vllm", STANDIN_REPLY_TOKENS="2")  # started with this process's own limit
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = admission.fds_needed(64, 1024)  # the cap, the connections at load, the lingering and spare
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.fail(f"this machine's hard open-files limit ({hard}) is below the {need} this test needs")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # what the worker inherits
    try:
        served = harness.serve("vllm", engine, MODEL_NAME=MODEL, BAKERY_MAX_CONNECTIONS="64",
                               BAKERY_ENGINE_READY_CONNECTIONS="1024")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert max_open_files(served.worker.popen.pid) >= need
    assert 1024 <= until(lambda: open_to(engine.port), 1024) <= 1024 + OTHERS
    assert "open-files limit" not in served.worker.text
