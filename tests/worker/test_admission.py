"""Admission at :3000 (policy/admission.py) on the real SDK, signed as the platform signs:
the global bound on buffered body bytes, the connection cap, and no Content-Encoding on requests.

Two secured workers in front of tests/worker/guard_engine.py, each with small bounds so that a few
requests reach them: `budget` (body limit 64 KiB, 100 000 bytes of bodies at once: one BIG body
fits, two do not) and `capped` (8 connections, the default 16 MiB body limit). Every loop is
bounded in count and time; all traffic is to 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import os
import selectors
import signal
import socket
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.worker import test_guards
from tests.worker.helpers import SDK_READY, Harness, Proc, SigningKey, json_error, request, secured, start_engine

pytestmark = pytest.mark.slow
BIG = 62000  # fits the body limit; two at once do not fit the byte bound (100 000)
FIRST = 40000  # what a partly sent body sends first: BIG more does not fit beside it
BUDGET_LIMITS = {"BAKERY_MAX_BODY_BYTES": "65536", "BAKERY_MAX_BUFFERED_BYTES": "100000",
                 "BAKERY_BODY_TIMEOUT": "6", "BAKERY_HEADER_TIMEOUT": "2", "BAKERY_ENGINE_IDLE_TIMEOUT": "5"}
CAP = 8
SEND_TIMEOUT = 2
CAPPED_LIMITS = {"BAKERY_MAX_CONNECTIONS": str(CAP), "BAKERY_HEADER_TIMEOUT": "3",
                 "BAKERY_SEND_TIMEOUT": str(SEND_TIMEOUT)}
ROUTE = "/v1/completions"
key = test_guards.key  # the fixture: the platform's key pair, the one test_guards' workers know


@dataclass
class Worker:
    """A secured worker, the engine's log, and how to sign for it."""

    port: int
    proc: Proc
    engine_log: Path
    key: SigningKey

    def body(self, prompt: str, size: int | None = None, idx: int = 1, stream: bool = False,
             signed: bool = True) -> bytes:
        """A signed (or unsigned) completion envelope, padded to exactly `size` bytes when given
        (the padding is words after the prompt, which the guard engine ignores)."""
        own = f"http://127.0.0.1:{self.port}"
        auth = {"cost": "8", "endpoint": "t", "reqnum": idx, "request_idx": idx,
                "signature": self.key.sign(own) if signed else "A" * 344, "url": own}

        def make(pad: int) -> bytes:
            text = prompt + (" " + "p" * (pad - 1) if pad else "")
            return json.dumps({"auth_data": auth, "payload": {"prompt": text, "max_tokens": 4,
                                                              "stream": stream}}).encode()

        data = make(0)
        if size is not None:
            assert size >= len(data) + 2, (size, len(data))
            data = make(size - len(data))
            assert len(data) == size
        return data

    def engine_saw(self, marker: str) -> bool:
        return marker in self.engine_log.read_text()


def serve(harness: Harness, key: SigningKey, limits: dict[str, str]) -> Worker:
    engine = start_engine(harness)
    served = secured(harness, engine, **limits)
    served.worker.wait_for(SDK_READY, timeout=90)
    assert served.reports is not None
    served.reports.wait_loaded()
    return Worker(served.port, served.worker, engine.log, key)


@pytest.fixture(scope="module")
def budget(tmp_path_factory: pytest.TempPathFactory, worker_python: Path, key: SigningKey) -> Iterator[Worker]:
    with Harness(tmp_path_factory.mktemp("budget"), worker_python, key.pem) as harness:
        yield serve(harness, key, BUDGET_LIMITS)


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory, worker_python: Path, key: SigningKey) -> Iterator[Worker]:
    with Harness(tmp_path_factory.mktemp("capped"), worker_python, key.pem) as harness:
        yield serve(harness, key, CAPPED_LIMITS)


# --------------------------------------------------------------------------- plumbing


def post(port: int, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
    """One POST to the route; the body decoded when it is JSON."""
    status, raw, got = request(port, ROUTE, body, headers=headers)
    with contextlib.suppress(ValueError):
        return status, json.loads(raw), got
    return status, raw, got


def busy(result: tuple[int, Any, dict[str, str]], variable: str) -> None:
    """`result` is the 503 of a global bound: JSON naming `variable`, and Retry-After."""
    assert variable in json_error(result, 503), result
    assert result[2].get("retry-after") == "10", result[2]


def head(port: int, length: int | None) -> bytes:
    """The request line and headers of a POST with that Content-Length (None: chunked)."""
    framing = "Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}"
    return (f"POST {ROUTE} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"{framing}\r\n\r\n").encode()


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def status_of(sock: socket.socket, timeout: float = 15.0) -> int:
    """The status code of the answer on `sock` (0 when the connection closed without one)."""
    sock.settimeout(timeout)
    data = b""
    with contextlib.suppress(OSError):
        while b"\r\n" not in data:
            part = sock.recv(4096)
            if not part:
                break
            data += part
    return int(data.split()[1]) if data.startswith(b"HTTP/1.1 ") else 0


def until(probe: Callable[[], bool], seconds: float, pause: float = 0.1) -> bool:
    """Whether `probe()` comes true within `seconds` (tried every `pause`)."""
    deadline = time.monotonic() + seconds
    while True:
        if probe():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)


class Stream:
    """A streamed completion read as it arrives: the parts and when each came."""

    def __init__(self, port: int, body: bytes) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.conn.request("POST", ROUTE, body=body, headers={"Content-Type": "application/json"})
        self.response = self.conn.getresponse()
        assert self.response.status == 200, (self.response.status, self.response.read())
        self.text = b""
        self.times: list[float] = []

    def next(self) -> bytes:
        part = self.response.read1(65536)
        self.text += part
        self.times.append(time.monotonic())
        return part

    def rest(self) -> bytes:
        while self.next():
            pass
        return self.text

    def close(self) -> None:
        self.conn.close()


# --------------------------------------------------------------------------- the byte bound


def test_beyond_the_byte_bound_503_while_admitted_requests_finish(budget: Worker) -> None:
    """A stream holds a BIG body: another BIG body, by Content-Length or chunked, gets 503 +
    Retry-After and never reaches the engine; a small one still fits; the stream finishes whole;
    then both are admitted."""
    stream = Stream(budget.port, budget.body("trickle 8 0.3", size=BIG, idx=101, stream=True))
    try:
        assert until(lambda: b"part0" in stream.next(), 5, pause=0)
        busy(post(budget.port, budget.body("bytes-refused", size=BIG, idx=102)), "BAKERY_MAX_BUFFERED_BYTES")
        chunked = budget.body("bytes-chunked", size=BIG, idx=103)
        with socket.create_connection(("127.0.0.1", budget.port), timeout=15) as sock:
            sock.sendall(head(budget.port, None) + b"".join(chunk(chunked[i:i + 16000])
                                                            for i in range(0, BIG, 16000)) + chunk(b""))
            assert status_of(sock) == 503
        status, body, _ = post(budget.port, budget.body("bytes-small", idx=104))
        assert status == 200 and body["choices"][0]["text"] == "echo:bytes-small", body
        text = stream.rest()
    finally:
        stream.close()
    assert all(f"part{i}".encode() in text for i in range(8)), text
    assert not budget.engine_saw("bytes-refused") and not budget.engine_saw("bytes-chunked")
    status, body, _ = post(budget.port, budget.body("bytes-refused", size=BIG, idx=105))
    assert status == 200, body
    with socket.create_connection(("127.0.0.1", budget.port), timeout=15) as sock:
        sock.sendall(head(budget.port, None) + chunk(chunked[:FIRST]) + chunk(chunked[FIRST:]) + chunk(b""))
        assert status_of(sock) == 200
    assert budget.engine_saw("bytes-chunked")


def admitted(worker: Worker, idx: int) -> bool:
    """Whether a BIG signed request is served now (nothing else holds the byte bound)."""
    return post(worker.port, worker.body("bytes-probe", size=BIG, idx=idx))[0] == 200


def held(worker: Worker, idx: int) -> bool:
    """Whether a BIG signed request is refused now for the byte bound."""
    result = post(worker.port, worker.body("bytes-probe", size=BIG, idx=idx))
    return result[0] == 503 and "BAKERY_MAX_BUFFERED_BYTES" in json.dumps(result[1])


# How each request that holds a reservation ends: its framing, how it ends, the status it gets
# (None: none, the client left), and how long the release may take.
ENDINGS = {
    "served": ("length", "send", 200),
    "unsigned (401)": ("length", "send", 401),
    "malformed (422)": ("length", "send", 422),
    "chunked, served": ("chunked", "send", 200),
    "chunked, over the body limit (413)": ("chunked", "send", 413),
    "slow body (408)": ("length", "wait", 408),
    "slow chunked body (408)": ("chunked", "wait", 408),
    "client gone mid-body": ("length", "close", None),
    "client gone mid chunked body": ("chunked", "close", None),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_the_reservation_is_released_however_a_request_ends(ending: str, budget: Worker) -> None:
    """A request whose body is partly sent holds its reservation (a BIG request meanwhile: 503);
    once it ended, by its answer, a refusal, a timeout or the client leaving, a BIG request is
    admitted again (at once; a client gone is seen within 2.5 s, before the 6 s body timeout)."""
    framing, how, status = ENDINGS[ending]
    idx = 200 + sorted(ENDINGS).index(ending) * 10
    assert until(lambda: admitted(budget, idx), 10), "the byte bound is held before the test"
    size = 70000 if "413" in ending else BIG
    body = budget.body("bytes-ending", size=size if size <= 65536 else None, idx=idx + 1,
                       signed="401" not in ending)
    if "422" in ending:
        body = body.replace(b'"payload": {', b'"payload": [{', 1).replace(b"}}", b"}]}", 1)
    if size > 65536:
        body = body + b" " * (size - len(body))  # JSON allows trailing blanks: over the limit by size
    with socket.create_connection(("127.0.0.1", budget.port), timeout=15) as sock:
        if framing == "length":
            sock.sendall(head(budget.port, len(body)) + body[:FIRST])
        else:
            sock.sendall(head(budget.port, None) + chunk(body[:FIRST]))
        assert until(lambda: held(budget, idx + 2), 2.0), "the partly sent body holds no reservation"
        if how == "send":
            rest = body[FIRST:]
            sock.sendall(rest if framing == "length" else chunk(rest) + chunk(b""))
            assert status_of(sock) == status
        elif how == "wait":
            assert status_of(sock) == status
    assert until(lambda: admitted(budget, idx + 3), 2.5), f"the reservation is still held after: {ending}"


def test_a_stream_whose_client_left_releases_its_reservation(budget: Worker) -> None:
    """A stream (BIG body) whose client leaves after the first part: its reservation goes at once,
    not when the 6 s answer would have ended."""
    assert until(lambda: admitted(budget, 301), 10)
    stream = Stream(budget.port, budget.body("trickle 30 0.2", size=BIG, idx=302, stream=True))
    try:
        stream.next()
        assert held(budget, 303)
    finally:
        stream.close()
    assert until(lambda: admitted(budget, 304), 2.5)


# --------------------------------------------------------------------------- Content-Encoding


def raw_post(port: int, body: bytes, codings: list[str]) -> tuple[int, Any]:
    """POST `body` with one Content-Encoding header per item of `codings`; (status, JSON body)."""
    lines = "".join(f"Content-Encoding: {c}\r\n" for c in codings)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall((f"POST {ROUTE} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{lines}"
                      f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body)
        sock.settimeout(30)
        data = b""
        while part := sock.recv(65536):
            data += part
    header, _, rest = data.partition(b"\r\n\r\n")
    with contextlib.suppress(ValueError):
        return int(header.split()[1]), json.loads(rest)
    return int(header.split()[1]), rest


ENCODED: dict[str, tuple[list[str], Callable[[bytes], bytes]]] = {
    "gzip": (["gzip"], gzip.compress),
    "deflate": (["deflate"], zlib.compress),
    "GZIP": (["GZIP"], gzip.compress),
    "x-gzip": (["x-gzip"], gzip.compress),
    "br": (["br"], lambda b: b),
    "zstd": (["zstd"], lambda b: b),
    "compress": (["compress"], lambda b: b),
    "stacked gzip, gzip": (["gzip, gzip"], lambda b: gzip.compress(gzip.compress(b))),
    "stacked deflate, gzip": (["deflate, gzip"], lambda b: gzip.compress(zlib.compress(b))),
    "identity, gzip": (["identity, gzip"], gzip.compress),
    "two headers: identity then gzip": (["identity", "gzip"], gzip.compress),
}


@pytest.mark.parametrize("case", sorted(ENCODED))
def test_a_request_with_a_content_encoding_is_415(case: str, capped: Worker) -> None:
    """Any content coding but identity, alone, stacked or repeated: 415 JSON naming the header, and
    the engine never sees the request (aiohttp served gzip and deflate, and answered br and zstd
    with a plain-text 400)."""
    codings, encode = ENCODED[case]
    marker = f"encoded-{sorted(ENCODED).index(case)}"
    status, body = raw_post(capped.port, encode(capped.body(marker, idx=400)), codings)
    assert status == 415 and "Content-Encoding" in body["error"], (status, body)
    assert not capped.engine_saw(marker)


@pytest.mark.parametrize("codings", [[], ["identity"], ["Identity, identity"]])
def test_identity_or_no_content_encoding_is_served(codings: list[str], capped: Worker) -> None:
    status, body = raw_post(capped.port, capped.body("plain-body", idx=410), codings)
    assert status == 200 and body["choices"][0]["text"] == "echo:plain-body", body


def peak_rss_kib(proc: Proc) -> int:
    """The worker process's peak resident memory so far (VmHWM)."""
    status = Path(f"/proc/{proc.popen.pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_a_compression_bomb_is_refused_without_inflating_it(coding: str, capped: Worker) -> None:
    """~41 KB that inflates to 40 MiB (2.5x the body limit): 415 at once, and the worker's peak
    memory does not grow by what inflating it costs (before: 413 after ~32 MiB inflated, +84 MB
    peak, the event loop held ~0.5 s)."""
    inflated = capped.body("bomb " + "a" * (40 << 20), idx=420)
    bomb = gzip.compress(inflated, 9) if coding == "gzip" else zlib.compress(inflated, 9)
    assert len(bomb) < 64 * 1024 < 16 * 1024 * 1024 < len(inflated)
    before = peak_rss_kib(capped.proc)
    started = time.monotonic()
    status, body = raw_post(capped.port, bomb, [coding])
    elapsed = time.monotonic() - started
    assert status == 415 and "Content-Encoding" in body["error"], (status, body)
    grown = peak_rss_kib(capped.proc) - before
    assert grown < 8 * 1024, f"peak memory grew {grown} KiB"
    assert elapsed < 5, elapsed


# --------------------------------------------------------------------------- the connection cap


def cap_answer(sock: socket.socket) -> bytes:
    """What a connection over the cap is told: everything until the worker closes it."""
    sock.settimeout(10)
    data = b""
    with contextlib.suppress(OSError):
        while part := sock.recv(4096):
            data += part
    return data


def connects(port: int) -> bool:
    """Whether a new connection is served (not the cap's 503)."""
    status, _, _ = request(port, "/nope", method="GET", timeout=10)
    return status == 404


def refused_at_once(sock: socket.socket) -> bool:
    """Whether the worker answered this new connection with the cap's 503 before it sent anything."""
    sock.settimeout(0.15)
    try:
        return sock.recv(64).startswith(b"HTTP/1.1 503 ")
    except OSError:
        return False  # nothing yet: admitted, waiting for a request


def fill_cap(port: int, room: int, send: bytes = b"") -> list[socket.socket]:
    """`room` new connections admitted (each sends `send`) and the next one refused: the cap is full
    with them. Tried again (5 times at most) while connections of an earlier test still end."""
    for _ in range(5):
        socks: list[socket.socket] = []
        for _ in range(room + 1):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            if refused_at_once(sock):
                sock.close()
                break
            sock.sendall(send)
            socks.append(sock)
        if len(socks) == room:
            return socks
        for sock in socks:
            sock.close()
        time.sleep(0.5)
    raise AssertionError(f"{room} new connections did not fill the cap of {CAP} (got {len(socks)} before a refusal)")


def test_connections_beyond_the_cap_get_503_and_cannot_starve_an_admitted_stream(capped: Worker) -> None:
    """At the cap (a stream and requests whose body is late), a new connection is answered 503 JSON with
    Retry-After and Connection: close before it sends anything, and a flood of them (bounded: 3 s,
    400 connections) reaches neither the engine nor the stream, whose parts keep their pace."""
    assert until(lambda: connects(capped.port), 10), "the cap is reached before the test"
    stream = Stream(capped.port, capped.body("trickle 12 0.3", idx=501, stream=True))
    idle: list[socket.socket] = []
    try:
        stream.next()
        # The rest of the cap: requests whose body is late (they hold their connection past the 3 s
        # header timeout, up to the 60 s body timeout).
        idle = fill_cap(capped.port, CAP - 1, head(capped.port, 1000) + b"{")
        with socket.create_connection(("127.0.0.1", capped.port), timeout=10) as over:
            answer = cap_answer(over)
        headers, _, text = answer.partition(b"\r\n\r\n")
        assert headers.startswith(b"HTTP/1.1 503 "), answer
        lines = headers.split(b"\r\n")
        assert b"Retry-After: 10" in lines and b"Connection: close" in lines, headers
        assert "BAKERY_MAX_CONNECTIONS" in json.loads(text)["error"]
        reader = threading.Thread(target=stream.rest, daemon=True)  # the parts as they come
        reader.start()
        refused = 0
        flood = capped.body("flooded", idx=502)
        deadline = time.monotonic() + 3.0
        for _ in range(400):
            if time.monotonic() > deadline:
                break
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", capped.port), timeout=5) as s:
                s.sendall(head(capped.port, len(flood)) + flood)
                refused += status_of(s, timeout=5) == 503
        reader.join(20)
        text_so_far = stream.text
    finally:
        stream.close()
        for sock in idle:
            sock.close()
    assert refused >= 20, refused
    assert all(f"part{i}".encode() in text_so_far for i in range(12)), text_so_far
    gaps = [b - a for a, b in zip(stream.times, stream.times[1:], strict=False)]
    assert max(gaps) < 1.5, gaps
    assert not capped.engine_saw("flooded")
    assert until(lambda: connects(capped.port), 5), "a connection is refused once the others closed"


BURST = 400  # new connections at once: over aiohttp's default listen backlog (128)


def test_a_burst_of_connections_completes_its_handshakes_while_the_worker_accepts_none(budget: Worker) -> None:
    """400 connections that arrive while the worker accepts none (stopped, as a loop busy with a burst
    is) all complete their handshake at once, and each is answered once the worker runs again. With
    aiohttp's default backlog (128) the kernel dropped the rest, and their clients waited ~1 s for
    its retry (441 drops at a burst of 1024 streams, bench/serving_bench.py --only scale)."""
    pid = budget.proc.popen.pid
    socks: list[socket.socket] = []
    selector = selectors.DefaultSelector()
    os.kill(pid, signal.SIGSTOP)
    try:
        for _ in range(BURST):
            sock = socket.socket()
            sock.setblocking(False)
            socks.append(sock)
            assert sock.connect_ex(("127.0.0.1", budget.port)) in (0, 115), "EINPROGRESS or connected"
            selector.register(sock, selectors.EVENT_WRITE)
        connected = 0
        deadline = time.monotonic() + 0.5  # the kernel's retry of a dropped handshake is 1 s away
        while connected < BURST and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=max(0.0, deadline - time.monotonic())):
                selector.unregister(key.fileobj)
                connected += key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0  # type: ignore[union-attr]
        assert connected == BURST, f"{connected} of {BURST} handshakes completed while the worker accepted none"
    finally:
        os.kill(pid, signal.SIGCONT)
        selector.close()
    try:
        for sock in socks:
            sock.setblocking(True)
            sock.sendall(b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        statuses = [status_of(sock, timeout=10) for sock in socks]
    finally:
        for sock in socks:
            sock.close()
    assert all(status == 404 for status in statuses), sorted(set(statuses))


def test_refused_connections_that_stay_open_are_dropped_soon(capped: Worker) -> None:
    """150 connections over the cap that never close (and never send): each gets the 503 and is
    closed by the worker within the 2 s linger, so refusals cannot pile up file descriptors."""
    assert until(lambda: connects(capped.port), 10), "the cap is reached before the test"
    fillers: list[socket.socket] = []
    over: list[socket.socket] = []
    try:
        fillers = fill_cap(capped.port, CAP, head(capped.port, 1000) + b"{")  # late bodies
        over = [socket.create_connection(("127.0.0.1", capped.port), timeout=10) for _ in range(150)]
        started = time.monotonic()
        answers = [cap_answer(sock) for sock in over]  # each read until the worker closes it
        elapsed = time.monotonic() - started
    finally:
        for sock in fillers + over:
            sock.close()
    assert all(answer.startswith(b"HTTP/1.1 503 ") for answer in answers), [a[:40] for a in answers][:5]
    assert elapsed < 2.0 + 2.0, elapsed  # the linger, and the time to read 150 sockets


def test_idle_connections_hold_the_cap_only_until_the_header_timeout(capped: Worker) -> None:
    """Keep-alive connections idle after their request, and connections that never send one, fill
    the cap: a new one gets 503; the header timeout (3 s) closes them, and a new one is served."""
    assert until(lambda: connects(capped.port), 10), "the cap is reached before the test"
    socks: list[socket.socket] = []
    try:
        socks = fill_cap(capped.port, CAP)  # nothing sent: waiting for their headers
        for sock in socks[: CAP // 2]:  # a request each, then idle (kept alive)
            sock.settimeout(10)
            sock.sendall(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status_of(sock) == 404
        with socket.create_connection(("127.0.0.1", capped.port), timeout=10) as over:
            assert cap_answer(over).startswith(b"HTTP/1.1 503 ")
        started = time.monotonic()
        for sock in socks:
            sock.settimeout(10)
            with contextlib.suppress(OSError):
                while sock.recv(4096):
                    pass
        closed_after = time.monotonic() - started
    finally:
        for sock in socks:
            sock.close()
    assert closed_after < 8, closed_after
    assert until(lambda: connects(capped.port), 3)


def never_reading(port: int, request: bytes, most: int = 20000, seconds: float = 5) -> tuple[socket.socket, int]:
    """A connection with the least receive room that sends `request` over and over (at most `most`
    times, for at most `seconds`, until its sends block) and never reads; (it, requests sent)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    data, sent, started = request * most, 0, time.monotonic()
    with contextlib.suppress(BlockingIOError):
        while sent < len(data) and time.monotonic() - started < seconds:
            sent += sock.send(data[sent:])
            time.sleep(0.001)
    return sock, sent // len(request)


def test_a_client_that_reads_nothing_gives_its_slot_back_at_the_send_timeout(capped: Worker) -> None:
    """Unsigned requests pipelined (~6,500 each, until the sends block) on connections that read
    nothing: their 401s fill the sockets and aiohttp waits for a flush that never comes, which held
    the connection (and its slot) for good. The cap full of them, a new connection gets 503; within
    the send timeout (2 s here) each is reset and a new one is served."""
    assert until(lambda: connects(capped.port), 10), "the cap is reached before the test"
    body = capped.body("never read", signed=False)
    request = head(capped.port, len(body)) + body
    stuck: list[socket.socket] = []
    try:
        for _ in range(CAP):
            sock, count = never_reading(capped.port, request)
            stuck.append(sock)
            assert count > 1000, f"only {count} requests went before the sends blocked"
        with socket.create_connection(("127.0.0.1", capped.port), timeout=10) as over:
            assert cap_answer(over).startswith(b"HTTP/1.1 503 "), "the cap was not full of stuck connections"
        started = time.monotonic()
        assert until(lambda: connects(capped.port), SEND_TIMEOUT + 6, pause=0.25), \
            "connections that read nothing kept their slots past the send timeout"
        freed_after = time.monotonic() - started
    finally:
        for sock in stuck:
            sock.close()
    assert freed_after < SEND_TIMEOUT + 6, freed_after


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-n", "0", "-q"]))
