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

Imports only the standard library.
"""

from __future__ import annotations

import asyncio
import contextvars

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

