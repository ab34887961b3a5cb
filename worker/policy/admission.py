"""Admission at port 3000: global bounds on what all requests together may hold, and no compressed bodies.

Part of the `limits` guard: a bound on body bytes buffered at once, a connection cap answered at accept time
(503 + Retry-After), a send bound on clients that take no bytes, and 415 for any Content-Encoding (no
decompressor on the loop). An admitted request is never refused later. Stdlib only. See docs/security.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import resource
import socket
import struct
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from config import request_path, table
from control import sdk_seam
from policy import drain, rules

BYTES_VAR = "BAKERY_MAX_BUFFERED_BYTES"
CONNECTIONS_VAR = "BAKERY_MAX_CONNECTIONS"
READY_VAR = "BAKERY_ENGINE_READY_CONNECTIONS"  # engine_warm.py: engine connections opened at load
BODY_VAR = "BAKERY_MAX_BODY_BYTES"
SEND_VAR = "BAKERY_SEND_TIMEOUT"
SWEEP = 1.0  # seconds between the send bound's looks at every connection, at most
TCP_INFO_LEN = 152  # struct tcp_info up to tcpi_notsent_bytes (Linux 4.6)
# (field, offset) in struct tcp_info: tcpi_unacked (segments), tcpi_bytes_acked, tcpi_notsent_bytes.
_TCP_INFO = ((struct.Struct("<I"), 24), (struct.Struct("<Q"), 120), (struct.Struct("<I"), 144))
_LINGER_RESET = struct.pack("ii", 1, 0)
# A refused connection waits this long for the client to read the answer and close (a reset could
# lose the answer at the client), and is dropped once it sent this much more.
LINGER_SECONDS = 2.0
LINGER_BYTES = 64 * 1024
# Refused connections lingering at once: each holds a file descriptor, and a flood of them must not
# use up the descriptors admitted requests need for their engine connections.
MAX_LINGERING = 128
# Descriptors beyond the connections: engine connections come from the count of admitted requests
# (one each), these are the rest (logs, the report client, the listeners, the engine's pool headroom).
SPARE_FDS = 64
# The listen backlog of WORKER_PORT: connections whose handshake completed and that wait for
# accept(). aiohttp's default, 128, overflowed at a burst of 1024 streams (441 dropped handshakes,
# each client waiting ~1 s for the kernel's retry); a refusal by the cap must be as quick as an
# admission, so the backlog is not the cap but at least this. The kernel caps it at
# net.core.somaxconn (SOMAXCONN_FILE), which a container cannot raise from inside.
MIN_BACKLOG = 1024
SOMAXCONN_FILE = "/proc/sys/net/core/somaxconn"

log = logging.getLogger("bakery.admission")


def now_and_then(count: int) -> bool:
    """guards.now_and_then (the 1st, 10th, 100th ... refusal is logged): imported late, since guards
    imports this module."""
    from policy.guards import now_and_then as rule

    return rule(count)


class Overbudget(Exception):
    """A chunked body grew beyond what the byte bound has left: the request is refused with 503."""


class Budget:
    """The request body bytes all requests hold at once, against `limit` (with front processes, the
    bytes every process holds: `share`)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.refused = 0
        self.slots: Any = None  # processes.Slots: each process's bytes held, this one's in `slot`
        self.slot = 0

    def share(self, slots: Any, slot: int) -> None:
        """Count the bytes other processes hold (their slots of `slots`), and publish ours in `slot`."""
        self.slots, self.slot = slots, slot
        slots.view[slot] = self.held

    def _fits(self, size: int) -> bool:
        held = self.held + size
        return held <= self.limit if self.slots is None else held + self.slots.others(self.slot) <= self.limit

    def _set(self, held: int) -> None:
        self.held = held
        if self.slots is not None:
            self.slots.view[self.slot] = held

    def reserve(self, size: int) -> bool:
        """Take `size` bytes if they fit (then True); else count a refusal and take nothing."""
        if not self._fits(size):
            self.refused += 1
            return False
        self._set(self.held + size)
        return True

    def take(self, size: int) -> bool:
        """reserve() for a request that goes elsewhere when it does not fit: no refusal counted."""
        if not self._fits(size):
            return False
        self._set(self.held + size)
        return True

    def release(self, size: int) -> None:
        """Give back `size` bytes taken by reserve()."""
        self._set(self.held - size)


class Ticket:
    """What one request has reserved so far."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held = 0


def encoding_error(codings: list[str]) -> str | None:
    """Why a request with these Content-Encoding header values is refused, or None (no header, or
    only `identity`). Stacked codings ("gzip, br"), repeated headers and any case are all seen."""
    named = [c.strip().lower() for value in codings for c in value.split(",") if c.strip()]
    if all(c == "identity" for c in named):
        return None
    shown = ", ".join(named)[:60]
    return (f"Content-Encoding {shown!r} is not accepted on requests: send the JSON body uncompressed "
            "(no Content-Encoding header)")


def reserving_read(request: Any, budget: Budget, ticket: Ticket, max_body: int,
                   web: Any) -> Callable[[], Awaitable[bytes]]:
    """A `read()` for a chunked request: each chunk is reserved on `ticket` before it is kept (else
    Overbudget), and a body over `max_body` is 413 as aiohttp's own read makes it."""
    cached: list[bytes] = []

    async def read() -> bytes:
        if cached:
            return cached[0]
        parts: list[bytes] = []
        size = 0
        while True:
            chunk = await request.content.readany()
            if not chunk:
                break
            size += len(chunk)
            if size > max_body:
                raise web.HTTPRequestEntityTooLarge(max_size=max_body, actual_size=size)
            if size > ticket.held:  # a read begun again after a timeout reserves nothing twice
                if not budget.reserve(size - ticket.held):
                    raise Overbudget
                ticket.held = size
            parts.append(chunk)
        cached.append(b"".join(parts))
        return cached[0]

    return read


class Connections:
    """The connection cap: hands each listener a protocol factory that answers a connection beyond
    `cap` (counted over every capped listener) with `answer` instead of serving it."""

    def __init__(self, cap: int, retry_after: int) -> None:
        self.cap = cap
        self.servers: list[Any] = []  # aiohttp's web.Server of each capped listener
        # The wire front (wire.py), when on: it makes each admitted connection's protocol from
        # aiohttp's factory, and counts in `fronted` the connections it holds before aiohttp does.
        self.front: Callable[[Callable[[], asyncio.BaseProtocol]], asyncio.BaseProtocol] | None = None
        self.live: set[Any] = set()  # the wire front's connections (anything with a `transport`)
        self.watch: SendWatch | None = None
        self.fronted = 0
        self.starting = 0
        self.lingering = 0
        self.refused = 0
        text = json.dumps({"error": f"the worker has {cap} connections open, its limit ({CONNECTIONS_VAR}); "
                                    "retry later or on another worker"}).encode()
        self.answer = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json; charset=utf-8\r\n"
                       f"Content-Length: {len(text)}\r\nRetry-After: {retry_after}\r\nConnection: close\r\n"
                       "\r\n").encode("ascii") + text

    def open(self) -> int:
        """Connections open now on the capped listeners (aiohttp's own count: until a handler ends)."""
        return sum(len(server.connections) for server in self.servers) + self.fronted

    def transports(self) -> Iterator[Any]:
        """Every client connection's transport in this process: aiohttp's and the wire front's."""
        for server in self.servers:
            for handler in server.connections:
                yield handler.transport
        for conn in self.live:
            yield conn.transport

    def factory(self, server: Any) -> Callable[[], asyncio.BaseProtocol]:
        """The protocol factory for a listener whose aiohttp factory is `server`."""
        self.servers.append(server)

        def make() -> asyncio.BaseProtocol:
            if self.open() + self.starting >= self.cap:
                return Refusal(self)
            # aiohttp counts a connection from its connection_made, which asyncio calls a loop turn
            # after this (and a burst of connections accepted at once is made before any of them):
            # counted here until then, two turns (plain TCP; see docs/security.md for TLS).
            if self.front is not None:
                return self.front(server)  # counted in `fronted` from here
            self.starting += 1
            loop = asyncio.get_running_loop()
            loop.call_soon(loop.call_soon, self.started)
            return server()

        return make

    def started(self) -> None:
        """A connection made by the factory is now in aiohttp's own count."""
        self.starting -= 1


class Refusal(asyncio.Protocol):
    """A connection over the cap: the 503 at once, then a short bounded linger, then closed."""

    def __init__(self, owner: Connections) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.discarded = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        owner = self.owner
        owner.refused += 1
        owner.lingering += 1
        if now_and_then(owner.refused):
            log.warning("refused %d connection(s) beyond %s=%d (503)", owner.refused, CONNECTIONS_VAR, owner.cap)
        # A stream transport (asyncio's, or uvloop's, which is not an asyncio.Transport subclass).
        stream = self.transport = cast(asyncio.Transport, transport)
        stream.write(owner.answer)
        if owner.lingering > MAX_LINGERING or not stream.can_write_eof():
            stream.close()
            return
        try:
            stream.write_eof()
        except OSError:  # the client is gone already
            stream.abort()
            return
        self.timer = asyncio.get_running_loop().call_later(LINGER_SECONDS, stream.abort)

    def data_received(self, data: bytes) -> None:
        self.discarded += len(data)
        if self.discarded > LINGER_BYTES and self.transport is not None:
            self.transport.abort()

    def eof_received(self) -> bool:
        return False  # the client is done: close

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.lingering -= 1
        if self.timer is not None:
            self.timer.cancel()


class SendWatch:
    """The send bound: every SWEEP seconds (at most; a quarter of the bound when it is shorter), each
    connection with bytes on their way to its client (this process's write buffer, or the kernel's
    send queue: TCP_INFO's unacknowledged and not-sent counts) is looked at; one whose client has
    acknowledged no byte (TCP_INFO's bytes_acked) for `seconds` is cut: shut down for every process
    that holds it (a front process, bakery-relay), reset, and closed here, which gives its slot back.
    Progress is the kernel's count, so a client that reads slowly is never cut. Why not the kernel's
    own TCP_USER_TIMEOUT: in the image it left a connection with a tiny receive window and a segment
    beyond it probing for good (20 s past a 5 s bound, persist timer backing off)."""

    def __init__(self, seconds: float, transports: Callable[[], Iterable[Any]]) -> None:
        self.seconds = seconds
        self.transports = transports
        self.interval = min(SWEEP, seconds / 4)
        self.waiting: dict[int, tuple[int, float]] = {}  # id(transport) -> (bytes acknowledged, since)
        self.cut = 0
        self.timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Sweep from now on (a second call does nothing)."""
        if self.timer is None and self.seconds:
            self.timer = asyncio.get_running_loop().call_later(self.interval, self.sweep)

    def sweep(self) -> None:
        """Look at every connection once; cut those past the bound."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        waiting: dict[int, tuple[int, float]] = {}
        for transport in self.transports():
            sock = transport.get_extra_info("socket") if transport is not None else None
            if sock is None or sock.fileno() < 0:
                continue
            try:
                info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN)
            except OSError:
                continue
            if len(info) < TCP_INFO_LEN:  # a kernel older than 4.6: no not-sent count
                continue
            (unacked,), (acked,), (not_sent,) = (field.unpack_from(info, at) for field, at in _TCP_INFO)
            if not (unacked or not_sent or transport.get_write_buffer_size()):
                continue
            key = id(transport)
            seen = self.waiting.get(key)
            since = seen[1] if seen is not None and seen[0] == acked else now
            if now - since >= self.seconds:
                self._cut(transport, sock.fileno())
            else:
                waiting[key] = (acked, since)
        self.waiting = waiting
        self.timer = loop.call_later(self.interval, self.sweep)

    def _cut(self, transport: Any, fd: int) -> None:
        self.cut += 1
        if now_and_then(self.cut):
            log.warning("cut %d connection(s) whose client took no byte for %g s (%s)", self.cut, self.seconds,
                        SEND_VAR)
        with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as own:
            own.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)  # the last close resets
            own.shutdown(socket.SHUT_RDWR)  # every holder's reads end and writes fail
        transport.abort()


def admission_middleware(web: Any, budget: Budget, max_body: int, retry_after: int) -> Any:
    """415 for a compressed body; 503 + Retry-After for a body the byte bound cannot take; the
    reservation released when the request ends."""
    full = f"the worker holds its limit of request bodies ({BYTES_VAR}={budget.limit} bytes); retry later"
    encoded = [0]

    def busy() -> Any:
        if now_and_then(budget.refused):  # the 1st, 10th, 100th ...: a flood is not logged line by line
            log.warning("refused %d request(s) whose body did not fit beside the %d bytes held (%s=%d): 503",
                        budget.refused, budget.held, BYTES_VAR, budget.limit)
        return drain.retry_later(web, full, retry_after)

    @web.middleware
    async def admission(request: Any, handler: Any) -> Any:
        codings = request.headers.getall("Content-Encoding", ())
        if codings:
            refused = encoding_error(codings)
            if refused:
                encoded[0] += 1
                if now_and_then(encoded[0]):
                    log.warning("refused %d request(s) with a Content-Encoding: 415", encoded[0])
                return rules.error(web, 415, refused)
        if not request.body_exists:
            return await handler(request)
        ticket = Ticket()
        try:
            length = request.content_length
            if length is None:
                sdk_seam.replace_request_read(request, reserving_read(request, budget, ticket, max_body, web))
            elif length <= max_body:  # a larger one is 413 before it is read (limits_body)
                if not budget.reserve(length):
                    return busy()
                ticket.held = length
            try:
                return await handler(request)
            except Overbudget:
                return busy()
        finally:
            budget.release(ticket.held)

    return admission


def fds_needed(max_connections: int, engine_ready: int = 0) -> int:
    """Open files the worker may need at the cap: each connection, an engine connection per admitted
    request or per one opened at load (`engine_ready`, BAKERY_ENGINE_READY_CONNECTIONS), whichever
    are more (a request takes an idle one before it opens one), the lingering refusals and the rest."""
    return max_connections + max(max_connections, engine_ready) + MAX_LINGERING + SPARE_FDS


def raise_fd_limit(max_connections: int, engine_ready: int = 0) -> str | None:
    """Raise the soft open-files limit to what the cap needs (up to the hard limit); a warning when
    even the hard limit is too low, else None."""
    need = fds_needed(max_connections, engine_ready)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft >= need:
        return None
    room = soft - max_connections - MAX_LINGERING - SPARE_FDS  # engine connections that fit beside the cap
    if engine_ready > max_connections and room >= max_connections:
        return (f"the open-files limit ({soft}) is below the {need} that {READY_VAR}={engine_ready} with "
                f"{CONNECTIONS_VAR}={max_connections} can need: lower {READY_VAR} to {room} or raise the "
                "container's nofile limit")
    also = f" (and {READY_VAR} to at most that)" if engine_ready > max_connections else ""
    return (f"the open-files limit ({soft}) is below the {need} that {CONNECTIONS_VAR}={max_connections} "
            f"can need: lower {CONNECTIONS_VAR} to {max(1, (soft - MAX_LINGERING - SPARE_FDS) // 2)}{also} or "
            "raise the container's nofile limit")


def listen_backlog(max_connections: int) -> int:
    """The listen backlog WORKER_PORT asks for: the connection cap, at least MIN_BACKLOG."""
    return max(max_connections, MIN_BACKLOG)


def backlog_warning(wanted: int, somaxconn_file: str = SOMAXCONN_FILE) -> str | None:
    """A warning when the kernel caps the listen backlog below `wanted` (net.core.somaxconn), else None."""
    try:
        cap = int(Path(somaxconn_file).read_text().strip())
    except (OSError, ValueError):
        return None  # not Linux, or not readable: nothing known to warn about
    if cap >= wanted:
        return None
    return (f"the kernel caps WORKER_PORT's listen backlog at {cap} (net.core.somaxconn), below the {wanted} "
            f"asked for: a burst of more than {cap} new connections at once waits ~1 s for the kernel's "
            f"retry; raise it with `docker run --sysctl net.core.somaxconn={wanted}`")


def reconcile(limits: Any, env: Mapping[str, str]) -> tuple[Any, list[str]]:
    """The byte bound against the body limit: (limits, error lines). Unset, it is at least two bodies
    of the body limit (one large body must not lock every other out); set below one body, no body of
    that size could ever be admitted, which is a configuration error."""
    if not table.is_set(env, BYTES_VAR):
        return replace(limits, max_buffered_bytes=max(limits.max_buffered_bytes, 2 * limits.max_body_bytes)), []
    if limits.max_buffered_bytes >= limits.max_body_bytes:
        return limits, []
    return limits, [f"{BYTES_VAR}={table.value(env, BYTES_VAR)!r} is below the body limit {BODY_VAR}="
                    f"{limits.max_body_bytes}: no body that large could be admitted; set {BYTES_VAR} to at "
                    f"least {limits.max_body_bytes} (default {table.BY_NAME[BYTES_VAR].default}) or leave it unset"]


def install(ctx: Any, web: Any) -> tuple[Budget, Connections]:
    """Add admission to the guards' Context `ctx`: the middleware at its place in the path, the connection cap and
    the listen backlog on every listener but the SDK's loopback one (ctx.http_port), and no request
    decompression."""
    limits = ctx.limits
    budget = Budget(limits.max_buffered_bytes)
    connections = Connections(limits.max_connections, limits.retry_after)
    ctx.runner_kwargs["auto_decompress"] = False
    ctx.middlewares.append(request_path.middleware(
        "admission", admission_middleware(web, budget, limits.max_body_bytes, limits.retry_after)))

    def site_runner(runner: Any, port: int | None) -> Any:
        if port == ctx.http_port:
            return runner
        return sdk_seam.FactoryRunner(runner, connections.factory)

    ctx.site_runners.append(site_runner)
    ctx.listen_backlog = listen_backlog(limits.max_connections)
    connections.watch = SendWatch(limits.send_timeout, connections.transports)

    async def start_watch(_app: Any) -> None:
        connections.watch.start()  # once: on_startup runs for each of the SDK's two apps

    ctx.on_startup.append(start_watch)
    for warning in (raise_fd_limit(limits.max_connections), backlog_warning(ctx.listen_backlog)):
        if warning:
            log.warning("%s", warning)
    return budget, connections
