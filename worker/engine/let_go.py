"""Letting the event loop go between the CPU-heavy steps of one large request.

Each step holds the one loop; `pause()` yields PAUSE_ITERATIONS times (one sleep(0) is too few, a timer would
expire first on a busy machine), so a waiting request gets its turns. Only for a `mark()`ed large body. The
SDK's parse runs without the cyclic collector, what it made frozen until `thaw()`. See docs/security.md.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc

LARGE_BODY = 256 * 1024  # bytes of body from which a request lets the loop go between its steps
PAUSE_ITERATIONS = 8  # loop iterations a pause gives the others (a tiny request takes 3-4)
_LARGE: contextvars.ContextVar[bool] = contextvars.ContextVar("bakery_large_body", default=False)


def mark(size: int) -> contextvars.Token[bool]:
    """Note for the current request (context) whether its body of `size` bytes is large."""
    return _LARGE.set(size >= LARGE_BODY)


def reset(token: contextvars.Token[bool]) -> None:
    _LARGE.reset(token)


async def pause() -> None:
    """Let the loop serve what else is ready, when the current request is large; else nothing."""
    if _LARGE.get():
        for _ in range(PAUSE_ITERATIONS):
            await asyncio.sleep(0)



def quiet_collector() -> None:
    """For a large request: the cyclic collector off for the rest of the current task's step, then
    on again with everything alive frozen out of its passes (until thaw())."""
    if _LARGE.get() and gc.isenabled():
        gc.disable()
        asyncio.get_running_loop().call_soon(_freeze_and_enable)


def _freeze_and_enable() -> None:
    gc.freeze()
    gc.enable()


def thaw() -> None:
    """At the end of a large request: the frozen objects are the collector's again (O(1))."""
    if _LARGE.get():
        gc.unfreeze()
