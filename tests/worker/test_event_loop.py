"""BAKERY_EVENT_LOOP: the worker runs on uvloop by default, on asyncio's own loop when asked, and on
asyncio's loop with a warning when uvloop cannot be imported.

The rest of tests/worker runs every behaviour on the default (uvloop); the served test below runs the
paths that depend on the loop's transports (a streamed answer written from the engine connection's
callbacks, the connection cap's 503) on both loops.
"""

from __future__ import annotations

import gc
import json
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest

from app import event_loop, worker_config
from config import table
from tests.worker.helpers import WORKER_DIR, Harness, baked_facts
from tests.worker.serving import MODEL, EventStream, envelope
from workers.vllm.worker import DEFAULTS

ENV = {"CONTAINER_ID": "5", "REPORT_ADDR": "http://127.0.0.1:9", "WORKER_PORT": "3000", "PUBLIC_IPADDR": "203.0.113.7",
       "VAST_TCP_PORT_3000": "41234", **baked_facts("vllm")}


@pytest.mark.parametrize(("given", "chosen", "warned"), [
    (None, "uvloop", False), ("uvloop", "uvloop", False), (" AsyncIO ", "asyncio", False), ("", "uvloop", False),
    ("trio", "uvloop", True),
])
def test_the_setting(given: str | None, chosen: str, warned: bool) -> None:
    env = {**ENV, **({} if given is None else {"BAKERY_EVENT_LOOP": given})}
    settings = worker_config.load_settings(DEFAULTS, env)
    assert settings.loop_choice == chosen
    said = [w for w in settings.warnings if "BAKERY_EVENT_LOOP" in w]
    assert bool(said) is warned, settings.warnings
    if warned:
        assert said == ["BAKERY_EVENT_LOOP='trio' is not one of uvloop, asyncio; using uvloop"]
    assert table.BY_NAME["BAKERY_EVENT_LOOP"].default == event_loop.DEFAULT


RUNS_ON = textwrap.dedent("""
    import asyncio, json, sys
    sys.path.insert(0, sys.argv[1])
    if sys.argv[3] == "blocked":
        sys.modules["uvloop"] = None  # an import of it raises ImportError, as in a venv without it
    from app import event_loop

    async def which():
        return type(asyncio.get_running_loop()).__module__

    name, warning = event_loop.install(sys.argv[2])
    print(json.dumps({"name": name, "warning": warning, "runs_on": asyncio.run(which())}))
""")


@pytest.mark.parametrize(("choice", "uvloop", "name", "runs_on", "warned"), [
    ("uvloop", "present", "uvloop 0.23.0", "uvloop", False),
    ("asyncio", "present", "asyncio", "asyncio.unix_events", False),
    ("uvloop", "blocked", "asyncio", "asyncio.unix_events", True),
])
def test_asyncio_run_uses_the_chosen_loop(worker_python: Path, choice: str, uvloop: str, name: str,
                                          runs_on: str, warned: bool) -> None:
    """In the worker venv: the SDK's asyncio.run() gets the chosen loop (the locked uvloop)."""
    done = subprocess.run([str(worker_python), "-c", RUNS_ON, str(WORKER_DIR), choice, uvloop],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert (got["name"], got["runs_on"]) == (name, runs_on)
    assert (got["warning"] is not None) is warned
    if warned:
        assert got["warning"].startswith("uvloop cannot be imported")


def test_the_collector_is_tuned_and_says_so() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 7, 9)
        said = event_loop.tune_collector()
        assert gc.get_threshold() == (event_loop.YOUNG_THRESHOLD, 7, 9)  # the older two kept
        assert said == f"garbage collector thresholds {event_loop.YOUNG_THRESHOLD}, 7, 9"
    finally:
        gc.set_threshold(*before)


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_stream_and_the_connection_cap_on_each_loop(harness: Harness, loop: str) -> None:
    engine = harness.standin("vllm", STANDIN_REPLY_TOKENS="5")
    served = harness.serve("vllm", engine, MODEL_NAME=MODEL, BAKERY_EVENT_LOOP=loop, BAKERY_MAX_CONNECTIONS="2")
    banner = served.worker.output.read_text()
    assert f"bakery-worker: event loop: {loop}" in banner, banner[-2000:]
    assert f"garbage collector thresholds {event_loop.YOUNG_THRESHOLD}, " in banner, banner[-2000:]
    assert "idle engine connections: renewed for 60 s after the last request" in banner, banner[-2000:]
    stream = EventStream(served.port, "/v1/completions",
                         envelope({"model": MODEL, "prompt": "x", "stream": True}, 1))
    assert stream.status == 200
    held = socket.create_connection(("127.0.0.1", served.port), timeout=10)  # the cap's second connection
    try:
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as over:
            over.settimeout(10)
            assert over.recv(64).startswith(b"HTTP/1.1 503 "), "the third connection is not answered 503"
        text = stream.rest().decode()
    finally:
        held.close()
        stream.close()
    assert text.count("data: ") == 5 + 2 and text.rstrip().endswith("data: [DONE]"), text
