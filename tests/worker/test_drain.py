"""Graceful drain on SIGTERM: new requests get 503 + Retry-After, requests in flight finish, exit 0.

The worker (real SDK) in front of the stand-in in step mode: a streamed answer is held in flight by
the test (no timing), the signal arrives, a new request is refused, the held answer is released and
must arrive whole. Then the same through the real entry point (worker/boot/supervise.py): the worker is
stopped first and the engine only after it (the held answer needs the engine to finish).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from policy import drain
from tests.worker.helpers import (
    STANDIN,
    WORKER_DIR,
    Engine,
    Harness,
    baked_facts,
    free_port,
    free_port_pair,
    platform_env,
)
from tests.worker.serving import MODEL, EventStream, envelope, wait_record

ENTRYPOINT = WORKER_DIR / "boot" / "entrypoint.py"
ROUTE = "/v1/chat/completions"
TOKENS = 30


HELD_PROMPT = "a long answer"  # the held stream's prompt: how its end-of-stream record is found


def held_payload() -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": HELD_PROMPT}], "max_tokens": TOKENS,
            "stream": True, "stream_options": {"include_usage": True}}


def post(port: int, idx: int = 2) -> tuple[int, dict, dict[str, str]]:
    """A plain (non-streamed) request; (status, JSON body, headers)."""
    stream = EventStream(port, ROUTE, envelope({"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
                                               idx), timeout=20)
    body = stream.rest()
    stream.close()
    return stream.status, json.loads(body or b"{}"), stream.headers


def finish(stream: EventStream, steps: Path) -> bytes:
    """Release the held answer and read it to its end."""
    (steps / "go-all").touch()
    return stream.rest()


# --------------------------------------------------------------------------- rules


@pytest.mark.parametrize(("raw", "seconds"), [(None, 8.0), ("", 8.0), (" 8 ", 8.0), ("0", 0.0), ("2.5", 2.5),
                                              ("3600", 3600.0)])
def test_drain_time_is_read(raw: str | None, seconds: float) -> None:
    env = {} if raw is None else {drain.DRAIN_VAR: raw}
    assert drain.load(env) == (seconds, [])


@pytest.mark.parametrize("raw", ["eight", "-1", "nan", "inf", "3601", "8s", "1e9"])
def test_a_bad_drain_time_is_one_line_naming_the_variable(raw: str) -> None:
    _, errors = drain.load({drain.DRAIN_VAR: raw})
    assert len(errors) == 1 and errors[0].startswith(f"{drain.DRAIN_VAR}={raw!r} is not a number of seconds")


def test_the_count_is_read_after_the_holds(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A request that enters during a hold (a front process's, its entry a few ms late) is counted and
    waited for, even when the worker's own last request ended during the hold; a drain without it
    would have exited at once."""
    monkeypatch.setattr(drain.logging, "shutdown", lambda: None)  # _finish's, at the exit
    exits: list[int] = []

    async def scenario() -> None:
        ours = drain.Drain(5.0, 1, (ROUTE,), exit=exits.append)

        async def hold() -> None:
            await asyncio.sleep(0.05)
            ours.leave(None)  # the worker's own request ends: the count is 0 for a moment
            ours.enter()  # the front process's entry arrives

        ours.holds.append(hold)
        ours.enter()
        ours.begin()
        await asyncio.sleep(0.3)
        assert exits == [], "the drain exited with a request in flight"
        ours.leave(None)
        assert ours._task is not None
        await asyncio.wait_for(ours._task, 2)

    asyncio.run(scenario())
    assert exits == [0]
    said = capsys.readouterr().out
    assert "stop signal: draining, 1 request(s) in flight" in said and "drained in" in said, said


# --------------------------------------------------------------------------- the worker alone


@pytest.fixture
def stepped_engine(harness: Harness) -> tuple[Engine, Path, Path]:
    """The vLLM stand-in in step mode: (engine, step dir, record)."""
    steps, record = harness.tmp / "steps", harness.tmp / "record.jsonl"
    steps.mkdir()
    engine = harness.standin("vllm", STANDIN_STEP_DIR=str(steps), STANDIN_STREAM_RECORD=str(record),
                             STANDIN_REPLY_TOKENS=str(TOKENS))
    return engine, steps, record


@pytest.mark.slow
def test_sigterm_refuses_new_requests_and_finishes_the_one_in_flight(
        harness: Harness, stepped_engine: tuple[Engine, Path, Path]) -> None:
    engine, steps, record = stepped_engine
    served = harness.serve("vllm", engine, MODEL_NAME=MODEL, BAKERY_RETRY_AFTER="7")
    reports = harness.reports
    stream = EventStream(served.port, ROUTE, envelope(held_payload()), timeout=30)
    first = stream.next_event()
    assert stream.status == 200 and first.startswith(b"data: ")
    os.kill(served.worker.popen.pid, signal.SIGTERM)
    served.worker.wait_for("draining, 1 request(s) in flight")
    status, body, headers = post(served.port)
    assert status == 503 and headers["retry-after"] == "7" and "shutting down" in body["error"], (status, body)
    assert headers.get("connection", "").lower() == "close"
    assert served.worker.popen.poll() is None  # still draining: the held answer is not finished
    rest = finish(stream, steps)
    stream.close()
    assert rest.rstrip().endswith(b"data: [DONE]"), rest[-300:]
    assert wait_record(record, HELD_PROMPT) == {"stream": ROUTE, "prompt": HELD_PROMPT, "events": TOKENS + 4,
                                               "outcome": "complete"}
    assert served.worker.wait_exit(15) == 0, served.worker.text[-3000:]
    assert "drained in" in served.worker.text and "(1 request(s) refused meanwhile)" in served.worker.text
    # Both outcomes left before the exit: the answer that ended just before it (the SDK's 1 s
    # loop would have sent it too late) and the refusal (offline: every envelope counts as signed).
    outcomes = reports.outcomes()
    assert outcomes.get(1, {}).get("success") is True, outcomes
    assert outcomes.get(2, {}).get("status") == "Rejected", outcomes


@pytest.mark.slow
def test_the_drain_is_bounded(harness: Harness, stepped_engine: tuple[Engine, Path, Path]) -> None:
    """An answer that does not finish within BAKERY_DRAIN_TIMEOUT is cut; the worker still exits 0."""
    engine, steps, _ = stepped_engine
    served = harness.serve("vllm", engine, MODEL_NAME=MODEL, BAKERY_DRAIN_TIMEOUT="1")
    stream = EventStream(served.port, ROUTE, envelope(held_payload()), timeout=30)
    assert stream.next_event()
    os.kill(served.worker.popen.pid, signal.SIGTERM)
    assert served.worker.wait_exit(15) == 0, served.worker.text[-3000:]
    assert "drain time over (1 s, BAKERY_DRAIN_TIMEOUT): 1 request(s) still in flight are cut" in \
        served.worker.text
    stream.close()
    (steps / "go-all").touch()


@pytest.mark.slow
def test_a_bad_drain_time_stops_the_worker_with_exit_2(harness: Harness) -> None:
    worker = harness.worker("vllm", reports="http://127.0.0.1:9", BAKERY_DRAIN_TIMEOUT="8s").worker
    assert worker.wait_exit(30) == 2
    lines = [line for line in worker.text.splitlines() if line.startswith("bakery-worker: error:")]
    assert lines == [f"bakery-worker: error: {drain.load({drain.DRAIN_VAR: '8s'})[1][0]}"], worker.text
    assert "Traceback" not in worker.text


# --------------------------------------------------------------------------- the entry point


@pytest.fixture
def run_dir(harness: Harness) -> Path:
    return harness.short_dir("bk-drain-")


def boot_env(run_dir: Path, worker_python: Path, engine_port: int, port: int, report_url: str,
             **extra: str) -> dict[str, str]:
    """An image's serverless environment with the vLLM stand-in as the engine."""
    env = {key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ}
    env.update(platform_env(port, report_url))
    env.update(baked_facts("vllm"))
    env.update({
        "BAKERY_RUN_DIR": str(run_dir), "BACKEND": "vllm", "SERVERLESS": "true",
        "MODEL_LOG": str(run_dir / "log" / "vllm.log"),
        "BAKERY_ENGINE_CMD": json.dumps([sys.executable, str(STANDIN), "vllm", "serve", "${VLLM_MODEL}",
                                         "--host", "127.0.0.1", "--port", str(engine_port)]),
        "BAKERY_ENGINE_ARGS_VAR": "VLLM_ARGS", "VLLM_MODEL": MODEL, "MODEL_NAME": MODEL,
        "MODEL_SERVER_URL": f"http://127.0.0.1:{engine_port}", "WORKER_PYTHON": str(worker_python),
        "WORKER_STATE_DIR": str(run_dir / "state"), "BENCHMARK_RUNS": "1", "BENCHMARK_CONCURRENCY": "1",
        "BENCHMARK_MAX_TOKENS": "8", "STANDIN_LOAD_SECONDS": "0.3", "BAKERY_EXIT_GRACE": "0",
    })
    env.update(extra)
    return env


@pytest.mark.slow
def test_the_entry_point_drains_the_worker_then_stops_the_engine(harness: Harness, run_dir: Path) -> None:
    """The entry point (running engine and worker), not start_server.sh: so not
    harness.worker, but a process the harness still stops."""
    steps, record = run_dir / "steps", run_dir / "record.jsonl"
    steps.mkdir()
    engine_port, port = free_port(), free_port_pair()
    reports = harness.reports
    env = boot_env(run_dir, harness.worker_python, engine_port, port, reports.url, STANDIN_STEP_DIR=str(steps),
                   STANDIN_STREAM_RECORD=str(record), STANDIN_REPLY_TOKENS=str(TOKENS))
    boot = harness.start([str(harness.worker_python), str(ENTRYPOINT)], run_dir / "out", env=env)
    reports.wait_loaded(timeout=90)
    stream = EventStream(port, ROUTE, envelope(held_payload()), timeout=30)
    assert stream.status == 200 and stream.next_event()
    boot.popen.send_signal(signal.SIGTERM)
    boot.wait_for("draining, 1 request(s) in flight")
    status, body, headers = post(port)
    assert status == 503 and "retry-after" in headers, (status, body)
    rest = finish(stream, steps)
    stream.close()
    assert rest.rstrip().endswith(b"data: [DONE]"), rest[-300:]
    assert boot.wait_exit(30) == 0, boot.text[-3000:]
    assert wait_record(record, HELD_PROMPT)["outcome"] == "complete"
    out = boot.text
    # The entry point stopped the worker (after its drain) before it stopped the engine.
    assert out.index("stopped: worker (exit status 0)") < out.index("stopped: vllm"), out[-3000:]
