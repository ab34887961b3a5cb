"""Streamed answers pass through the worker (the real SDK on loopback) as the engine writes them.

Proved without timing: the stand-in in step mode (STANDIN_STEP_DIR) writes event k+1 only after the
test has released it, and the test releases it only once it holds event k from the worker. A worker
that buffered (a whole answer, or a few events) never delivers event k and the read times out.
The events, the usage chunk of stream_options and the final [DONE] are compared with the same request
sent straight to the engine. A client that goes away mid-stream must make the worker close its engine
connection (the stand-in records its failed write) and leave no request in flight behind.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.worker.helpers import Harness, Served
from tests.worker.serving import MODEL, EventStream, direct_events, envelope, normalise, stream_records, wait_record

pytestmark = pytest.mark.slow
TOKENS = 5
READ_TIMEOUT = 20.0  # a worker that buffers never delivers the held event: the read fails after this


@dataclass
class Stepped:
    """A worker in front of a stand-in in step mode."""

    served: Served
    steps: Path
    record: Path
    engine: str

    def written(self) -> int:
        """How many events the stand-in has recorded as written (0 before the first)."""
        path = self.steps / "written"
        return int(path.read_text()) if path.exists() else 0

    def reset(self) -> None:
        for item in self.steps.iterdir():
            item.unlink()


def payload(route: str, prompt: str, tokens: int = TOKENS) -> dict[str, Any]:
    """A streamed request with usage in the last chunk (stream_options.include_usage)."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": tokens, "stream": True,
                            "stream_options": {"include_usage": True}}
    if route == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def start_stepped(harness: Harness, engine: str) -> Stepped:
    steps, record = harness.tmp / "steps", harness.tmp / "record.jsonl"
    steps.mkdir()
    standin = harness.standin(engine, STANDIN_STEP_DIR=str(steps), STANDIN_STREAM_RECORD=str(record),
                              STANDIN_REPLY_TOKENS="40")
    backend = "sglang" if engine == "sglang" else "vllm"
    return Stepped(harness.serve(backend, standin, MODEL_NAME=MODEL), steps, record, engine)


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def stepped(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, worker_python: Path,
            pubkey_pem: str) -> Iterator[Stepped]:
    """One worker per stand-in engine, in front of it in step mode."""
    with Harness(tmp_path_factory.mktemp(f"stream-{request.param}"), worker_python, pubkey_pem) as harness:
        yield start_stepped(harness, request.param)


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_each_event_reaches_the_client_before_the_engine_writes_the_next(stepped: Stepped, route: str) -> None:
    stepped.reset()
    prompt = f"pass-through {route}"  # the stand-in records a stream just after its last byte, by prompt
    sent = payload(route, prompt)
    stream = EventStream(stepped.served.port, route, envelope(sent), timeout=READ_TIMEOUT)
    assert stream.status == 200 and stream.headers["content-type"].startswith("text/event-stream"), stream.headers
    events = []
    while True:
        event = stream.next_event()  # times out (the test fails) if the worker holds event k back
        if not event:
            break
        events.append(event)
        held = len(events)
        # The engine has written no more than the client holds: it waits for go-<held>, not yet there.
        # (It records an event just after writing it, so the record may still say held - 1.)
        assert stepped.written() <= held, (held, events[-1])
        assert not (stepped.steps / f"go-{held}").exists()
        (stepped.steps / f"go-{held}").touch()
    stream.close()
    ended = wait_record(stepped.record, prompt)
    assert ended == {"stream": route, "prompt": prompt, "events": len(events), "outcome": "complete"}, ended

    # The same request straight to the engine: the same events, usage chunk and [DONE].
    stepped.reset()
    (stepped.steps / "go-all").touch()
    direct = direct_events(stepped.served.engine_port, route, sent)
    assert [normalise(e) for e in events] == [normalise(e) for e in direct]
    assert normalise(events[-1]) == "[DONE]"
    usage = normalise(events[-2])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == TOKENS, usage
    # (chat: the role chunk), a chunk per token, the finish chunk, usage, [DONE]; max_tokens cuts the
    # answer, and vLLM sends that finish_reason with the last token, SGLang in a chunk of its own.
    own_finish = 0 if stepped.engine == "vllm" else 1
    assert len(events) == TOKENS + (1 if route == "/v1/chat/completions" else 0) + own_finish + 2


def test_a_client_that_goes_away_stops_the_generation(harness: Harness) -> None:
    """The client drops the connection holding event 2 of 40; once released, the engine's next writes
    fail (the worker closed its engine connection); SIGTERM then finds no request in flight."""
    stepped = start_stepped(harness, "vllm")
    route = "/v1/completions"
    stream = EventStream(stepped.served.port, route, envelope(payload(route, "goes away", 40)),
                         timeout=READ_TIMEOUT)
    assert stream.status == 200
    assert stream.next_event()
    (stepped.steps / "go-1").touch()
    assert stream.next_event()
    stream.close()
    # Once the SDK has seen the client go (its own line), release every later event at once: the
    # engine writes until a write fails. Had the worker kept its engine connection open, all 43
    # events would be written.
    stepped.served.worker.wait_for("cancelled (client disconnect)", timeout=READ_TIMEOUT)
    (stepped.steps / "go-all").touch()
    ended = wait_record(stepped.record, "goes away")
    assert ended["stream"] == route and ended["outcome"] in {"BrokenPipeError", "ConnectionResetError"}, ended
    assert ended["events"] < TOKENS + 40, ended
    worker = stepped.served.worker
    os.kill(worker.popen.pid, signal.SIGTERM)  # start_server.sh exec'd the worker: this pid is it
    assert worker.wait_exit(15) == 0, worker.text[-3000:]
    assert "draining, 0 request(s) in flight" in worker.text, worker.text[-3000:]
    assert len(stream_records(stepped.record)) == 1
    # the SDK's 499 for the gone client is not written to its closed connection (a logged traceback)
    assert "Error handling request" not in worker.text, worker.text[-3000:]


def test_real_llama_streams_event_by_event_as_direct(harness: Harness, llama_python: Path, smollm2: Path) -> None:
    """The real llama.cpp (greedy, so both answers are the same): through the worker, the same events as
    straight from the engine, one token per event, the usage chunk and [DONE] unchanged."""
    served = harness.serve("llama", harness.llama(llama_python, smollm2), MODEL_NAME="smollm2")
    engine_port = served.engine_port
    for route in ("/v1/completions", "/v1/chat/completions"):
        sent = {**payload(route, "Count from one to ten.", 24), "model": "smollm2", "temperature": 0,
                "seed": 1}
        stream = EventStream(served.port, route, envelope(sent), timeout=120)
        assert stream.status == 200 and stream.headers["content-type"].startswith("text/event-stream")
        events = []
        while event := stream.next_event():
            events.append(event)
        stream.close()
        direct = direct_events(engine_port, route, sent)
        ours, theirs = [_comparable(e) for e in events], [_comparable(e) for e in direct]
        assert ours == theirs
        assert ours[-1] == "[DONE]" and ours[-2]["usage"]["completion_tokens"] == 24, ours[-2:]
        assert len(events) >= 24  # one event per token (at least), not one blob


def _comparable(event: bytes) -> Any:
    """llama.cpp's event without what differs between two runs (ids, times, timings, prompt-cache hits)."""
    data = normalise(event)
    if isinstance(data, dict):
        data.pop("timings", None)
        data.pop("system_fingerprint", None)
        if isinstance(data.get("usage"), dict):
            data["usage"].pop("prompt_tokens_details", None)
        data = json.loads(json.dumps(data))
    return data
