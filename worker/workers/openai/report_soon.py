"""Send the status report that says "loaded" at once, not at the SDK's next periodic tick.

vastai 1.9.1 marks the model loaded (loadtime, max_perf) after its benchmark but sends status reports
from a 1 s loop only when a request changed something (`update_pending`) or 10 s have passed since
the last report. The report the platform routes on therefore left up to ~10 s after the benchmark,
during which a ready worker got no traffic. Here a startup task watches for the loaded state and
sets `update_pending`, so that report goes out at the loop's next 1 s tick. It works whichever path
marks the model loaded (the SDK's benchmark, or the pubkey_retry guard once the key arrives late).

This module imports only the standard library at import time.
"""

from __future__ import annotations

import asyncio
from typing import Any

from workers.openai.guards import GuardError

POLL = 0.05  # seconds between looks at the loaded flag (until it is set; then the task ends)


def install(ctx: Any) -> None:
    """Start, with the server, a task that flags the first loaded report as pending."""
    metrics = getattr(ctx.backend, "metrics", None)
    system = getattr(metrics, "system_metrics", None)
    if system is None or not hasattr(system, "model_is_loaded") or not hasattr(metrics, "update_pending"):
        raise GuardError("the SDK's Metrics no longer has system_metrics.model_is_loaded / update_pending "
                         "(vastai changed): update worker/workers/openai/report_soon.py")
    tasks: list[asyncio.Task[None]] = []

    async def flag_when_loaded() -> None:
        while not metrics.system_metrics.model_is_loaded:
            await asyncio.sleep(POLL)
        metrics.update_pending = True

    async def start(_app: Any) -> None:
        if not tasks:  # on_startup runs for each of the SDK's two apps: one watcher is enough
            tasks.append(asyncio.get_running_loop().create_task(flag_when_loaded()))

    ctx.on_startup.append(start)
