"""Send the status report that says "loaded" at once, not at the SDK's next tick.

vastai 1.9.1 sends a report only when a request changed something or 10 s have passed, so a ready worker could
wait ~10 s for traffic. A startup task sends it at once with the SDK's own send; a failed send is left pending
for the SDK's loop. Standard library only. See docs/serving.md, "Time to routable".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from control import sdk_seam

POLL = 0.05  # seconds between looks at the loaded flag (until it is set; then the task ends)
# The SDK's status-report send (sdk_seam hook "send_report"): it posts the report to each REPORT_ADDR
# in turn, and on success clears update_pending and stamps last_metric_update.
SEND_REPORT = sdk_seam.hook("send_report").attr
WHO = "report_soon.py"

log = logging.getLogger("bakery.report_soon")


def install(ctx: Any, on_loaded: Callable[[], None] | None = None, on_sent: Callable[[], None] | None = None) -> None:
    """Start, with the server, a task that sends the first loaded report as soon as the model is loaded;
    `on_loaded` is called when it sees the model loaded, `on_sent` once that report went (stages.py)."""
    metrics = sdk_seam.find(ctx.backend, "metrics", WHO)
    for key in ("model_is_loaded", "update_pending", "last_metric_update"):
        sdk_seam.find(metrics, key, WHO)
    send = sdk_seam.find(metrics, "send_report", WHO)
    tasks: list[asyncio.Task[None]] = []

    async def report_when_loaded() -> None:
        while not metrics.system_metrics.model_is_loaded:
            await asyncio.sleep(POLL)
        if on_loaded is not None:
            on_loaded()
        before = metrics.last_metric_update
        try:
            await send()
        except Exception as exc:  # noqa: BLE001 (the SDK's loop sends it instead)
            log.warning("the loaded report could not be sent at once (%s); it goes at the next tick",
                        type(exc).__name__)
        if metrics.last_metric_update == before:  # not sent: the SDK's loop sends it at its next tick
            metrics.update_pending = True
            while on_sent is not None and metrics.last_metric_update == before:
                await asyncio.sleep(POLL)  # the stage is when a report did go
        if on_sent is not None:
            on_sent()

    async def start(_app: Any) -> None:
        if not tasks:  # on_startup runs for each of the SDK's two apps: one watcher is enough
            tasks.append(asyncio.get_running_loop().create_task(report_when_loaded()))

    ctx.on_startup.append(start)
