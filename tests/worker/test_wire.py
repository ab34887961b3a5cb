"""wire.py: plain signed requests served below aiohttp.web, answered byte for byte as aiohttp.web answers.

Differential: two secured workers in front of one guard engine, one with BAKERY_FRONT=wire (the
default), one with BAKERY_FRONT=aiohttp. Every exchange below is sent to both as raw bytes and the
answers must be the same (status line, every header but Date, the body, the connection closed or
not): what the wire front serves itself (a completion, a stream, an engine that hangs or goes silent,
keep-alive and pipelined requests, Connection: close) and what it must hand to aiohttp (a new
signature, a head or body still arriving, a refusal, another route or method). The wire front's own
count, said when the drain begins, shows which of them it served.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from front import wire
from tests.worker.helpers import (
    SDK_READY,
    Harness,
    Served,
    SigningKey,
    kept_while_unread,
    make_signing_key,
    secured,
    start_engine,
)

pytestmark = pytest.mark.slow
SEND_TIMEOUT = 2
LIMITS = {"BAKERY_HEADER_TIMEOUT": "2", "BAKERY_ENGINE_IDLE_TIMEOUT": "2", "BAKERY_ENGINE_CONNECT_TIMEOUT": "2",
          "BAKERY_SEND_TIMEOUT": str(SEND_TIMEOUT)}
# The wire front in the worker's one process: its own counts are read below (test_fronts.py runs the
# same exchanges against a worker with a front process).
ONE_PROCESS = {**LIMITS, "BAKERY_FRONT_PROCESSES": "0"}


@dataclass
class Pair:
    wire: Served
    plain: Served
    key: SigningKey

    def body(self, served: Served, payload: dict[str, Any], idx: int = 1, key: SigningKey | None = None) -> bytes:
        url = f"http://127.0.0.1:{served.port}"
        auth = {"cost": "8", "endpoint": "test", "reqnum": idx, "request_idx": idx,
                "signature": (key or self.key).sign(url), "url": url}
        return json.dumps({"auth_data": auth, "payload": payload}).encode()


@contextlib.contextmanager
def pair_on(tmp_path_factory: pytest.TempPathFactory, worker_python: Path, variable: str,
            values: tuple[str, str], limits: dict[str, str]) -> Iterator[Pair]:
    """Two secured workers, ready and loaded, in front of one guard engine: the first with
    `variable` set to values[0], the second to values[1]."""
    key = make_signing_key(worker_python)
    with (Harness(tmp_path_factory.mktemp(values[0]), worker_python, key.pem) as first,
          Harness(tmp_path_factory.mktemp(values[1]), worker_python, key.pem) as second):
        engine = start_engine(first)  # one engine: both workers' answers come from the same code
        made = [secured(harness, engine, **{variable: value}, **limits)
                for harness, value in zip((first, second), values, strict=True)]
        for served in made:
            served.worker.wait_for(SDK_READY, timeout=90)
            assert served.reports is not None
            served.reports.wait_loaded(timeout=60)
        yield Pair(made[0], made[1], key)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, worker_python: Path) -> Iterator[Pair]:
    with pair_on(tmp_path_factory, worker_python, "BAKERY_FRONT", ("wire", "aiohttp"), ONE_PROCESS) as made:
        yield made


def head(path: str, body: bytes, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: worker", "Content-Type: application/json",
             f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def exchange(port: int, parts: list[bytes], pause: float = 0.0, wait: float = 8.0) -> bytes:
    """Send `parts` (`pause` seconds apart) on one connection; everything read until it closes or
    `wait` seconds of silence."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        for i, part in enumerate(parts):
            if i and pause:
                time.sleep(pause)
            sock.sendall(part)
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except TimeoutError:
            got += b"<open>"
    return got


def answers(raw: bytes) -> list[tuple[str, dict[str, str], bytes]]:
    """The answers in `raw`: (status line, headers but Date, the body de-chunked), and "<open>" when
    the connection was still open."""
    out: list[tuple[str, dict[str, str], bytes]] = []
    while raw and raw != b"<open>":
        end = raw.index(b"\r\n\r\n")
        lines = raw[:end].decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        rest = raw[end + 4:]
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size_end = rest.index(b"\r\n")
                size = int(rest[:size_end], 16)
                body += rest[size_end + 2:size_end + 2 + size]
                rest = rest[size_end + 2 + size + 2:]
                if size == 0:
                    break
        else:
            size = int(headers.get("content-length", "0"))
            body, rest = rest[:size], rest[size:]
        headers.pop("date", None)
        out.append((lines[0], headers, body))
        raw = rest
    if raw == b"<open>":
        out.append(("<open>", {}, b""))
    return out


def both(pair: Pair, make: Any, pause: float = 0.0, wait: float = 8.0) -> list[list[tuple[str, dict[str, str], bytes]]]:
    """The answers of each worker to the exchange `make(served)` builds."""
    return [answers(exchange(s.port, make(s), pause, wait)) for s in (pair.wire, pair.plain)]


def test_parse_head_takes_plain_http11_only() -> None:
    assert wire.parse_head(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2") == (
        b"POST", b"/v1/completions", {b"host": b"x", b"content-length": b"2"})
    for refused in (b"POST /v1/completions HTTP/1.0\r\nHost: x",  # another version
                    b"POST  /v1/completions HTTP/1.1",  # a blank too many
                    b"POST /v1/completions HTTP/1.1\r\nA: 1\r\na: 2",  # a header twice
                    b"POST /v1/completions HTTP/1.1\r\nA: 1\r\n folded",  # obsolete line folding
                    b"POST /v1/completions HTTP/1.1\r\nA b: 1",  # a name that is not a token
                    b"POST /v1/completions HTTP/1.1\r\nA: 1\x00"):  # a control character
        assert wire.parse_head(refused) is None, refused


def test_signed_requests_are_answered_alike(pair: Pair) -> None:
    for idx in (1, 2):  # the first is checked in full (the memo learns the pair), the second is remembered
        wired, plain = both(pair, lambda s, i=idx: [head("/v1/completions", pair.body(s, {"prompt": "hi"}, i),
                                                         "Connection: close")])
        assert wired == plain and wired[0][0] == "HTTP/1.1 200 OK", (wired, plain)
        assert json.loads(wired[0][2])["choices"][0]["text"] == "echo:hi"


@pytest.mark.parametrize(("name", "payload", "status"), [
    ("stream", {"prompt": "hi", "stream": True}, 200),
    ("chat", {"messages": [{"role": "user", "content": "yo"}]}, 200),
    ("trickle", {"prompt": "trickle 3 0.3", "stream": True}, 200),
    ("hang", {"prompt": "hang"}, 504),
    ("silent", {"prompt": "slowbody 5"}, 504),
])
def test_served_answers_are_aiohttps(pair: Pair, name: str, payload: dict[str, Any], status: int) -> None:
    route = "/v1/chat/completions" if "messages" in payload else "/v1/completions"
    wired, plain = both(pair, lambda s: [head(route, pair.body(s, payload, 10), "Connection: close")])
    assert wired == plain, (wired, plain)
    assert wired[0][0].startswith(f"HTTP/1.1 {status} "), wired


@pytest.mark.parametrize(("prompt", "status"), [("cut", 500), ("trickle 3 0.05 4", 200)])
def test_a_stream_that_breaks_is_answered_alike(pair: Pair, prompt: str, status: int) -> None:
    """The engine closes after a streamed head (`cut`), or goes silent past the engine idle timeout
    after its first event: before any body byte both fronts answer 500 whole; after it both cut the
    connection, without the last chunk and without a second answer inside the stream (aiohttp.web
    wrote the handler's 500 there, as the SDK's default stream does)."""
    payload = {"prompt": prompt, "stream": True}
    for idx in (60, 61):  # the first may teach the memo the pair (aiohttp.web's path on both)
        raw = [re.sub(rb"\r\nDate: [^\r]*", b"", exchange(s.port, [head("/v1/completions", pair.body(s, payload, idx),
                                                                            "Connection: close")]))
               for s in (pair.wire, pair.plain)]
        assert raw[0] == raw[1], raw
        assert raw[0].startswith(f"HTTP/1.1 {status} ".encode()) and raw[0].count(b"HTTP/1.1 ") == 1, raw
        if status == 200:
            assert b"part0" in raw[0] and not raw[0].endswith((b"0\r\n\r\n", b"<open>")), raw


def test_keep_alive_and_pipelined_requests(pair: Pair) -> None:
    def keep(s: Served) -> list[bytes]:
        return [head("/v1/completions", pair.body(s, {"prompt": "one"}, 20)),
                head("/v1/completions", pair.body(s, {"prompt": "two", "stream": True}, 21), "Connection: close")]

    wired, plain = both(pair, keep, pause=0.3)  # the second after the first was answered
    assert wired == plain and [a[0] for a in wired] == ["HTTP/1.1 200 OK"] * 2, (wired, plain)
    wired, plain = both(pair, lambda s: [b"".join(keep(s))])  # both in one write
    assert wired == plain and len(wired) == 2, (wired, plain)
    wired, plain = both(pair, lambda s: keep(s)[:1], wait=1.0)  # kept open after its answer ...
    assert wired == plain and wired[-1][0] == "<open>", (wired, plain)
    wired, plain = both(pair, lambda s: keep(s)[:1], wait=6.0)  # ... until BAKERY_HEADER_TIMEOUT (2 s)
    assert wired == plain and wired[-1][0] == "HTTP/1.1 200 OK", (wired, plain)


def test_what_the_front_hands_to_aiohttp_is_answered_as_before(pair: Pair, worker_python: Path) -> None:
    other = make_signing_key(worker_python)
    cases = {
        "split head": lambda s: [head("/v1/completions", pair.body(s, {"prompt": "a"}, 30), "Connection: close")[:20],
                                 head("/v1/completions", pair.body(s, {"prompt": "a"}, 30), "Connection: close")[20:]],
        "not signed": lambda s: [head("/v1/completions", pair.body(s, {"prompt": "a"}, 31, key=other),
                                      "Connection: close")],
        "no payload": lambda s: [head("/v1/completions", json.dumps({"auth_data": json.loads(
            pair.body(s, {}, 32))["auth_data"]}).encode(), "Connection: close")],
        "bad field": lambda s: [head("/v1/completions", pair.body(s, {"prompt": "a", "max_tokens": "x"}, 33),
                                     "Connection: close")],
        "other route": lambda s: [head("/v1/nothing", pair.body(s, {"prompt": "a"}, 34), "Connection: close")],
        "a query": lambda s: [head("/v1/completions?x=1", pair.body(s, {"prompt": "a"}, 35), "Connection: close")],
        "chunked": lambda s: [b"POST /v1/completions HTTP/1.1\r\nHost: w\r\nTransfer-Encoding: chunked\r\n"
                              b"Connection: close\r\n\r\n" + b"%x\r\n" % len(pair.body(s, {"prompt": "c"}, 36))
                              + pair.body(s, {"prompt": "c"}, 36) + b"\r\n0\r\n\r\n"],
        "GET": lambda s: [b"GET /v1/completions HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\n"],
    }
    for name, make in cases.items():
        wired, plain = both(pair, make, pause=0.2)
        assert wired == plain, (name, wired, plain)


def test_an_idle_connection_is_closed_at_the_header_timeout(pair: Pair) -> None:
    started = time.monotonic()
    assert exchange(pair.wire.port, [b""], wait=10) == b""
    assert 1.5 < time.monotonic() - started < 8



@pytest.mark.parametrize("payload", [{"prompt": "flood 600", "stream": True}, {"prompt": "big 4000000"}],
                         ids=["stream", "whole answer"])
def test_a_signed_answer_to_a_client_that_reads_nothing_ends_at_the_send_bound(pair: Pair, payload: dict) -> None:
    """A signed stream (2.4 MiB of events) or whole answer (4 MB) to a client that reads nothing: each
    worker of the pair (here the wire front or aiohttp alone; the native or the Python relay in
    test_native_relay_worker.py; a front process or none in test_fronts.py) lets the connection go
    within the send bound (2 s here) after the client's window closed, and serves the next request."""
    for served in (pair.wire, pair.plain):
        for idx in (30, 31):  # the first may be aiohttp.web's path (the memo learns the pair), the second the wire's
            kept = kept_while_unread(served.port, head("/v1/completions", pair.body(served, payload, idx)),
                                     SEND_TIMEOUT + 10)
            assert kept is not None, f"{served.worker.cmd}: a client that read nothing kept its connection"
            assert kept < SEND_TIMEOUT + 8, kept
        again = answers(exchange(served.port, [head("/v1/completions", pair.body(served, {"prompt": "a"}, 32),
                                                     "Connection: close")]))
        assert again[0][0] == "HTTP/1.1 200 OK", again


def test_a_client_that_reads_slowly_is_not_cut(pair: Pair) -> None:
    """The send bound counts from the last byte a client took: a 400 kB answer to a client with 32 KiB
    of receive room that reads 16 KiB 4 times a second (~6 s in all, three times the bound) arrives
    whole."""
    size = 400_000
    for served in (pair.wire, pair.plain):
        data = head("/v1/completions", pair.body(served, {"prompt": f"big {size}"}, 40), "Connection: close")
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
            sock.settimeout(10)
            sock.connect(("127.0.0.1", served.port))
            sock.sendall(data)
            raw = b""
            while chunk := sock.recv(16384):
                raw += chunk
                time.sleep(0.25)
        got = answers(raw)
        assert got[0][0] == "HTTP/1.1 200 OK" and len(json.loads(got[0][2])["choices"][0]["text"]) == size


def test_the_front_served_what_it_should(pair: Pair) -> None:
    """Last: the drain's first line says what each front did (the aiohttp one has none). Its own ten
    requests are counted whichever of the tests above ran on this pair (xdist may split them)."""
    for idx in range(100, 111):
        got = answers(exchange(pair.wire.port, [head("/v1/completions", pair.body(pair.wire, {"prompt": "n"}, idx),
                                                     "Connection: close")]))
        assert got[0][0] == "HTTP/1.1 200 OK", got
    for served in (pair.wire, pair.plain):
        served.worker.popen.send_signal(signal.SIGTERM)
        served.worker.popen.wait(timeout=30)
    said = [line for line in pair.wire.worker.output.read_text().splitlines() if "wire front:" in line]
    assert len(said) == 1, said
    served_here = int(said[0].split("wire front: ")[1].split()[0])
    assert served_here >= 10, said  # this test's own requests, after the first, on the wire worker
    assert "wire front:" not in pair.plain.worker.output.read_text()


def test_a_fresh_workers_first_signed_requests_are_the_fronts(tmp_path_factory: pytest.TempPathFactory,
                                                              worker_python: Path) -> None:
    """A fresh worker knows no signature yet (signature_memo.first_pairs): its first signed request is
    checked and served by the wire front, not handed to aiohttp.web until one was checked there; a
    forged one before it is still handed over and refused as aiohttp.web refuses it."""
    other = make_signing_key(worker_python)
    with pair_on(tmp_path_factory, worker_python, "BAKERY_FRONT", ("wire", "aiohttp"), ONE_PROCESS) as fresh:
        forged, forged_plain = both(fresh, lambda s: [head(
            "/v1/completions", fresh.body(s, {"prompt": "f"}, 1, key=other), "Connection: close")])
        assert forged == forged_plain and forged[0][0].startswith("HTTP/1.1 401"), (forged, forged_plain)
        wired, plain = both(fresh, lambda s: [head("/v1/completions", fresh.body(s, {"prompt": "hi"}, 2),
                                                   "Connection: close")])
        assert wired == plain and wired[0][0] == "HTTP/1.1 200 OK", (wired, plain)
        fresh.wire.worker.popen.send_signal(signal.SIGTERM)
        fresh.wire.worker.popen.wait(timeout=30)
        said = [line for line in fresh.wire.worker.output.read_text().splitlines() if "wire front:" in line]
        assert len(said) == 1, said
        counts = re.findall(r"(\d+) request\(s\) served below aiohttp.web, (\d+) connection\(s\) handed", said[0])
        assert counts == [("1", "1")], said  # the signed one served here, the forged one handed over
