"""The worker's event loop: uvloop (libuv's loop, in C) unless BAKERY_EVENT_LOOP=asyncio.

Why (issue 24): once a streamed event costs bakery one engine read and one client write, what is
left per event is the loop itself (its selector, its Python transports' write and read paths, its
callback handles), and uvloop does that part in C. Measured alternately on the AMD EPYC host
against the C engine (serving_bench.py --event-loop): 256 streams x 64 tokens, 36-48 -> 29-34 us of
worker CPU per event, first token +114-155 -> +86-99 ms; 1024 streams 0.72-0.74x -> 0.78-0.79x
(BENCHMARKS.md, "Back on an AMD EPYC host"). An earlier
measurement found no gain, but against the Python stand-in, which took the cores the worker needed.

The SDK starts its server with `asyncio.run()`, so the loop is chosen through the event loop policy
before the SDK's `Worker.run()`: asyncio.run() makes its loop from it. BAKERY_EVENT_LOOP=asyncio
keeps the standard library's loop (for a platform uvloop does not build on, or to compare); a venv
without uvloop falls back to it with a warning, never to no worker.

The cyclic garbage collector's first threshold is raised too (`tune_collector`): at 700 objects it
ran every few requests, each pass over whatever the requests in flight held (a burst of 256 streams
keeps thousands alive), so a stream cost ~50 us of collections and the loop stopped for a full
collection of ~40 ms now and then, in the middle of a burst. Almost everything a request makes is
freed by reference counting when it ends; what is cyclic waits for 20,000 net allocations instead.

Imports only the standard library; uvloop when chosen.
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
