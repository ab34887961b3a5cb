"""Close the engine's response when the request that asked for it ends, however it ends.

vastai 1.9.1 streams an engine's answer to the client chunk by chunk (its generic handler:
`model_response.content.iter_any()` into a StreamResponse), but it never closes that response.
When the client goes away mid-stream, aiohttp cancels the request's task; the response, and with it
the connection to the engine, then lives until the garbage collector reaches it, so the engine keeps
generating for nobody (measured: all 43 events of a 40-token answer written after the client left;
tests/worker/test_streaming.py). Here the engine call is wrapped so that the response is closed
as soon as the task that made the call is done: the engine sees its connection close and stops.
A response read to its end is already released, and closing it again changes nothing.

This module imports only the standard library at import time.
"""

from __future__ import annotations

import asyncio
from typing import Any

from control import sdk_seam

HOOK = sdk_seam.hook("call_backend").attr  # the SDK's engine call (sdk_seam hook "call_backend")


def _close(response: Any) -> None:
    close = getattr(response, "close", None)
    if callable(close) and not getattr(response, "closed", True):
        close()


def install(ctx: Any) -> None:
    """Wrap the backend's engine call (after the guards wrapped theirs) so each engine response is
    closed when its task ends."""
    def release(inner: Any) -> Any:
        async def call_and_release(*args: Any, **kwargs: Any) -> Any:
            response = await inner(*args, **kwargs)
            task = asyncio.current_task()
            if task is not None:
                task.add_done_callback(lambda _task: _close(response))
            return response

        return call_and_release

    sdk_seam.wrap(ctx.backend, "call_backend", "engine_close.py", release)

