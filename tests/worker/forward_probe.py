"""Run inside the worker venv (PYTHONPATH=worker/): how engine/forward.py reads engine answers.

    <venv>/bin/python forward_probe.py

Prints one JSON object; tests/worker/test_forward.py asserts it. Each answer below is fed to
forward.Answer split at every byte boundary (and byte by byte): what it decodes must not depend on
how the bytes arrived. Then forward.Pool talks to small engines on loopback: kept-alive reuse, a
connection the engine closed while idle, an engine that goes silent, one that refuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import threading
import time
from typing import Any

from engine import forward

ANSWERS = {
    "chunked": (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
                b"f\r\ndata: {\"a\":1}\n\n\r\n5;ext=1\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n"),
    "length": b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"error\":1}",
    "close": b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end",
    "empty": b"HTTP/1.1 204 No Content\r\nServer: x\r\n\r\n",
}
MALFORMED = {
    "bad_size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n",
    "no_crlf": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY",
    "not_http": b"SSH-2.0-OpenSSH\r\n\r\n",
    "bad_header": b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    "head_too_big": b"HTTP/1.1 200 OK\r\n" + b"X: " + b"y" * (forward.HEAD_LIMIT + 10),
}


class Conn:
    """What an Answer needs of its connection: where it says it ended, or that it must be dropped."""

    def __init__(self) -> None:
        self.done = 0
        self.discarded = 0

    def answer_done(self, answer: Any) -> None:
        self.done += 1

    def discard(self) -> None:
        self.discarded += 1


def outcome(answer: forward.Answer, conn: Conn, lost: bool) -> dict[str, Any]:
    if lost:
        answer.connection_lost(None)
    result: dict[str, Any] = {"ended": answer.ended, "done": conn.done, "discarded": conn.discarded}
    if answer.finished.done():
        error = answer.finished.exception()
        result["error"] = type(error).__name__ if error else None
    if answer.head_done.done() and not answer.head_done.exception():
        result.update(status=answer.status, content_type=answer.content_type, keep_alive=answer.keep_alive,
                      headers=sorted(answer.headers.items()))
        if not result.get("error"):  # what was decoded before an error is dropped with the answer
            result["body"] = b"".join(answer.take_pending()).decode()
    return result


def feed(loop: asyncio.AbstractEventLoop, raw: bytes, cuts: list[int], lost: bool) -> dict[str, Any]:
    conn = Conn()
    answer = forward.Answer(conn, loop, 0)  # type: ignore[arg-type]
    start = 0
    for cut in [*cuts, len(raw)]:
        if cut > start:
            answer.feed(raw[start:cut])
        start = cut
    return outcome(answer, conn, lost)


def decoding(loop: asyncio.AbstractEventLoop) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for name, raw in {**ANSWERS, **MALFORMED}.items():
        lost = name == "close"  # its body ends with the connection
        seen = [feed(loop, raw, [], lost)]
        seen += [feed(loop, raw, [i], lost) for i in range(1, len(raw))] if len(raw) < 4096 else []
        seen.append(feed(loop, raw, list(range(1, len(raw))), lost) if len(raw) < 4096 else seen[0])
        distinct = {json.dumps(s, sort_keys=True) for s in seen}
        report[name] = {"splits": len(seen), "distinct": len(distinct), "outcome": seen[0]}
    return report


STREAM_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
STREAM_BODY = (b"f\r\ndata: {\"a\":1}\n\n\r\nF\r\ndata: {\"b\":2}\n\n\r\n5;ext=1\r\nhello\r\n0\r\n\r\n")
# Where each chunk of STREAM_BODY ends: an engine writing one event per read.
STREAM_CHUNK_ENDS = [20, 40, 56]


def dechunk(data: bytes) -> bytes:
    """The body a client reads from chunked `data` (sizes in hex, extensions ignored)."""
    body, pos = b"", 0
    while True:
        end = data.index(b"\r\n", pos)
        size = int(data[pos:end].split(b";")[0], 16)
        if size == 0:
            return body
        body += data[end + 2:end + 2 + size]
        pos = end + 2 + size + 2


def relay(loop: asyncio.AbstractEventLoop, cuts: list[int]) -> dict[str, Any]:
    """STREAM_BODY fed in pieces cut at `cuts` to an Answer whose body goes to a chunked client: what the
    client's bytes decode to, and how many reads went on with their own framing (raw_sink)."""
    conn = Conn()
    answer = forward.Answer(conn, loop, 0)  # type: ignore[arg-type]
    answer.feed(STREAM_HEAD)
    client: list[bytes] = []
    raw_reads = [0]

    def sink(pieces: list[bytes]) -> None:
        client.extend(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces)

    def raw_sink(data: bytes) -> None:
        raw_reads[0] += 1
        client.append(data)

    answer.attach(sink, raw_sink)
    start = 0
    for cut in [*cuts, len(STREAM_BODY)]:
        if cut > start:
            answer.feed(STREAM_BODY[start:cut])
        start = cut
    sent = b"".join(client) + b"0\r\n\r\n"  # the answer's end, written by aiohttp's write_eof
    return {"body": dechunk(sent).decode(), "raw_reads": raw_reads[0], "client": sent.decode(),
            "ended": answer.ended, "done": conn.done, "discarded": conn.discarded}


def relaying(loop: asyncio.AbstractEventLoop) -> dict[str, Any]:
    every = [relay(loop, [i]) for i in range(1, len(STREAM_BODY))] + [relay(loop, list(range(1, len(STREAM_BODY))))]
    return {"per_event": relay(loop, STREAM_CHUNK_ENDS),
            "splits": len(every), "bodies": sorted({r["body"] for r in every}),
            "all_ended": all(r["ended"] and r["done"] == 1 and not r["discarded"] for r in every),
            "whole_chunks": {case.decode(): forward.whole_chunks(case) for case in (
                b"3\r\nabc\r\n", b"3\r\nabc\r\nA\r\n0123456789\r\n", b"3\r\nabc\r\n0\r\n\r\n",
                b"3\r\nabc", b"3;x=1\r\nabc\r\n", b" 3\r\nabc\r\n", b"3\r\nabcXY", b"0\r\n\r\n",
                b"1_0\r\n0123456789abcdef\r\n")}}


async def engine(answers: list[bytes | None], stall: bool = False) -> tuple[asyncio.base_events.Server, list[int]]:
    """A loopback engine: answers each request with the next of `answers` (None: close the connection
    without a byte); closes a connection after an answer that says `Connection: close`; `stall`
    sends nothing."""
    peers: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer.get_extra_info("peername")[1])
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                if stall:
                    await asyncio.sleep(30)
                raw = answers.pop(0)
                if raw is None:
                    break
                writer.write(raw)
                await writer.drain()
                if b"Connection: close" in raw:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, peers


async def serve_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answers: list[bytes]) -> None:
    """Read one request, write the next of `answers`, close."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]))
        writer.write(answers.pop(0))
        await writer.drain()
    finally:
        writer.close()


OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
STRAY = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n\"stray\""
SECOND = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n[]"
OK_CLOSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"


def trailing_engine(pause: float | None) -> tuple[socket.socket, list[int]]:
    """A loopback engine in a thread of its own (the loop may be held while it writes): its first
    answer (OK) is followed by a stray answer's bytes, in the same write (`pause` None) or `pause`
    seconds later; every later request is answered SECOND. Serves for 10 s at most."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)
    peers: list[int] = []

    def answer(conn: socket.socket, first: bool) -> None:
        if not first:
            conn.sendall(SECOND)
        elif pause is None:
            conn.sendall(OK + STRAY)
        else:
            conn.sendall(OK)
            time.sleep(pause)
            conn.sendall(STRAY)

    def serve() -> None:
        first = True
        deadline = time.monotonic() + 10
        with contextlib.suppress(OSError):
            while time.monotonic() < deadline:
                conn, peer = listener.accept()
                peers.append(peer[1])
                conn.settimeout(10)
                threading.Thread(target=serve_conn, args=(conn, first), daemon=True).start()
                first = False

    def serve_conn(conn: socket.socket, first: bool) -> None:
        with conn, contextlib.suppress(OSError):
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    more = conn.recv(65536)
                    if not more:
                        return
                    data += more
                head, _, data = data.partition(b"\r\n\r\n")
                length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                while len(data) < length:
                    data += conn.recv(65536)
                data = data[length:]
                answer(conn, first)
                first = False

    threading.Thread(target=serve, daemon=True).start()
    return listener, peers


async def pooling() -> dict[str, Any]:
    report: dict[str, Any] = {}
    server, peers = await engine([OK, OK, OK])
    port = server.sockets[0].getsockname()[1]
    pool = forward.Pool("127.0.0.1", port, 5, 5, 4)
    bodies = [await (await pool.post("/v1/x", {"n": i})).read() for i in range(3)]
    report["kept_alive"] = {"bodies": [b.decode() for b in bodies], "connections": len(set(peers))}
    pool.close()
    server.close()

    # The engine closes its connection after the first answer: the next request goes on a new one.
    server, peers = await engine([OK_CLOSE, OK, OK])
    port = server.sockets[0].getsockname()[1]
    pool = forward.Pool("127.0.0.1", port, 5, 5, 4)
    first = await (await pool.post("/v1/x", {})).read()
    await asyncio.sleep(0.2)  # the close reached us: that connection is not handed out
    second = await (await pool.post("/v1/x", {})).read()
    report["closed_by_engine"] = {"bodies": [first.decode(), second.decode()], "connections": len(set(peers))}
    pool.close()
    server.close()

    # A kept-alive connection the engine closes just as it is reused (it read the request, then went
    # away without a byte): retried once, on a new connection.
    server, peers = await engine([OK, None, OK])
    port = server.sockets[0].getsockname()[1]
    pool = forward.Pool("127.0.0.1", port, 5, 5, 4)
    await (await pool.post("/v1/x", {})).read()
    try:
        body = await (await pool.post("/v1/x", {})).read()
        report["stale_retried"] = {"body": body.decode(), "connections": len(set(peers))}
    except Exception as exc:  # noqa: BLE001 (reported, asserted by the test)
        report["stale_retried"] = type(exc).__name__
    pool.close()
    server.close()

    # Bytes after an answer's end, in the same read or a moment later: the connection is not reused.
    for name, pause in (("extra_same_read", None), ("extra_later", 0.05)):
        listener, peers = trailing_engine(pause)
        port = listener.getsockname()[1]
        pool = forward.Pool("127.0.0.1", port, 5, 5, 4)
        first = await pool.post("/v1/x", {})
        body = await first.read()
        time.sleep(0.3)  # no loop turn: the late bytes are in the socket, not yet read by the loop
        second = await (await pool.post("/v1/x", {})).read()
        report[name] = {"bodies": [body.decode(), second.decode()], "keep_alive": first.keep_alive,
                        "connections": len(set(peers))}
        pool.close()
        listener.close()

    # An engine that never answers: the idle timeout ends the call.
    server, _ = await engine([OK], stall=True)
    port = server.sockets[0].getsockname()[1]
    pool = forward.Pool("127.0.0.1", port, 5, 0.3, 4)
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        await pool.post("/v1/x", {})
        report["silent"] = "answered"
    except asyncio.TimeoutError:
        report["silent"] = {"error": "TimeoutError", "seconds": round(loop.time() - start, 3)}
    pool.close()
    server.close()

    # vLLM's start: the port is bound, and listened on only after the load line. A first connection
    # refused then is tried again within the grace; after one connection was made, a refusal (the
    # engine gone) reaches the caller at once.
    late = socket.socket()
    late.bind(("127.0.0.1", 0))
    late_port = late.getsockname()[1]
    pool = forward.Pool("127.0.0.1", late_port, 5, 5, 4, first_connect_grace=5.0)
    answers = [OK_CLOSE]

    async def listen_late() -> asyncio.base_events.Server:
        await asyncio.sleep(0.3)
        return await asyncio.start_server(lambda r, w: serve_once(r, w, answers), sock=late)

    listening = asyncio.ensure_future(listen_late())
    start = loop.time()
    try:
        body = await (await pool.post("/v1/x", {})).read()
        report["late_listener"] = {"body": body.decode(), "seconds": round(loop.time() - start, 3)}
    except OSError as exc:
        report["late_listener"] = type(exc).__name__
    late_server = await listening
    late_server.close()
    await late_server.wait_closed()
    start = loop.time()
    try:
        await pool.post("/v1/x", {})
        report["refused_after_first"] = "answered"
    except OSError as exc:
        report["refused_after_first"] = {"error": type(exc).__name__, "seconds": round(loop.time() - start, 3)}
    pool.close()

    # Nobody listens: the connection error reaches the caller (the SDK answers 500).
    pool = forward.Pool("127.0.0.1", port, 5, 5, 4)
    try:
        await pool.post("/v1/x", {})
        report["refused"] = "answered"
    except OSError as exc:
        report["refused"] = type(exc).__name__
    return report


FORMS = {
    "file_and_fields": {"file": ("a.wav", b"RIFF\0\1", "audio/wav"), "model": "m", "temperature": 0.5,
                        "stream": True, "language": None},
    "lists_and_json": {"timestamp_granularities[]": ["word", "segment"], "meta": {"a": [1, 2]}, "ids": [[1], 2],
                       "files": [("x.png", b"\x89PNG", "image/png"), ("y.png", b"\x89PN", "image/png"), None]},
    "false_and_number": {"flag": False, "n": 3, "zero": 0},
    "empty": {},
}


def form_parts(form: Any) -> Any:
    """What an aiohttp FormData sends, part by part (name, filename, content type, value)."""
    return [[dict(options), {k: v for k, v in headers.items()}, value if isinstance(value, str) else repr(value)]
            for options, headers, value in form._fields] + [form._is_multipart]


def forms() -> dict[str, Any]:
    """forward.form_data against the SDK's own multipart builder, on the same fields."""
    from vastai.serverless.server.lib.backend import Backend

    sdk_build = Backend._Backend__build_form_data
    out: dict[str, Any] = {name: [form_parts(forward.form_data(fields)), form_parts(sdk_build(fields))]
                           for name, fields in FORMS.items()}
    refusals = []
    for build in (forward.form_data, sdk_build):
        try:
            build({"raw": b"bytes"})
            refusals.append(None)
        except TypeError:
            refusals.append("TypeError")
    out["bare_bytes"] = refusals
    return out


def main() -> int:
    loop = asyncio.new_event_loop()
    report = {"decoding": decoding(loop), "relaying": relaying(loop), "pooling": loop.run_until_complete(pooling()),
              "forms": forms(),
              "engine_address": {url: forward.engine_address(url) for url in (
                  "http://127.0.0.1:18000", "http://localhost", "https://127.0.0.1:1", "http://h:1/prefix")}}
    return finish(loop, report)


def finish(loop: asyncio.AbstractEventLoop, report: dict[str, Any]) -> int:
    """Cancel what is left on `loop` (the engines' connection handlers), close it, print `report`."""
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    if pending:  # gather() of nothing would make its future on another loop
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
