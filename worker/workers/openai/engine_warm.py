"""Engine connections kept ready between bursts (BAKERY_ENGINE_KEEP_WARM).

The engines close a kept-alive connection after 5 s without a request (uvicorn's keep-alive for
vLLM and SGLang; llama.cpp's server likewise), so forward.Pool hands out none idle for 4 s
(guards.ENGINE_KEEPALIVE). A burst that came after 4 s of quiet therefore opened every engine
connection it needed inside the burst: ~0.15 ms of the worker's CPU each, most of it the kernel's
handshake on loopback, one after another on the worker's one loop. At 256 streams that put the
median first token +20-25 ms behind a burst that found its connections open (bench/serving_bench.py
--only scale: the rounds after 4 s of quiet against those after 1 s).

For BAKERY_ENGINE_KEEP_WARM seconds after the last request (default 60; 0: never) the pool's idle
connections are renewed before they grow too old to be handed out: every TICK, up to PER_TICK of
those idle for `keepalive - LEAD` seconds or more are closed and as many new ones opened. The pool
so keeps what the last burst needed for a minute after it, at ~0.15 ms per connection every ~3 s
(measured at 256 connections: ~0.7 % of a core); then renewal stops and the pool empties as before. It never
grows the pool, and a connection that cannot be opened stops renewal until the next request.

Imports only the standard library.
"""

from __future__ import annotations

import asyncio
from typing import Any

DEFAULT = 60.0  # seconds after the last request during which idle engine connections are renewed
TICK = 0.25  # seconds between two looks at the idle connections
PER_TICK = 48  # renewals at once: 192 a second, 256 connections within their LEAD
LEAD = 1.5  # seconds before the pool would stop handing a connection out that it is renewed


def describe(seconds: float) -> str:
    """The startup line's words for BAKERY_ENGINE_KEEP_WARM=`seconds`."""
    if seconds <= 0:
        return "idle engine connections: not renewed (BAKERY_ENGINE_KEEP_WARM=0)"
    return f"idle engine connections: renewed for {seconds:g} s after the last request"


class Keeper:
    """Renews `pool`'s idle connections (a forward.Pool) while a request came in the last `seconds`."""

    def __init__(self, pool: Any, seconds: float, tick: float = TICK, per_tick: int = PER_TICK,
                 lead: float = LEAD) -> None:
        self.pool, self.seconds = pool, seconds
        self.tick, self.per_tick, self.lead = tick, per_tick, lead
        self.timer: asyncio.TimerHandle | None = None
        self.opening = 0  # renewals under way
        self.failed = False  # a renewal could not connect: none until the next request
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
        if self.failed or now - pool.last_request > self.seconds:
            return  # quiet for longer than asked: the idle connections age out; the next put() re-arms
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
