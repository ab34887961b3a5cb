"""Graceful drain: on SIGTERM the worker refuses new requests and lets those in flight finish.

Within `docker stop`'s 10 s grace, later requests on the model routes get 503 + Retry-After (the listener
stays open), those in flight, streams included, run to their end within BAKERY_DRAIN_TIMEOUT, the last
outcomes reach the autoscaler, and the worker exits 0. Stdlib only at import. See docs/serving.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from config import request_path, table

DRAIN_VAR = "BAKERY_DRAIN_TIMEOUT"
# Docker's default grace is 10 s: 8 s of drain leaves 2 s to stop the engine
DEFAULT_DRAIN_SECONDS = table.BY_NAME[DRAIN_VAR].default
MAX_DRAIN_SECONDS = table.MAX_DRAIN_SECONDS
SIGNALS = (signal.SIGTERM, signal.SIGINT)
_FLUSH_POLL = 0.005
FLUSH_FLOOR = 1.0  # seconds the outcome reports get even when the requests in flight used the whole drain

log = logging.getLogger("bakery.drain")


def load(env: Mapping[str, str]) -> tuple[float, list[str]]:
    """BAKERY_DRAIN_TIMEOUT in seconds (unset or blank: the default), and one error line if it is bad.

    A number from 0 (no drain: stop at once) to 3600; text, a negative number, inf or nan is refused
    (table.VARIABLES; the entry point reads it by the same row).
    """
    errors: list[str] = []
    return table.read(env, DRAIN_VAR, errors=errors), errors


def describe(seconds: float) -> str:
    """The startup line naming the drain time."""
    return (f"bakery-worker: drain: on SIGTERM new requests get 503, requests in flight get up to "
            f"{seconds:g} s ({DRAIN_VAR})")


class Drain:
    """Counts requests in flight, refuses new ones once draining, and exits when the last one ends.

    `exit` is called with the status once the drain is over (os._exit in the worker: the SDK's loop
    has no way to stop, and nothing is left to clean up once every answer went out).
    """

    def __init__(self, seconds: float, retry_after: int, routes: tuple[str, ...],
                 exit: Callable[[int], Any] = os._exit,
                 send_outcomes: Callable[[], Awaitable[Any]] | None = None) -> None:
        self.seconds = seconds
        self.retry_after = retry_after
        self.routes = routes
        self.exit = exit
        self.send_outcomes = send_outcomes
        self.in_flight = 0
        self.draining = False
        self.refused = 0
        self._idle: asyncio.Event | None = None
        self._unflushed: weakref.WeakSet[Any] = weakref.WeakSet()
        self._task: asyncio.Task[None] | None = None
        self.notes: list[Callable[[], str]] = []  # lines said when the drain begins (the wire front's count)
        # Waited for before the count is read: a front process's requests reach it a few ms late, and
        # its answer that the drain began says every one of them is counted (processes.Fleet.hold).
        self.holds: list[Callable[[], Awaitable[None]]] = []
        self._said = False

    async def middleware(self, request: Any, handler: Any) -> Any:
        """Refuse while draining; otherwise serve and finish the answer inside the count."""
        from aiohttp import web

        if self.draining and request.path in self.routes:
            self.refused += 1
            response = retry_later(web, "the worker is shutting down; retry on another worker", self.retry_after)
            response.force_close()
            return response
        self.enter()
        transport = request.transport
        try:
            response = await handler(request)
            if self.draining:
                response.force_close()
            if transport is None or transport.is_closing():
                return response  # the client is gone (the SDK's 499): nothing to write, nobody to tell
            # aiohttp sends a plain Response only after the middleware returns: send it here, so
            # that "no request in flight" means "every answer was written".
            await response.prepare(request)
            await response.write_eof()
            return response
        finally:
            self.leave(transport)

    def enter(self) -> None:
        """A request is in flight (until leave())."""
        self.in_flight += 1

    def leave(self, transport: Any) -> None:
        """The request entered last on `transport` is over, its answer written to the transport (the
        drain waits for what the transport still holds)."""
        if transport is not None and not transport.is_closing() and transport.get_write_buffer_size():
            self._unflushed.add(transport)
        self.in_flight -= 1
        if self.in_flight == 0 and self._idle is not None:
            self._idle.set()

    def begin(self) -> None:
        """Start the drain (first signal only); a later signal changes nothing."""
        if self.draining:
            return
        self.draining = True
        self._idle = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._finish())

    async def _settle(self) -> None:
        """Wait for the holds, say what is in flight, then wait until nothing is."""
        assert self._idle is not None
        for hold in self.holds:
            await hold()
        self._begun()
        if self.in_flight == 0:
            self._idle.set()
        else:
            self._idle.clear()  # a leave() during the holds may have set it before a late entry
        await self._idle.wait()

    def _begun(self) -> None:
        """Say that the drain began (once): what is in flight, and the notes."""
        if self._said:
            return
        self._said = True
        _say(f"bakery-worker: stop signal: draining, {self.in_flight} request(s) in flight, up to "
             f"{self.seconds:g} s ({DRAIN_VAR}); new requests get 503")
        for note in self.notes:
            _say(note())

    async def _finish(self) -> None:
        start = time.monotonic()
        try:
            await asyncio.wait_for(self._settle(), self.seconds)
        except asyncio.TimeoutError:
            self._begun()
            _say(f"bakery-worker: drain time over ({self.seconds:g} s, {DRAIN_VAR}): {self.in_flight} "
                 "request(s) still in flight are cut")
        else:
            await self._flush(start + self.seconds)
            _say(f"bakery-worker: drained in {time.monotonic() - start:.2f} s "
                 f"({self.refused} request(s) refused meanwhile); exiting")
        await self._report(start + self.seconds)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        self.exit(0)

    async def _flush(self, deadline: float) -> None:
        """Wait until the last answers left the process (their transports' buffers are empty)."""
        while time.monotonic() < deadline and any(
                not t.is_closing() and t.get_write_buffer_size() for t in list(self._unflushed)):
            await asyncio.sleep(_FLUSH_POLL)

    async def _report(self, deadline: float) -> None:
        """Send the queued request outcomes now, bounded by the drain's deadline (FLUSH_FLOOR at least)."""
        if self.send_outcomes is None:
            return
        bound = max(deadline - time.monotonic(), FLUSH_FLOOR)
        try:
            await asyncio.wait_for(self.send_outcomes(), bound)
        except asyncio.TimeoutError:
            _say(f"bakery-worker: the request outcomes were not sent within {bound:.1f} s; exiting anyway")
        except Exception as exc:  # noqa: BLE001 (the exit must happen whatever the report did)
            _say(f"bakery-worker: sending the request outcomes failed ({type(exc).__name__}); exiting anyway")

    async def on_startup(self, _app: Any) -> None:
        """Take SIGTERM and SIGINT on the server's loop (once, for the first app)."""
        loop = asyncio.get_running_loop()
        for sig in SIGNALS:
            loop.add_signal_handler(sig, self.begin)


def retry_later(web: Any, message: str, retry_after: int) -> Any:
    """503 JSON {"error": message} with Retry-After: a request refused for now (draining, or over a
    bound of admission.py), to be sent again later or elsewhere."""
    return web.json_response({"error": message}, status=503, headers={"Retry-After": str(retry_after)})


def install(ctx: Any, seconds: float, retry_after: int) -> Drain:
    """Add the drain to the guards' Context `ctx` (its middleware outermost, its signal handlers at
    startup); call before worker.run()."""
    from aiohttp import web

    drain = Drain(seconds, retry_after, tuple(ctx.routes), send_outcomes=ctx.outcomes.send_queued)

    @web.middleware
    async def draining(request: Any, handler: Any) -> Any:
        return await drain.middleware(request, handler)

    ctx.middlewares.append(request_path.middleware("drain", draining))
    ctx.on_startup.append(drain.on_startup)
    return drain


def _say(message: str) -> None:
    sys.stdout.write(message + "\n")  # one write: see core.line_out
    sys.stdout.flush()
