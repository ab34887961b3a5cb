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

POLL = 0.05  # seconds between looks at the loaded flag (until it is set; then the task ends)

log = logging.getLogger("bakery.report_soon")


def install(ctx: Any, on_loaded: Callable[[], None] | None = None, on_sent: Callable[[], None] | None = None) -> None:
    """Start, with the server, a task that sends the first loaded report as soon as the model is loaded;
    `on_loaded` is called when it sees the model loaded, `on_sent` once that report went (stages.py)."""
    plane = ctx.sdk  # its send posts the report to each REPORT_ADDR in turn; on success it stamps last_report
    tasks: list[asyncio.Task[None]] = []

    async def report_when_loaded() -> None:
        while not plane.loaded():
            await asyncio.sleep(POLL)
        if on_loaded is not None:
            on_loaded()
        before = plane.last_report()
        try:
            await plane.send_report()
        except Exception as exc:  # noqa: BLE001 (the SDK's loop sends it instead)
            log.warning("the loaded report could not be sent at once (%s); it goes at the next tick",
                        type(exc).__name__)
        if plane.last_report() == before:  # not sent: the SDK's loop sends it at its next tick
            plane.ask_report()
            while on_sent is not None and plane.last_report() == before:
                await asyncio.sleep(POLL)  # the stage is when a report did go
        if on_sent is not None:
            on_sent()

    async def start(_app: Any) -> None:
        if not tasks:  # on_startup runs for each of the SDK's two apps: one watcher is enough
            tasks.append(asyncio.get_running_loop().create_task(report_when_loaded()))

    ctx.on_startup.append(start)
