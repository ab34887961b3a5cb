"""Close the engine's response when the request that asked for it ends, however it ends.

The SDK never closes a streamed engine response: a client gone mid-stream left it to the garbage collector and
the engine generating for nobody. The engine call is wrapped so the response closes once its task is done;
closing one already read to its end changes nothing. Stdlib only at import. See docs/serving.md.
"""

from __future__ import annotations

import asyncio
from typing import Any

from config import request_path


def _close(response: Any) -> None:
    close = getattr(response, "close", None)
    if callable(close) and not getattr(response, "closed", True):
        close()


def install(ctx: Any) -> None:
    """Wrap the engine call (ctx.call_engine, after the guards wrapped theirs) so each engine response is
    closed when its task ends."""
    inner = ctx.call_engine

    async def call_and_release(*args: Any, **kwargs: Any) -> Any:
        response = await inner(*args, **kwargs)
        task = asyncio.current_task()
        if task is not None:
            task.add_done_callback(lambda _task: _close(response))
        return response

    ctx.call_engine = request_path.layer("engine_close", call_and_release, inner)

