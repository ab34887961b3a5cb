"""bakery's own engine call for JSON requests: stream events written as they arrive, no task per event.

The SDK's `iter_any()` loop cost a task step and more per event: the worker, not the engine, set throughput. A
small HTTP/1.1 client on kept-alive loopback connections writes what each `data_received` decodes at once. The
guards' timeouts and engine_close apply; multipart keeps the SDK's client. See docs/serving.md.
"""

from __future__ import annotations

import asyncio
import json
import re
import select
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from config import request_path
from engine import let_go

HEAD_LIMIT = 64 * 1024  # an engine's status line and headers: more is not an HTTP answer we serve
WRITE_HIGH = 256 * 1024  # a slow client: stop reading the engine above this many bytes unsent ...
WRITE_LOW = 64 * 1024  # ... and read again below this many
PAUSE_POLL = 0.005  # seconds between checks of a paused client's buffer
STREAM_TYPES = ("application/x-ndjson", "application/jsonl")
# A chunk-size line as engines write it: hex digits alone (no extension, no blanks).
_CHUNK_SIZE = re.compile(rb"[0-9a-fA-F]{1,15}\r\n")


def whole_chunks(data: bytes) -> bool:
    """Whether `data` is one or more complete chunks of a chunked body, none of them the last (size 0)
    one, each with a plain hex size line: bytes that may be forwarded to a chunked answer as they are."""
    pos, end = 0, len(data)
    while pos < end:
        size_line = _CHUNK_SIZE.match(data, pos)
        if size_line is None:
            return False
        size = int(size_line[0][:-2], 16)
        pos = size_line.end() + size
        if size == 0 or data[pos:pos + 2] != b"\r\n":
            return False
        pos += 2
    return True


class EngineError(OSError):
    """The engine connection broke or the engine's answer was not HTTP we can forward."""


def is_stream(content_type: str, headers: Any) -> bool:
    """The SDK's own test of a streamed answer (vastai 1.9.1 GenericEndpointHandler)."""
    return (content_type.startswith("text/event-stream") or content_type in STREAM_TYPES
            or "stream" in content_type.lower() or headers.get("Transfer-Encoding") == "chunked")


# --------------------------------------------------------------------------- the engine's answer


class Answer:
    """One engine answer on one connection, shaped as what the SDK reads of aiohttp's ClientResponse.

    Bytes arrive through `feed` (the connection's data_received): first the head, then the body,
    decoded from its framing (chunked, Content-Length, or up to the connection's end). Body pieces go
    to the `sink` once one is attached, and are kept until then.
    """

    def __init__(self, conn: Connection, loop: asyncio.AbstractEventLoop, idle_timeout: float) -> None:
        self.conn = conn
        self.loop = loop
        self.status = 0
        self.reason = ""
        self.headers: Any = None
        self.content_type = "application/octet-stream"
        self.keep_alive = True
        # Awaited by the request's task: a cancelled task cancels them, so the state is in flags.
        self.head_done: asyncio.Future[None] = loop.create_future()
        self.finished: asyncio.Future[None] = loop.create_future()
        self._has_head = False
        self._ended = False  # the body's end was read, or the answer failed
        self._head = b""
        self._framing = ""  # "chunked" | "length" | "close"
        self._left = 0  # Content-Length bytes left, or data bytes left in the current chunk
        self._crlf = 0  # bytes of the CRLF after a chunk's data still to come
        self._line = b""  # a chunk-size line split across reads
        self._trailer = False  # after the last chunk: trailer lines until an empty one
        self._pending: list[bytes] = []
        self._sink: Callable[[list[bytes]], None] | None = None
        self._raw_sink: Callable[[bytes], None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._body: bytes | None = None
        self._closed = False
        self._idle = idle_timeout
        self._last = loop.time()
        self._timer = loop.call_later(idle_timeout, self._check_idle) if idle_timeout else None

    # -- what the SDK and the guards read

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def idle_timeout(self) -> float:
        """Seconds without an engine byte that end the answer (0: no limit)."""
        return self._idle

    @property
    def ended(self) -> bool:
        """The body's end was read, or the answer failed."""
        return self._ended

    async def read(self) -> bytes:
        """The whole body (waits for its end)."""
        if self._body is None:
            await self.finished
            self._body = b"".join(self._pending)
            self._pending = []
        return self._body

    def close(self) -> None:
        """Stop: an answer not read to its end closes its connection (the engine stops generating)."""
        if self._closed:
            return
        self._closed = True
        self._stop_timer()
        if not self._ended:  # _fail drops the connection
            self._fail(EngineError("the engine answer was closed before its end"))

    # -- what the engine connection feeds

    def feed(self, data: bytes) -> None:
        self._last = self.loop.time()
        if self._ended:
            return
        if not self._has_head:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                if len(self._head) > HEAD_LIMIT:
                    self._fail(EngineError(f"the engine's answer head is over {HEAD_LIMIT} bytes"))
                return
            head, rest = self._head[:end], self._head[end + 4:]
            self._head = b""
            try:
                self._parse_head(head)
            except (ValueError, UnicodeDecodeError) as exc:
                self._fail(EngineError(f"the engine's answer is not HTTP/1.x: {exc}"))
                return
            self._has_head = True
            if not self.head_done.done():
                self.head_done.set_result(None)
            if self._framing == "length" and self._left == 0:
                if rest:
                    self.keep_alive = False  # bytes after the answer: the connection is not reused
                self._end()
                return
            if not rest:
                return
            data = rest
        elif (self._raw_sink is not None and self._framing == "chunked"
              and not (self._left or self._crlf or self._line or self._trailer) and whole_chunks(data)):
            # The usual read of a stream: whole chunks, each an event; they go on with their framing.
            self._raw_sink(data)
            return
        try:
            pieces = self._decode(data)
        except ValueError as exc:
            self._fail(EngineError(f"the engine's chunked answer is malformed: {exc}"))
            return
        if pieces:
            if self._sink is not None:
                self._sink(pieces)
            else:
                self._pending.extend(pieces)
                self._wake()
        if self._framing == "done":
            self._end()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._ended:
            return
        if self._framing == "close" and self._has_head:
            self._end()
        else:
            self._fail(EngineError(f"the engine closed the connection mid-answer ({exc or 'EOF'})"))

    # -- the body's consumer

    def take_pending(self) -> list[bytes]:
        pieces, self._pending = self._pending, []
        return pieces

    async def wait_data(self) -> None:
        """Until a body piece is kept or the answer ended (its error, if it failed, is raised)."""
        if not self._pending and not self._ended:
            self._waiter = self.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._ended and not self._pending:
            self.finished.result()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def attach(self, sink: Callable[[list[bytes]], None], raw_sink: Callable[[bytes], None] | None = None) -> None:
        """From now on, body pieces go to `sink` as they arrive (what is kept goes first); with
        `raw_sink`, a read of a chunked body that is whole chunks goes to it with its chunk framing."""
        pending = self.take_pending()
        self._sink, self._raw_sink = sink, raw_sink
        if pending:
            sink(pending)

    def detach(self) -> None:
        self._sink = self._raw_sink = None

    def lendable(self) -> int | None:
        """The engine socket's descriptor when the rest of this body may be read by bakery-relay: a
        chunked body not yet ended, nothing kept, its framing at a chunk boundary; else None."""
        if (self._ended or self._framing != "chunked" or self._pending or self._left or self._crlf
                or self._line or self._trailer or self.conn.transport is None):
            return None
        return self.conn.fd()

    def lend(self) -> None:
        """bakery-relay reads the engine from now on: no reads here, no idle timer (it keeps its own)."""
        self._stop_timer()
        if self.conn.transport is not None:
            self.conn.transport.pause_reading()

    def take_back(self, outcome: int) -> None:
        """bakery-relay's outcome (native_relay's values) as this answer's end or failure."""
        from engine import native_relay as native

        if self._ended:
            return
        if outcome in (native.END, native.END_EXTRA):
            self._framing = "done"
            if outcome == native.END_EXTRA:
                self.keep_alive = False  # bytes nobody asked for: the connection is not reused
            elif self.conn.transport is not None:
                self.conn.transport.resume_reading()
            self._end()
        elif outcome == native.IDLE:
            self._fail(asyncio.TimeoutError())
        elif outcome in (native.CLIENT_GONE, native.CLIENT_STALLED):
            self.close()
        else:
            reason = {native.ENGINE_EOF: "the engine closed the connection mid-answer (EOF)",
                      native.MALFORMED: "the engine's chunked answer is malformed"}.get(
                outcome, f"bakery-relay ended the stream (outcome {outcome})")
            self._fail(EngineError(reason))

    # -- internals

    def _parse_head(self, head: bytes) -> None:
        from multidict import CIMultiDict, CIMultiDictProxy

        lines = head.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise ValueError(f"status line {lines[0][:80]!r}")
        headers: CIMultiDict[str] = CIMultiDict()
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise ValueError(f"header line {line[:80]!r}")
            headers.add(name, value.strip())
        self.status, self.reason = int(code), reason
        self.headers = CIMultiDictProxy(headers)
        mime = headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        self.content_type = mime or "application/octet-stream"
        connection = headers.get("Connection", "").lower()
        self.keep_alive = version == "HTTP/1.1" and "close" not in connection
        if "chunked" in headers.get("Transfer-Encoding", "").lower():
            self._framing = "chunked"
        elif "Content-Length" in headers:
            self._framing, self._left = "length", int(headers["Content-Length"])
        elif self.status in (204, 304) or 100 <= self.status < 200:
            self._framing, self._left = "length", 0
        else:
            self._framing, self.keep_alive = "close", False

    def _decode(self, data: bytes) -> list[bytes]:
        if self._framing == "chunked":
            return self._dechunk(data)
        if self._framing == "length":
            if len(data) >= self._left:
                if len(data) > self._left:
                    self.keep_alive = False  # bytes after the answer: the connection is not reused
                data, self._left = data[:self._left], 0
                self._framing = "done"
                return [data] if data else []
            self._left -= len(data)
        return [data]

    def _dechunk(self, data: bytes) -> list[bytes]:
        pieces: list[bytes] = []
        pos, end = 0, len(data)
        while pos < end:
            if self._left:
                take = min(self._left, end - pos)
                pieces.append(data[pos:pos + take] if take != end or pos else data)
                pos += take
                self._left -= take
                if not self._left:
                    self._crlf = 2
            elif self._crlf:
                take = min(self._crlf, end - pos)
                if data[pos:pos + take] != b"\r\n"[2 - self._crlf:2 - self._crlf + take]:
                    raise ValueError("no CRLF after a chunk's data")
                pos += take
                self._crlf -= take
            else:
                newline = data.find(b"\n", pos)
                if newline < 0:
                    self._line += data[pos:]
                    if len(self._line) > 4096:
                        raise ValueError("a chunk-size line is over 4096 bytes")
                    break
                line, self._line = self._line + data[pos:newline], b""
                pos = newline + 1
                if self._trailer:
                    if not line.strip():
                        self._framing = "done"
                        if pos < end:
                            self.keep_alive = False  # bytes after the answer: the connection is not reused
                        break
                    continue
                size = int(line.split(b";", 1)[0].strip(), 16)
                if size < 0:
                    raise ValueError("a negative chunk size")
                if size == 0:
                    self._trailer = True
                else:
                    self._left = size
        return pieces

    def _end(self) -> None:
        self._ended = True
        self._stop_timer()
        if not self.finished.done():
            self.finished.set_result(None)
        self._wake()
        self.conn.answer_done(self)

    def _fail(self, exc: BaseException) -> None:
        self._ended = True
        self._stop_timer()
        self.conn.discard()
        for future in (self.head_done, self.finished):
            if not future.done():
                future.set_exception(exc)
                future.exception()  # retrieved: whoever waits gets it; nobody waiting is no error
        self._wake()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check_idle(self) -> None:
        idle = self.loop.time() - self._last
        if idle >= self._idle:
            self._timer = None
            self._fail(asyncio.TimeoutError())
        else:
            self._timer = self.loop.call_later(self._idle - idle, self._check_idle)


# --------------------------------------------------------------------------- connections


class Connection(asyncio.Protocol):
    """One kept-alive connection to the engine; it carries one answer at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.answer: Answer | None = None
        self.idle_since = 0.0
        self.lost = False
        self.received = False
        self._fd: int | None = -1  # -1: not looked up yet

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        from engine import native_relay

        if native_relay.ACTIVE is not None:  # looked up now, not in the request that first lends it
            self.fd()

    def fd(self) -> int | None:
        """The socket's descriptor (None for TLS or none), looked up once: uvloop makes a socket
        object on the first look-up, and a kept-alive connection is lent to bakery-relay many times."""
        if self._fd == -1:
            from engine import native_relay

            self._fd = native_relay.socket_fd(self.transport)
        return self._fd if self.transport is not None and not self.transport.is_closing() else None

    def readable(self) -> bool:
        """Whether the engine sent something (or closed) while no answer was asked for: bytes after
        the last answer's end that no loop turn has read yet. Such a connection is not reused."""
        fd = self.fd()
        if fd is None:
            return False
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLPRI)
        return bool(poller.poll(0))

    def data_received(self, data: bytes) -> None:
        self.received = True
        answer = self.answer
        if answer is None:  # bytes nobody asked for: this connection cannot be trusted with a request
            self.discard()
            return
        answer.feed(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = True
        if self.answer is not None:
            self.answer.connection_lost(exc)

    def answer_done(self, answer: Answer) -> None:
        if self.answer is answer:
            self.answer = None
            if answer.keep_alive and not self.lost:
                self.pool.put(self)
            else:
                self.discard()

    def discard(self) -> None:
        self.answer = None
        self.lost = True
        if self.transport is not None:
            self.transport.close()


class Pool:
    """Kept-alive connections to one engine (host, port), newest first out; none idle longer than
    `keepalive` seconds is handed out (the engines drop theirs after 5 s)."""

    def __init__(self, host: str, port: int, connect_timeout: float, idle_timeout: float,
                 keepalive: float, first_connect_grace: float = 0.0) -> None:
        self.host, self.port = host, port
        self.connect_timeout, self.idle_timeout, self.keepalive = connect_timeout, idle_timeout, keepalive
        self.idle: list[Connection] = []
        # Until one connection to the engine was made, a refused one is tried again for this long.
        self.first_connect_grace = first_connect_grace
        self.connected_once = False
        self.last_request = float("-inf")  # the loop's time of the last post()
        self.keeper: Any = None  # engine_warm.Keeper: renews idle connections between bursts

    def put(self, conn: Connection) -> None:
        conn.idle_since = asyncio.get_running_loop().time()
        self.idle.append(conn)
        if self.keeper is not None:
            self.keeper.arm()

    def _reusable(self, now: float) -> Connection | None:
        while self.idle:
            conn = self.idle.pop()
            if not conn.lost and now - conn.idle_since < self.keepalive and not conn.readable():
                return conn
            conn.discard()
        return None

    async def connect(self) -> Connection:
        """A new connection to the engine (refusals tried again only before the first one was made)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + (0.0 if self.connected_once else self.first_connect_grace)
        while True:
            connect = loop.create_connection(lambda: Connection(self), self.host, self.port)
            try:
                _, conn = await asyncio.wait_for(connect, self.connect_timeout or None)
            except ConnectionRefusedError:
                # vLLM binds its port early and listens only after printing its load line
                # (uvicorn's "Application startup complete."), so the benchmark, the first engine
                # call, can meet a refusal. Before any connection was made it is tried again;
                # after one, a refusal means the engine is gone and reaches the caller at once.
                if loop.time() + FIRST_CONNECT_STEP > give_up:
                    raise
                await asyncio.sleep(FIRST_CONNECT_STEP)
                continue
            self.connected_once = True
            return conn

    async def post(self, path: str, body: dict[str, Any]) -> Answer:
        """POST `body` as JSON to `path`; returns once the answer's head is in."""
        await let_go.pause()  # a large request's serialisation is a step of its own, after the SDK's parse
        data = json.dumps(body).encode()
        request = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nAccept: */*\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode() + data
        loop = asyncio.get_running_loop()
        self.last_request = loop.time()
        if self.keeper is not None:
            self.keeper.request()
        conn = self._reusable(self.last_request)
        reused = conn is not None
        while True:
            if conn is None:
                conn = await self.connect()
            answer = Answer(conn, loop, self.idle_timeout)
            conn.answer, conn.received = answer, False
            assert conn.transport is not None
            conn.transport.write(request)
            try:
                await answer.head_done
                return answer
            except asyncio.CancelledError:  # the request ended before the engine answered
                answer.close()
                raise
            except EngineError:
                # A kept-alive connection the engine closed just as it was reused: once, on a new one.
                if not (reused and not conn.received):
                    raise
                conn, reused = None, False

    def close(self) -> None:
        if self.keeper is not None:
            self.keeper.stop()
        for conn in self.idle:
            conn.discard()
        self.idle.clear()


# --------------------------------------------------------------------------- the client side


async def relay(transport: Any, answer: Answer, chunked: bool) -> None:
    """Write the answer's body to the client's `transport` from the engine connection's callbacks,
    piece by piece as it arrives (chunk-framed when `chunked`; whole engine chunks as they came),
    reading the engine no faster than the client takes it; returns at the body's end."""
    if chunked and await relay_native(transport, answer) is not None:
        return
    loop = asyncio.get_running_loop()
    paused: list[bool] = [False]

    def resume_when_drained() -> None:
        if answer.ended or transport is None or transport.is_closing():
            return
        if transport.get_write_buffer_size() <= WRITE_LOW:
            paused[0] = False
            if answer.conn.transport is not None:
                answer.conn.transport.resume_reading()
        else:
            loop.call_later(PAUSE_POLL, resume_when_drained)

    def send(data: bytes) -> None:
        if transport is None or transport.is_closing():
            answer.close()  # the client is gone: the engine stops (the task is cancelled too)
            return
        transport.write(data)
        if not paused[0] and transport.get_write_buffer_size() > WRITE_HIGH:
            paused[0] = True
            if answer.conn.transport is not None:
                answer.conn.transport.pause_reading()
            loop.call_later(PAUSE_POLL, resume_when_drained)

    def sink(pieces: list[bytes]) -> None:
        if chunked:
            frames = []
            for piece in pieces:
                frames += (b"%x\r\n" % len(piece), piece, b"\r\n")
            send(b"".join(frames))
        else:
            send(b"".join(pieces))

    # Both sides chunked: the engine's whole chunks are written as they came, not decoded and framed again.
    answer.attach(sink, send if chunked else None)
    try:
        await answer.finished
    finally:
        answer.detach()


async def relay_native(transport: Any, answer: Answer, head: bytes = b"",
                        head_went: Callable[[], None] | None = None, client_fd: int | None = None) -> int | None:
    """The rest of the body through bakery-relay (native_relay.py) when it can take it, with the
    answer's `head` when the client has not had it (the helper writes it with the first body bytes;
    `head_went` is called once it did); None when not handed (then the caller writes and relays it),
    else the body bytes it moved. Returns at the body's end, raising as relay() would. `client_fd` is
    the client socket's descriptor when the caller looked it up already (native_relay.socket_fd)."""
    from engine import native_relay

    helper = native_relay.ACTIVE
    if helper is None or helper.dead:
        return None
    engine_fd = answer.lendable()
    if client_fd is None or transport.is_closing():
        client_fd = native_relay.socket_fd(transport)
    if engine_fd is None or client_fd is None or transport.get_write_buffer_size():
        return None
    handed = helper.start(client_fd, engine_fd, answer.idle_timeout, head)
    if handed is None:
        return None
    ident, outcome = handed
    answer.lend()
    try:
        result, flags, moved = await outcome
    except asyncio.CancelledError:  # the request ended first (the client went away): no more writes
        helper.abort(ident)
        answer.close()
        raise
    if flags & native_relay.HEAD_WRITTEN and head_went is not None:
        head_went()
    answer.take_back(result)
    await answer.finished
    return moved


async def stream_answer(web: Any, request: Any, answer: Answer) -> Any:
    """Send a streamed engine answer to the client, event by event, as the SDK's default does (the
    engine's status and content type, the body as it comes), written from the engine's callbacks.

    Nothing is written before the body's first piece is in, so an answer that fails before any body
    byte is answered 500 whole; one that fails after its head went is cut by closing the connection.
    Both as the wire front does: aiohttp.web would write the handler's 500 into the stream as a
    second response (the SDK's default prepares first and has that fault)."""
    await answer.wait_data()
    pieces = answer.take_pending()
    res = web.StreamResponse(status=answer.status)
    if answer.content_type:
        res.content_type = answer.content_type
    await res.prepare(request)
    if not pieces:  # an empty body
        await res.write_eof()
        return res
    try:
        await res.write(b"".join(pieces))
        chunked = res.headers.get("Transfer-Encoding", "").lower() == "chunked"
        await relay(request.transport, answer, chunked)
    except Exception:
        if request.transport is not None:
            request.transport.close()
        raise
    await res.write_eof()
    return res


async def respond(web: Any, request: Any, answer: Any) -> Any:
    """The routes' response generator: an answer of this module's client is streamed as above; any
    other (aiohttp's, for multipart requests) is answered exactly as vastai 1.9.1's default does."""
    content_type = answer.content_type or ""
    if isinstance(answer, Answer):
        if is_stream(content_type, answer.headers):
            return await stream_answer(web, request, answer)
    elif is_stream(content_type, answer.headers):
        res = web.StreamResponse(status=answer.status)
        if content_type:
            res.content_type = content_type
        await res.prepare(request)
        async for chunk in answer.content.iter_any():
            if chunk:
                await res.write(chunk)
        await res.write_eof()
        return res
    body = await answer.read()
    headers = answer.headers.copy()
    headers.pop("Content-Type", None)
    return web.Response(body=body, status=answer.status, content_type=content_type or None, headers=headers)


# --------------------------------------------------------------------------- installing


def engine_address(url: str) -> tuple[str, int] | None:
    """(host, port) of a plain-HTTP engine URL; None for anything this client does not speak (https)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/") or parts.query:
        return None
    return parts.hostname, parts.port or 80


FIRST_CONNECT_GRACE = 5.0  # seconds a refused first engine connection is tried again (Pool.connect)
FIRST_CONNECT_STEP = 0.05


def form_data(fields: dict[str, Any]) -> Any:
    """The multipart body of an upload's fields (config/uploads.py makes them): a file part is a tuple
    (filename, bytes, content type), a list one part per item, a dict or list value JSON, a bool
    true/false, anything else its str(); None is left out."""
    import aiohttp

    form = aiohttp.FormData(default_to_multipart=True)
    for name, value in fields.items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, tuple):
                filename, content, content_type = item
                form.add_field(name, content, filename=filename, content_type=content_type)
            elif isinstance(item, (bytes, bytearray)):
                raise TypeError(f"multipart field {name!r}: bytes go in a file part (filename, bytes, content type)")
            elif item is not None:
                text = (json.dumps(item) if isinstance(item, (dict, list))
                        else ("true" if item else "false") if isinstance(item, bool) else str(item))
                form.add_field(name, text)
    return form


def install(engine_url: str, session: Callable[[], Any], log: Any, connect_timeout: float, idle_timeout: float,
            keepalive: float, keep_warm: float = 0.0) -> tuple[Pool | None, Callable[..., Any]]:
    """The innermost layer of the engine call, bakery's own: a JSON request goes through this module's
    client (its idle engine connections renewed for `keep_warm` seconds after a request, engine_warm.py;
    0: never), a multipart one, or any to an engine URL that is not plain HTTP, through the engine session
    (`session()`, aiohttp's: the limits guard's). `log` is the logger of the SDK's per-request lines, which
    BAKERY_LOG_REQUESTS keeps or drops with the SDK's other ones (app/output.quiet_requests). Returns (the
    pool or None, the call)."""
    address = engine_address(engine_url)
    pool = None
    if address is not None:
        pool = Pool(address[0], address[1], connect_timeout, idle_timeout, keepalive, FIRST_CONNECT_GRACE)
        if keep_warm > 0:
            from engine import engine_warm

            pool.keeper = engine_warm.Keeper(pool, keep_warm)
    async def call_engine(handler: Any, payload: Any) -> Any:
        quiet = getattr(log.debug, "drops_request_lines", False)  # else formatted only to be dropped
        fields = payload.generate_payload_multipart()
        if fields is not None:
            if not quiet:
                log.debug(f"posting multipart to endpoint: '{handler.endpoint}', fields: {list(fields)}")
            return await session().post(url=handler.endpoint, data=form_data(fields))
        body = payload.generate_payload_json()
        if not quiet:
            log.debug(f"posting to endpoint: '{handler.endpoint}', payload keys: "
                      f"{list(body) if isinstance(body, dict) else type(body).__name__}")
        if pool is not None:
            return await pool.post(handler.endpoint, body)
        return await session().post(url=handler.endpoint, json=body)

    return pool, request_path.layer("forward", call_engine, None)
