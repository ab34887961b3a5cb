"""bakery-relay in the worker: a streamed body moved by the C helper is answered as Python moves it.

Differential: two secured workers in front of one guard engine, one with BAKERY_RELAY=native (the
default: native_relay.py hands a stream's body to bakery-relay after its head), one with
BAKERY_RELAY=python (forward.relay). The same requests go to both as raw bytes; the answers must be
the same (status line, headers but Date, the de-chunked body, the connection closed or not), and for an
engine that goes silent mid-stream the same bytes (the engine idle timeout ends the stream, without
its last chunk). The drain's line of the native worker shows the helper moved the streams.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.worker.test_wire import (
    SEND_TIMEOUT,
    Pair,
    answers,
    exchange,
    head,
    pair_on,
    test_a_signed_answer_to_a_client_that_reads_nothing_ends_at_the_send_bound,
)

pytestmark = pytest.mark.slow
# test_wire.py's send-bound test, here against the native and the Python relay.
__all__ = ["test_a_signed_answer_to_a_client_that_reads_nothing_ends_at_the_send_bound"]
LIMITS = {"BAKERY_HEADER_TIMEOUT": "2", "BAKERY_ENGINE_IDLE_TIMEOUT": "1", "BAKERY_ENGINE_CONNECT_TIMEOUT": "2",
          "BAKERY_SEND_TIMEOUT": str(SEND_TIMEOUT)}
STREAMS = {
    "burst": {"prompt": "trickle 6 0", "stream": True},
    "trickle": {"prompt": "trickle 4 0.1", "stream": True},
    "chat": {"messages": [{"role": "user", "content": "trickle 3 0.05"}], "stream": True},
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, worker_python: Path) -> Iterator[Pair]:
    with pair_on(tmp_path_factory, worker_python, "BAKERY_RELAY", ("native", "python"), LIMITS) as made:
        assert "streamed bodies after their head: bakery-relay" in made.wire.worker.output.read_text()
        assert "streamed bodies after their head: Python (BAKERY_RELAY=python)" in made.plain.worker.output.read_text()
        yield made


def both(pair: Pair, make: Any, wait: float = 8.0) -> list[bytes]:
    return [exchange(s.port, make(s), 0.0, wait) for s in (pair.wire, pair.plain)]


def route(payload: dict[str, Any]) -> str:
    return "/v1/chat/completions" if "messages" in payload else "/v1/completions"


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_a_stream_is_answered_as_python_answers_it(pair: Pair, name: str) -> None:
    payload = STREAMS[name]
    for idx in (10, 11):  # the first signed pair may teach the memo (aiohttp.web's path); the second is the wire's
        native, python = both(pair, lambda s, i=idx: [head(route(payload), pair.body(s, payload, i),
                                                           "Connection: close")])
        assert answers(native) == answers(python)
        assert answers(native)[0][0] == "HTTP/1.1 200 OK"
        assert answers(native)[0][2].count(b"data: ") >= 3, native


def test_streams_kept_alive_and_pipelined(pair: Pair) -> None:
    def make(s: Any) -> list[bytes]:
        return [head("/v1/completions", pair.body(s, {"prompt": "trickle 3 0.05", "stream": True}, 20))
                + head("/v1/completions", pair.body(s, {"prompt": "trickle 2 0", "stream": True}, 21)),
                head("/v1/completions", pair.body(s, {"prompt": "plain"}, 22), "Connection: close")]

    native, python = both(pair, make)
    assert [a[0] for a in answers(native)] == ["HTTP/1.1 200 OK"] * 3
    assert answers(native) == answers(python)


def test_an_engine_silent_mid_stream_ends_it_at_the_idle_timeout(pair: Pair) -> None:
    payload = {"prompt": "trickle 3 0.05 2.5", "stream": True}  # 2.5 s of silence after the first part
    for idx in (30, 31):
        native, python = both(pair, lambda s, i=idx: [head("/v1/completions", pair.body(s, payload, i))], wait=6.0)
        undated = [re.sub(rb"\r\nDate: [^\r]*", b"", raw) for raw in (native, python)]
        assert undated[0] == undated[1]
        assert b"part0" in native and b"part1" not in native and not native.endswith(b"0\r\n\r\n")
        assert not native.endswith(b"<open>")  # closed: the client is told the answer broke


@pytest.mark.parametrize("prompt", ["cut", "trickle 3 2.5"])
def test_a_body_failing_before_its_first_byte_is_answered_as_python_answers_it(pair: Pair, prompt: str) -> None:
    """The engine's head came, then it closed (`cut`) or went silent past the idle timeout before any
    body byte: the client never had the head, so both workers answer with the same error."""
    payload = {"prompt": prompt, "stream": True}
    for idx in (50, 51):
        native, python = both(pair, lambda s, i=idx: [head("/v1/completions", pair.body(s, payload, i))], wait=6.0)
        assert answers(native) == answers(python)
        assert answers(native)[0][0] == "HTTP/1.1 500 Internal Server Error", native


def test_the_helper_moved_the_streams(pair: Pair) -> None:
    """Last: the native worker's drain line counts the streams bakery-relay moved: at least this
    test's own four, whichever of the tests above ran on this pair (xdist may split them)."""
    for idx in range(40, 45):  # the first may be the one that teaches the memo the pair
        got = answers(exchange(pair.wire.port, [head("/v1/completions", pair.body(pair.wire, STREAMS["trickle"], idx),
                                                     "Connection: close")]))
        assert got[0][0] == "HTTP/1.1 200 OK" and got[0][2].count(b"data: ") >= 3, got
    for served in (pair.wire, pair.plain):
        served.worker.popen.send_signal(signal.SIGTERM)
        served.worker.popen.wait(timeout=30)
    said = [line for line in pair.wire.worker.output.read_text().splitlines() if "relayed by bakery-relay" in line]
    assert len(said) == 1, said
    assert int(said[0].split("relay: ")[1].split()[0]) >= 4, said
    assert "relayed by bakery-relay" not in pair.plain.worker.output.read_text()

