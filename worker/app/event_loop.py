"""The worker's event loop: uvloop (libuv's loop, in C) unless BAKERY_EVENT_LOOP=asyncio.

The SDK starts its server with `asyncio.run()`, so the loop is chosen through the event loop policy before
`Worker.run()`; a venv without uvloop falls back to asyncio's, with a warning. `tune_collector` raises the
collector's first threshold so it stops pausing bursts. See docs/serving.md.
"""

from __future__ import annotations

import asyncio
import gc

UVLOOP, ASYNCIO = "uvloop", "asyncio"
CHOICES = (UVLOOP, ASYNCIO)
DEFAULT = UVLOOP
# Net allocations between two young collections (CPython's default: 700). Measured on the AMD EPYC
# host, 7 bursts of 256 streams through the worker: 123 young, 11 middle and 1 full collection (94 ms
# in all, the full one 42 ms) at 700; none at 20,000, and 0.27-0.31 -> 0.215 ms of user CPU per stream.
YOUNG_THRESHOLD = 20_000


def install(choice: str) -> tuple[str, str | None]:
    """Make asyncio.run() use the loop named `choice` (one of CHOICES). Returns (what runs, e.g.
    "uvloop 0.23.0", a warning or None): the standard library's loop when uvloop cannot be imported."""
    if choice != UVLOOP:
        return ASYNCIO, None
    try:
        import uvloop
    except ImportError as exc:
        return ASYNCIO, f"uvloop cannot be imported ({exc}): the worker runs on asyncio's own loop"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return f"{UVLOOP} {getattr(uvloop, '__version__', '')}".strip(), None


def tune_collector() -> str:
    """Raise the collector's first threshold to YOUNG_THRESHOLD (the older two as they are); says
    what it set."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    return f"garbage collector thresholds {YOUNG_THRESHOLD}, {middle}, {old}"
