"""Letting the event loop go between the CPU-heavy steps of one large request.

The worker serves every request on one asyncio loop, and a large body costs several passes in a row:
bakery's checks, the SDK's parse, bakery's serialisation of the payload for the engine. Each is C
code that holds the loop, and nothing between them waits for I/O, so another request arriving
meanwhile waited for all of them back to back (a signed 4 MiB body nested 60 deep: ~2.3 s, where
one parse is ~1.3 s; tests/worker/test_loop_stall.py). `await pause()` between two steps lets the
loop serve whatever is ready first: one `sleep(0)` is not enough, since another request needs a few
loop iterations (its bytes read, its task started, its handler run, its answer written) and each
yield gives it one; PAUSE_ITERATIONS of them give it as many, however slowly a busy machine runs
the worker (a timer would expire first there). Only for a request whose body is large (`mark()`,
set by the envelope guard for the request's context, which the SDK's engine-call task inherits): a
small request pays nothing.

The step in which the SDK parses a large signed body runs without the cyclic garbage collector
(`quiet_collector()`), and what it made is then left out of the collector's passes until the request
ends (`gc.freeze()`, undone by `thaw()`): a parse that makes millions of lists spends most of its time
in the collections their allocation triggers (a 4 MiB body nested 60 deep: 0.7 s, 0.2 s without),
and re-enabled on them the collector would pass over them all again, a stall of ~0.4 s each time.
JSON makes no reference cycles; whatever else became cyclic garbage meanwhile is collected after.

Imports only the standard library.
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
