"""A front process (processes.py): the wire front on connections the worker (the primary) gives it.

It builds what the worker builds, but its signature check accepts only what the primary's memo accepted, and
the outcome calls, queue estimate, loaded mark and drain are the primary's; a request it does not serve goes
back with its connection. It ignores SIGTERM and SIGINT. See docs/serving.md, "Front processes".
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import itertools
import marshal
import os
import signal
import socket
import sys
import time
import types
from typing import Any

from app import core, event_loop, output, sdk_config, worker_config
from config import request_path, table
from control import own_handler
from engine import engine_warm, native_relay
from front import processes, wire

FLUSH_POLL = 0.005  # seconds between looks at an answer's unwritten bytes before its end is said
# Events wait this long to go out together: in a burst one message carries many requests' (the
# primary then reads one message, not one per loop turn here); the reports and the drain lose nothing.
SEND_DELAY = 0.002


class Outbox:
    """Events for the primary, sent as one message per loop turn."""

    def __init__(self, link: socket.socket) -> None:
        self.link = link
        self.events: list[tuple[Any, ...]] = []
        self.loop: asyncio.AbstractEventLoop | None = None

    def event(self, event: tuple[Any, ...]) -> None:
        if not self.events and self.loop is not None:
            self.loop.call_later(SEND_DELAY, self.flush)
        self.events.append(event)

    def flush(self) -> None:
        if self.events:
            events, self.events = self.events, []
            try:
                processes.send(self.link, events)
            except OSError:
                os._exit(0)  # the primary is gone: so is every answer's report


class State:
    """What the primary last sent: the pairs it accepts, the loaded mark, the drain, the queue estimate."""

    def __init__(self, slots: processes.Slots) -> None:
        self.slots = slots
        self.generation = 0  # the key's generation the pairs were sent under
        self.pairs: frozenset[tuple[str, str]] = frozenset()
        self.unsecured = False
        self.loaded = False
        self.draining = False
        self.wait_time = 0.0

    def knows(self, url: str, signature: str) -> bool:
        """Whether the primary accepted the pair under the key loaded now (read in shared memory: a key
        change is seen here the moment the primary loads it, before its new pairs arrive)."""
        return (url, signature) in self.pairs and self.slots.generation == self.generation

    def layer(self, platform: Any, verify: Any) -> Any:
        """The signature check's layer over `verify` (core.install_parts' signature_layer): the primary's
        pairs, in the memo's place (config/request_path.py); `verify` below it is never reached."""
        unsecured = platform.unsecured

        def check_signature(auth_data: Any) -> bool:
            return unsecured or self.knows(auth_data.url, auth_data.signature)

        check_signature.knows = self.knows  # type: ignore[attr-defined]
        return request_path.layer("signature_memo", check_signature, verify)


class FrontDrain:
    """The drain as the wire front meets it here: the primary's flag; every request's entry and end
    counted in the primary's drain (its end once its answer left this process)."""

    def __init__(self, outbox: Outbox, state: State) -> None:
        self.outbox = outbox
        self.state = state
        self.notes: list[Any] = []

    @property
    def draining(self) -> bool:
        return self.state.draining

    def enter(self) -> None:
        self.outbox.event(("i",))

    def leave(self, transport: Any) -> None:
        if transport is None or transport.is_closing() or not transport.get_write_buffer_size():
            self.outbox.event(("o",))
            return
        asyncio.get_running_loop().call_later(FLUSH_POLL, self.leave, transport)


class Outcomes:
    """sdk_seam.Outcomes' interface in a front process: outcomes go to the primary (processes.Fleet reports
    them), the queue estimate and the loaded mark are the primary's last."""

    def __init__(self, outbox: Outbox, state: State) -> None:
        self.outbox = outbox
        self.state = state
        self.ids = itertools.count(1)
        self.open: dict[int, list[Any]] = {}  # id(metrics) -> [rid, kind, message]

    def new(self, request_idx: Any, reqnum: Any, workload: float, entered: float | None = None) -> Any:
        return types.SimpleNamespace(request_idx=request_idx, reqnum=reqnum, workload=workload,
                                     entered_queue_at=time.time() if entered is None else entered)

    def wait_time(self) -> float:
        return self.state.wait_time

    async def send_queued(self) -> None:
        self.outbox.flush()

    def loaded(self) -> bool:
        return self.state.loaded

    def start(self, metrics: Any) -> None:
        rid = next(self.ids)
        self.open[id(metrics)] = [rid, "", ""]
        self.outbox.event(("s", rid, metrics.request_idx, metrics.reqnum, metrics.workload,
                           metrics.entered_queue_at, time.time()))

    def _mark(self, metrics: Any, kind: str, message: str = "") -> None:
        entry = self.open.get(id(metrics))
        if entry is not None:
            entry[1], entry[2] = kind, message

    def success(self, metrics: Any) -> None:
        self._mark(metrics, "success")

    def errored(self, metrics: Any, message: str = "") -> None:
        self._mark(metrics, "errored", message)

    def canceled(self, metrics: Any) -> None:
        self._mark(metrics, "canceled")

    def end(self, metrics: Any) -> None:
        entry = self.open.pop(id(metrics), None)
        if entry is not None:
            self.outbox.event(("e", *entry))

    def reject(self, metrics: Any) -> None:
        self.outbox.event(("r", metrics.request_idx, metrics.reqnum, metrics.workload, metrics.entered_queue_at))



class Given(wire.Connection):
    """A connection the primary gave this process: its hand-off gives it back."""

    def __init__(self, owner: wire.Front, conn_id: int, outbox: Outbox, prefix: bytes = b"") -> None:
        super().__init__(owner, asyncio.Protocol, prefix)  # never called: hand_off below gives it back
        self.conn_id = conn_id
        self.outbox = outbox
        self.back = False
        self.giving = False  # decided to give it back: nothing more is served here

    def _next(self) -> None:
        if not self.giving:
            super()._next()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self.back:
            self.outbox.event(("x", self.conn_id))

    def hand_off(self) -> None:
        self.giving = True
        self._disarm()
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if transport.get_write_buffer_size():
            # The last answer is not all out: what the primary writes next would go ahead of its
            # rest. Given back once it is (a client that takes none is reset at the send bound).
            transport.pause_reading()
            asyncio.get_running_loop().call_later(FLUSH_POLL, self.hand_off)
            return
        fd = native_relay.socket_fd(transport)
        self.back = True
        self.owner.handed += 1
        self._uncount()
        self.owner.connections.live.discard(self)
        data, self.buffer = self.buffer, b""
        self.outbox.flush()  # what this connection's last request did comes first
        try:
            processes.send(self.outbox.link, ("h", self.conn_id, data), None if fd is None else [fd])
        except OSError:
            os._exit(0)
        self.transport = None
        transport.close()


def main(argv: list[str]) -> None:
    defaults = worker_config.EngineDefaults(*marshal.loads(base64.b64decode(argv[0])))  # noqa: S302 - the primary's argv
    link_fd, slots_fd, index, size, parent = (int(item) for item in argv[1:6])
    processes.die_with_parent(parent)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    link = socket.socket(fileno=link_fd)
    cfg = worker_config.load_config(defaults, table.snapshot())  # the primary's environment, checked already
    cfg = dataclasses.replace(cfg, run_dir=None)  # the ready mark is the primary's
    settings, limits = cfg.settings, cfg.limits
    sdk = sdk_config.import_sdk()
    made, _ = sdk_config.build_worker_config(settings, sdk, sdk_config.load_words(), limits.max_sessions)
    worker = sdk.Worker(made)
    handlers = sdk_config.endpoint_handlers(made)
    slots = processes.Slots(size, slots_fd)
    state = State(slots)
    outbox = Outbox(link)
    ctx = core.install_parts(worker, cfg, handlers, signature_layer=state.layer, outcomes=Outcomes(outbox, state))
    serve, _ = own_handler.install(ctx)
    if not settings.log_requests:
        ctx.runner_kwargs["access_log_class"] = output.quiet_access_log_class()
        output.quiet_requests()
    if ctx.admission is not None:
        ctx.admission[0].share(slots, index)
    primary_drain = ctx.drain
    ctx.drain = FrontDrain(outbox, state)
    served = {route: handlers[route] for route in settings.routes.routes if handlers and route in handlers}
    front = None
    if served:
        front = wire.install(ctx, served, serve, state.knows, limits.header_timeout, ctx.outcomes.loaded)
    if front is None:
        sys.stderr.write(f"bakery-worker: front process {index}: the wire front cannot run here; ending\n")
        raise SystemExit(output.EXIT_SDK)
    event_loop.install(settings.loop_choice)
    native_relay.install(settings.relay, settings.relay_program, limits.send_timeout)
    asyncio.run(serve_forever(front, state, outbox, link, ctx, primary_drain,
                              processes.ready_share(settings.engine_ready_connections, settings.front_processes)))


async def serve_forever(front: wire.Front, state: State, outbox: Outbox, link: socket.socket, ctx: Any,
                        primary_drain: Any, ready_connections: int) -> None:
    loop = asyncio.get_running_loop()
    outbox.loop = loop
    ended = loop.create_future()
    front.connections.watch.start()  # the send bound on the connections given here (no app starts here)
    warmed: list[asyncio.Task[int]] = []

    def adopt(conn_id: int, fd: int, data: bytes) -> None:
        front.adopt(socket.socket(fileno=fd), lambda: Given(front, conn_id, outbox, data),
                    lambda: outbox.event(("x", conn_id)))

    def update(new: tuple[Any, ...]) -> None:
        pairs, state.unsecured, loaded, draining, state.wait_time, state.generation = new
        state.pairs = frozenset(tuple(pair) for pair in pairs)
        state.loaded = loaded
        if draining and not state.draining:
            state.draining = True
            if primary_drain is not None:
                primary_drain.draining = True  # the engine pool's renewal stops with it
            # Every request taken so far entered the outbox; the primary reads the drain's count
            # once this arrives after them (Fleet.hold).
            outbox.flush()
            processes.send(link, ("drain seen",))
        if loaded and not warmed and ctx.pool is not None and ready_connections > 0:
            warmed.append(loop.create_task(engine_warm.open_ready(ctx.pool, ready_connections)))

    def readable() -> None:
        messages = processes.receive(link)
        if messages is None:
            if not ended.done():
                ended.set_result(None)
            return
        for message, fds in messages:
            if message[0] == "c" and len(fds) == len(message[1]):
                for conn_id, fd, data in zip(message[1], fds, message[2], strict=True):
                    adopt(conn_id, fd, data)
                continue
            if message[0] == "s":
                update(message[1])
            for fd in fds:
                os.close(fd)

    loop.add_reader(link.fileno(), readable)
    processes.send(link, ("ready",))
    await ended
    os._exit(0)  # the primary ended: nothing here may outlive it


if __name__ == "__main__":
    main(sys.argv[1:])
