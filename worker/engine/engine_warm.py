"""Engine connections kept ready between bursts, and opened for the first one.

Engines drop a connection idle for 5 s, so a burst after quiet opened them on the loop. Idle ones are renewed
before they age out for BAKERY_ENGINE_KEEP_WARM seconds after a request (never within QUIET of one, nor while
draining); BAKERY_ENGINE_READY_CONNECTIONS are opened once the model loads. See docs/serving.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

DEFAULT = 60.0  # seconds after the last request during which idle engine connections are renewed
TICK = 0.25  # seconds between two looks at the idle connections
PER_TICK = 48  # renewals at once: 192 a second, 256 connections within their LEAD
LEAD = 1.5  # seconds before the pool would stop handing a connection out that it is renewed
QUIET = 0.5  # seconds without a request before renewal closes anything: never in the middle of a burst
OPEN_STEP = 48  # connections opened at once for the first burst
LOADED_POLL = 0.05  # seconds between looks at the SDK's loaded flag
WHO = "engine_warm.py"
log = logging.getLogger("bakery.engine_warm")


def describe(seconds: float, ready: int = 0, share: int | None = None) -> str:
    """The startup line's words for BAKERY_ENGINE_KEEP_WARM=`seconds` and
    BAKERY_ENGINE_READY_CONNECTIONS=`ready` (`share` of them by each process, with front processes)."""
    if seconds <= 0:
        said = "idle engine connections: not renewed (BAKERY_ENGINE_KEEP_WARM=0)"
    else:
        said = f"idle engine connections: renewed for {seconds:g} s after the last request"
    if ready > 0:
        each = f", {share} by each of the worker's processes" if share is not None and share != ready else ""
        return f"{said}; {ready} opened when the model is loaded{each} (BAKERY_ENGINE_READY_CONNECTIONS)"
    return f"{said}; none opened before the first request (BAKERY_ENGINE_READY_CONNECTIONS=0)"


async def open_ready(pool: Any, count: int, step: int = OPEN_STEP) -> int:
    """Open `count` connections into `pool` (a forward.Pool), `step` at a time; how many were opened
    (it stops at the first that cannot be)."""
    pool.last_request = asyncio.get_running_loop().time()  # renewal's window counts from here
    opened = 0
    while opened < count:
        batch = min(step, count - opened)
        made = await asyncio.gather(*(pool.connect() for _ in range(batch)), return_exceptions=True)
        for conn in made:
            if not isinstance(conn, BaseException):
                pool.put(conn)
                opened += 1
        failed = [exc for exc in made if isinstance(exc, BaseException)]
        if failed:
            if not all(isinstance(exc, (OSError, asyncio.TimeoutError)) for exc in failed):
                raise next(exc for exc in failed if not isinstance(exc, (OSError, asyncio.TimeoutError)))
            break
    return opened


def install(ctx: Any, pool: Any, count: int) -> None:
    """Stop `pool`'s renewal when the worker drains (ctx.drain); open `count` engine connections into
    it once the SDK marks the model loaded (a startup task of the server), none when `count` is 0."""
    drain = getattr(ctx, "drain", None)
    if pool.keeper is not None and drain is not None:
        pool.keeper.stopping = lambda: bool(drain.draining)
    if count <= 0:
        return
    loaded = ctx.outcomes.loaded
    tasks: list[asyncio.Task[None]] = []

    async def when_loaded() -> None:
        while not loaded():
            await asyncio.sleep(LOADED_POLL)
        opened = await open_ready(pool, count)
        if opened < count:
            log.warning("bakery-worker: warning: %d of %d engine connections opened for the first requests "
                        "(BAKERY_ENGINE_READY_CONNECTIONS): the engine refused or did not answer the rest; "
                        "they open with the requests that need them", opened, count)

    async def start(_app: Any) -> None:
        if not tasks:  # on_startup runs for each of the SDK's two apps: one task is enough
            tasks.append(asyncio.get_running_loop().create_task(when_loaded()))

    ctx.on_startup.append(start)


class Keeper:
    """Renews `pool`'s idle connections (a forward.Pool) while a request came in the last `seconds`."""

    def __init__(self, pool: Any, seconds: float, tick: float = TICK, per_tick: int = PER_TICK,
                 lead: float = LEAD, quiet: float = QUIET) -> None:
        self.pool, self.seconds = pool, seconds
        self.tick, self.per_tick, self.lead, self.quiet = tick, per_tick, lead, quiet
        self.timer: asyncio.TimerHandle | None = None
        self.opening = 0  # renewals under way
        self.failed = False  # a renewal could not connect: none until the next request
        self.stopping: Callable[[], bool] = lambda: False  # the worker drains: no more renewal
        self.renewed = 0

    def request(self) -> None:
        """A request went to the engine: renewal may go on (again)."""
        self.failed = False

    def arm(self) -> None:
        """Look at the idle connections a tick from now, unless a look is due already or renewal is off."""
        if self.timer is None and self.seconds > 0 and not self.failed:
            self.timer = asyncio.get_running_loop().call_later(self.tick, self._look)

    def stop(self) -> None:
        """No more looks (the pool is closed)."""
        timer, self.timer = self.timer, None
        if timer is not None:
            timer.cancel()

    def _look(self) -> None:
        self.timer = None
        pool, loop = self.pool, asyncio.get_running_loop()
        now = loop.time()
        if self.failed or now - pool.last_request > self.seconds or self.stopping():
            return  # quiet for longer than asked (or draining): the idle connections age out
        if now - pool.last_request < self.quiet:
            # Requests are coming: they take the idle connections (newest first) and a renewal now would
            # close some under them and open others on the loop they need.
            self.arm()
            return
        old_enough = pool.keepalive - self.lead
        room = self.per_tick - self.opening
        due = [conn for conn in pool.idle if now - conn.idle_since >= old_enough][:max(room, 0)]
        if due:
            gone = set(map(id, due))
            pool.idle = [conn for conn in pool.idle if id(conn) not in gone]
            for conn in due:
                conn.discard()
                self.opening += 1
                loop.create_task(self._renew())
        if pool.idle or self.opening:
            self.arm()

    async def _renew(self) -> None:
        try:
            conn = await self.pool.connect()
        except (OSError, asyncio.TimeoutError):
            self.failed = True
            return
        finally:
            self.opening -= 1
        self.renewed += 1
        self.pool.put(conn)
