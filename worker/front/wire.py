"""The wire front: port 3000's plain signed requests served below aiohttp.web, skipping its per-request cost.

A request it recognises whole (a strict head, a route's POST, the body in hand, a pair the signature memo
accepted, the model loaded, no drain) goes through own_handler's steps, answered as aiohttp.web would. The
rest goes to aiohttp's protocol with its bytes as they came: refusals stay the guards'. See docs/serving.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, cast

from engine import forward, native_relay
from policy import rules

HEAD_MAX = 8 * 1024  # a head longer than this goes to aiohttp (which has its own limits)
BODY_MAX = 64 * 1024  # a larger body goes to aiohttp (its reads let the loop go between steps)
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_LENGTH = re.compile(rb"[0-9]{1,9}\Z")
_REFUSED_HEADERS = frozenset((b"transfer-encoding", b"expect", b"upgrade", b"content-encoding"))
JSON_TYPES = (b"application/json",)
REASONS = {status.value: status.phrase for status in HTTPStatus}
log = logging.getLogger("bakery.wire")


def parse_head(head: bytes) -> tuple[bytes, bytes, dict[bytes, bytes]] | None:
    """(method, target, headers by lower-cased name) of an HTTP/1.1 request head (without its blank
    line), or None for anything this front does not serve: another version, a repeated header,
    obsolete line folding, a name that is not a token, a control character in a value."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[2] != b"HTTP/1.1":
        return None
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.match(name) or _CONTROL.search(value):
            return None
        key = name.lower()
        if key in headers:
            return None
        headers[key] = value.strip(b" \t")
    return parts[0], parts[1], headers


class _Request:
    """What the access logger reads of a request served here. Its headers are decoded only when a
    line is written (the quiet logger skips a model request answered 2xx before reading any)."""

    __slots__ = ("_headers", "_raw", "body", "method", "path", "path_qs", "remote", "version")

    def __init__(self, method: str, path: str, raw: dict[bytes, bytes], body: bytes, remote: str | None) -> None:
        self.method, self.path, self.path_qs, self._raw, self.body, self.remote = (
            method, path, path, raw, body, remote)
        self._headers: dict[str, str] | None = None
        self.version = _HTTP11

    @property
    def headers(self) -> dict[str, str]:
        if self._headers is None:
            self._headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in self._raw.items()}
        return self._headers



class _Version:
    major, minor = 1, 1


_HTTP11 = _Version()


class _Written:
    """What the access logger reads of an answer written here."""

    __slots__ = ("body_length", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body_length: int) -> None:
        self.status, self.headers, self.body_length = status, headers, body_length


@dataclass
class Front:
    """The wire front's shared parts (see the module's docstring); `connection(inner)` makes the
    protocol of one admitted connection, `inner` being aiohttp's factory for it."""

    routes: dict[str, Any]  # path -> its own_handler.Route
    serve: Callable[..., Any]  # own_handler's steps after the parse
    loaded: Callable[[], bool]
    drain: Any  # drain.Drain
    signed: Callable[[dict[str, Any]], bool]  # the memo knows (or learns) the pair, or UNSECURED
    budget: Any  # admission.Budget
    connections: Any  # admission.Connections
    header_timeout: float
    access_logger: Any  # aiohttp's access logger class, as the runner's
    server_name: str
    served: int = 0
    handed: int = 0
    fleet: Any = None  # processes.Fleet: the front processes connections are given to, when any
    inner: Callable[[], asyncio.BaseProtocol] | None = None  # aiohttp's factory (for a connection given back)
    adopting: set[asyncio.Task[None]] = field(default_factory=set)  # connections given back, being made
    handlers: dict[bytes, tuple[str, Any]] = field(init=False)
    signed_first: Any = field(init=False)
    _date: tuple[int, str] = (-1, "")

    def __post_init__(self) -> None:
        from policy import signed_first  # msgspec: the worker venv's (parse_head needs none)

        self.handlers = {path.encode("ascii"): (path, handler) for path, handler in self.routes.items()}
        self.signed_first = signed_first

    def date(self) -> str:
        """The Date header's value, made once a second."""
        now = int(time.time())
        if now != self._date[0]:
            self._date = (now, formatdate(now, usegmt=True))
        return self._date[1]

    def describe(self) -> str:
        """What the front did so far (said when the drain begins)."""
        return (f"bakery-worker: wire front: {self.served} request(s) served below aiohttp.web, "
                f"{self.handed} connection(s) handed to it")

    def connection(self, inner: Callable[[], asyncio.BaseProtocol]) -> asyncio.BaseProtocol:
        self.connections.fronted += 1
        self.inner = inner
        member = self.fleet.pick() if self.fleet is not None else None
        if member is not None:
            return Delegate(self, inner, member)
        return Connection(self, inner)

    def released(self) -> None:
        """A connection given to a front process is closed (or came back): out of the cap's count."""
        self.connections.fronted -= 1

    def take_back(self, sock: Any, data: bytes) -> None:
        """A connection a front process gives back, with the bytes it read of it: this front reads
        them first, as if it had read them itself."""
        inner = self.inner
        if inner is None:
            sock.close()
            return
        self.adopt(sock, lambda: Connection(self, inner, data))

    def adopt(self, sock: Any, protocol: Callable[[], Connection], failed: Callable[[], None] = lambda: None) -> None:
        """Serve the connected socket `sock` with `protocol()`, counted in the cap from here; `failed()`
        when the client went away before it could be (front/processes.py: connections given and given back)."""
        self.connections.fronted += 1
        made: list[Connection] = []

        def make() -> Connection:
            made.append(protocol())
            return made[0]

        async def connect() -> None:
            try:
                await asyncio.get_running_loop().connect_accepted_socket(make, sock)
            except Exception:  # noqa: BLE001 - the client went away meanwhile
                if not made:
                    self.connections.fronted -= 1
                    failed()
                sock.close()

        task = asyncio.get_running_loop().create_task(connect())
        self.adopting.add(task)  # held until done (the loop keeps only weak references to tasks)
        task.add_done_callback(self.adopting.discard)


class Connection(asyncio.Protocol):
    """One client connection: requests served here while they are plain, then aiohttp's for good."""

    def __init__(self, owner: Front, inner: Callable[[], asyncio.BaseProtocol], prefix: bytes = b"") -> None:
        self.owner = owner
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.buffer = prefix  # bytes read by a front process before it gave the connection back
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.counted = True  # in Connections.fronted until handed to aiohttp or lost
        self.peer: str | None = None  # the client's address
        self.fd: int | None = None  # the client socket's descriptor, when bakery-relay may take its streams
        self.head_sent = False  # of the request being served

    # -- asyncio's calls

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass
        # Facts of the connection, looked up as it opens rather than in its first request (a burst's
        # requests come on connections opened before it).
        self.peer = _peer(self.transport)
        self.fd = native_relay.socket_fd(self.transport) if native_relay.ACTIVE is not None else None
        self.owner.connections.live.add(self)  # the send bound looks at it (admission.SendWatch)
        self._arm()
        if self.buffer:
            self._next()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.task is None:
            self._next()
        elif len(self.buffer) > HEAD_MAX + BODY_MAX and self.transport is not None:
            self.transport.pause_reading()  # a pipelining client waits for the answer in hand

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._uncount()
        self.owner.connections.live.discard(self)
        self.transport = None
        if self.task is not None:
            self.task.cancel()  # the request's task: the client went away (the SDK's 499)

    # -- this front's own

    def _arm(self) -> None:
        """Close the connection if no whole request is in by the header timeout (as aiohttp does)."""
        self._disarm()
        if self.owner.header_timeout and self.transport is not None:
            self.timer = asyncio.get_running_loop().call_later(self.owner.header_timeout, self._idle)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _idle(self) -> None:
        self.timer = None
        if self.task is None and self.transport is not None:
            self.transport.close()

    def _uncount(self) -> None:
        if self.counted:
            self.counted = False
            self.owner.connections.fronted -= 1

    def hand_off(self) -> None:
        """Make this connection aiohttp's, fed every byte not answered here."""
        self._disarm()
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self.owner.handed += 1
        protocol = self.inner()
        transport.set_protocol(protocol)
        self._uncount()  # aiohttp counts it from its connection_made, just below
        self.owner.connections.live.discard(self)  # and the send bound finds it there
        self.transport = None
        protocol.connection_made(transport)
        data, self.buffer = self.buffer, b""
        if data:
            transport.resume_reading()
            cast(asyncio.Protocol, protocol).data_received(data)

    def _next(self) -> None:
        """Serve the request at the buffer's start if it is whole and plain; else hand off."""
        buffer = self.buffer
        if not buffer:
            return
        end = buffer.find(b"\r\n\r\n", 0, HEAD_MAX)
        parsed = parse_head(buffer[:end]) if end > 0 else None
        if parsed is None:
            self.hand_off()
            return
        method, target, headers = parsed
        route = self.owner.handlers.get(target)
        length = headers.get(b"content-length")
        if (route is None or method != b"POST" or length is None or not _LENGTH.match(length)
                or not _REFUSED_HEADERS.isdisjoint(headers)):
            self.hand_off()
            return
        size = int(length)
        ctype = headers.get(b"content-type", b"application/json").partition(b";")
        charset = ctype[2].strip().lower()
        if (size > BODY_MAX or len(buffer) < end + 4 + size or ctype[0].strip().lower() not in JSON_TYPES
                or charset not in (b"", b"charset=utf-8")):
            self.hand_off()
            return
        close = headers.get(b"connection", b"").lower() == b"close"
        body = buffer[end + 4:end + 4 + size]
        owner = self.owner
        if owner.drain.draining or not owner.loaded() or not owner.budget.take(size):
            self.hand_off()
            return
        parsed_body = self._parse(route[1], body)
        if parsed_body is None:
            owner.budget.release(size)
            self.hand_off()
            return
        self._disarm()
        self.buffer = buffer[end + 4 + size:]
        request = _Request("POST", route[0], headers, body, self.peer)
        self.task = asyncio.get_running_loop().create_task(self._serve(route[1], request, parsed_body, size, close))

    def _parse(self, handler: Any, body: bytes) -> tuple[Any, Any] | None:
        """(auth_data, payload) as the route's parse makes them, for an envelope this front serves: signed
        as the memo knows, nothing the guards refuse, no session; else None
        (aiohttp's path answers it, refusals included)."""
        first = self.owner.signed_first
        found = first.read(body, None)
        if (found.problem is not None or not found.checkable or found.auth is None
                or not self.owner.signed(found.auth) or first.utf8_error(body) or rules.depth_error(body)
                or first.long_integer(body)):
            return None
        try:
            auth_data, payload, session_id = handler.parse(json.loads(body))
        except Exception:  # noqa: BLE001 - every refusal of the parse is aiohttp's path's to answer
            return None
        return None if session_id is not None else (auth_data, payload)

    async def _serve(self, handler: Any, request: _Request, parsed: tuple[Any, Any], size: int, close: bool) -> None:
        owner, transport = self.owner, self.transport
        started = time.monotonic()
        owner.drain.enter()
        owner.served += 1
        outcome: dict[str, str] = {}
        token = rules.OUTCOME.set(outcome)  # an engine timeout is recorded here: its 500 is a 504
        written: _Written | None = None
        try:
            written = await self._answer(handler, parsed, outcome, close)
        except asyncio.CancelledError:
            pass  # the client went away: own_handler reported it; nothing to write
        except Exception:
            log.exception("the wire front failed to serve a request; its connection is closed")
            if self.transport is not None:
                self.transport.close()
        finally:
            rules.OUTCOME.reset(token)
            owner.budget.release(size)
            owner.drain.leave(transport)
            self.task = None
        logger = owner.access_logger
        if written is not None and logger is not None and logger.enabled:
            logger.log(request, written, time.monotonic() - started)
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if close or owner.drain.draining:
            transport.close()
            return
        self._arm()
        transport.resume_reading()
        self._next()

    async def _answer(self, handler: Any, parsed: tuple[Any, Any], outcome: dict[str, str],
                      close: bool) -> _Written | None:
        auth_data, payload = parsed
        written: list[_Written] = []

        async def respond(answer: Any) -> None:
            written.append(await self._respond(answer, close))

        self.head_sent = False
        status = await self.owner.serve(handler, auth_data, payload, respond, lambda code: code)
        if written:
            return written[0]
        if self.head_sent:  # the answer broke after its head went: only closing tells the client
            if self.transport is not None:
                self.transport.close()
            return None
        if status == 500 and "timeout" in outcome:
            return self._error(504, rules.engine_timeout(outcome), close)
        return self._error(status, rules.BARE.get(status, REASONS.get(status, "error")), close)

    # -- writing an answer as aiohttp.web writes it

    def _head(self, status: int, headers: list[tuple[str, str]], close: bool) -> tuple[bytes, dict[str, str]]:
        names = {name.lower() for name, _ in headers}
        if "date" not in names:
            headers.append(("Date", self.owner.date()))
        if "server" not in names:
            headers.append(("Server", self.owner.server_name))
        if close or self.owner.drain.draining:
            headers.append(("Connection", "close"))
        text = f"HTTP/1.1 {status} {REASONS.get(status, '')}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers)
        return (text + "\r\n").encode("latin-1"), dict(headers)

    def _error(self, status: int, message: str, close: bool) -> _Written:
        body = json.dumps({"error": message}).encode()
        head, headers = self._head(status, [("Content-Type", "application/json; charset=utf-8"),
                                            ("Content-Length", str(len(body)))], close)
        self._write(head + body)
        return _Written(status, headers, len(body))

    def _head_went(self) -> None:
        self.head_sent = True

    def _write(self, data: bytes) -> None:
        self.head_sent = True
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    async def _respond(self, answer: Any, close: bool) -> _Written:
        """The engine's answer to the client, as forward.respond has aiohttp.web write it."""
        content_type = answer.content_type or ""
        if not forward.is_stream(content_type, answer.headers):
            body = await answer.read()
            extra = [(k, v) for k, v in answer.headers.items()
                     if k.lower() not in ("content-type", "content-length", "transfer-encoding", "connection")]
            headers = [("Content-Type", content_type or "application/octet-stream"), *extra,
                       ("Content-Length", str(len(body)))]
            head, sent = self._head(answer.status, headers, close)
            self._write(head + body)
            return _Written(answer.status, sent, len(body))
        headers = [("Content-Type", content_type)] if content_type else []
        head, sent = self._head(answer.status, [*headers, ("Transfer-Encoding", "chunked")], close)
        length = 0
        if isinstance(answer, forward.Answer):
            pieces = answer.take_pending()  # what came with the head
            if not pieces and not answer.ended and self.transport is not None:
                # bakery-relay, when it takes the body, writes the head with its first bytes: at a
                # burst the first token then waits for no turn of this loop (native_relay.py).
                moved = await forward.relay_native(self.transport, answer, head, self._head_went, self.fd)
                if moved is not None:
                    self._write(b"0\r\n\r\n")
                    return _Written(answer.status, sent, moved)
            if not pieces:
                await answer.wait_data()
                pieces = answer.take_pending()
            length = sum(len(piece) for piece in pieces)
            self._write(head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p))
            if pieces and self.transport is not None:
                await forward.relay(self.transport, answer, chunked=True)
        else:  # aiohttp's client (a multipart request): as the SDK's default streams it
            self._write(head)
            async for chunk in answer.content.iter_any():
                if chunk:
                    length += len(chunk)
                    self._write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self._write(b"0\r\n\r\n")
        return _Written(answer.status, sent, length)


class Delegate(asyncio.Protocol):
    """A connection given to a front process (front/processes.py) as it opens: its descriptor goes to the
    process at the end of the loop turn, with any bytes read meanwhile, and this one's is closed. It
    stays in the cap's count until the process says it closed."""

    def __init__(self, owner: Front, inner: Callable[[], asyncio.BaseProtocol], member: Any) -> None:
        self.owner, self.inner, self.member = owner, inner, member
        self.transport: asyncio.Transport | None = None
        self.fd = -1
        self.data = b""
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = stream = cast(asyncio.Transport, transport)
        fd = native_relay.socket_fd(stream)
        if fd is None:
            self.keep()
            return
        stream.pause_reading()
        self.fd = fd
        self.owner.fleet.give(self.member, self)

    def data_received(self, data: bytes) -> None:
        self.data += data  # read before it went: goes with it

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True

    def sent(self) -> None:
        """The process holds its own descriptor of the socket: close this one (nothing is sent or shut)."""
        if self.transport is not None:
            self.transport.close()

    def keep(self) -> None:
        """The link failed: the connection is served here after all."""
        stream = self.transport
        if stream is None:
            return
        kept = Connection(self.owner, self.inner, self.data)
        stream.set_protocol(kept)
        kept.connection_made(stream)
        stream.resume_reading()


def _peer(transport: asyncio.Transport | None) -> str | None:
    peer = transport.get_extra_info("peername") if transport is not None else None
    return peer[0] if isinstance(peer, (tuple, list)) and peer else None


def install(ctx: Any, handlers: dict[str, Any], serve: Callable[..., Any], knows: Callable[[str, str], bool],
            header_timeout: float, loaded: Callable[[], bool]) -> Front | None:
    """Put the front on WORKER_PORT's connections (through admission's factory); None when the limits
    guard (admission) or the drain is not installed: then every request stays aiohttp's."""
    if ctx.admission is None or ctx.drain is None:
        return None
    from aiohttp.http import SERVER_SOFTWARE
    from aiohttp.log import access_logger
    from aiohttp.web_log import AccessLogger

    budget, connections = ctx.admission
    logger_class = ctx.runner_kwargs.get("access_log_class", AccessLogger)

    from policy import guards, signature_memo

    # A pair the memo does not know is checked here only while it knows none (signature_memo.first_pairs).
    known = signature_memo.first_pairs(ctx.platform.pubkey, knows, guards.signature_check(ctx, "wire"))

    unsecured = ctx.platform.unsecured

    def signed(auth: dict[str, Any]) -> bool:
        return unsecured or known(auth)

    owner = Front(routes=handlers, serve=serve, loaded=loaded, drain=ctx.drain, signed=signed, budget=budget,
                  connections=connections, header_timeout=header_timeout,
                  access_logger=logger_class(access_logger, AccessLogger.LOG_FORMAT), server_name=SERVER_SOFTWARE)
    connections.front = owner.connection
    ctx.drain.notes.append(owner.describe)
    return owner
