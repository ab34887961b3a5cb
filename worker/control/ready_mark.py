"""The worker's readiness as a file, for the image's Docker HEALTHCHECK (worker/boot/health.py).

Port 3000 answers only what the platform signed, so the check reads `<BAKERY_RUN_DIR>/worker-ready`: present
while the model is loaded and the worker is not errored. Written whole, only on a change; the entry point
removes it at every boot. An unwritable run dir costs one warning, not the worker. See docs/image.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

POLL = 1.0  # seconds between looks at the loaded flag: Docker's own interval is 15 s
MARK = "worker-ready"

log = logging.getLogger("bakery.ready_mark")


def mark_path(run_dir: str) -> Path:
    """Where the ready mark lives under `run_dir` (BAKERY_RUN_DIR)."""
    return Path(run_dir) / MARK


def set_mark(path: Path, ready: bool) -> None:
    """Make the mark say `ready`: written whole by a rename, or removed. Raises OSError."""
    if not ready:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.{os.getpid()}")
    part.write_text("ready\n", encoding="utf-8")
    os.replace(part, path)


def install(ctx: Any, run_dir: str) -> None:
    """Start, with the server, the task that keeps `<run_dir>/worker-ready` in step with readiness."""
    ready = ctx.sdk.ready  # loaded and not errored (the SDK marks an errored worker "loaded" too)
    path = mark_path(run_dir)
    tasks: list[asyncio.Task[None]] = []

    async def keep() -> None:
        shown: bool | None = None
        while True:
            now = ready()
            if now != shown:
                try:
                    set_mark(path, now)
                except OSError as exc:
                    log.warning("the ready mark %s cannot be kept (%s): the image's health check will "
                                "not see this worker ready; set BAKERY_RUN_DIR to a writable directory",
                                path, exc.strerror or type(exc).__name__)
                    return
                shown = now
            await asyncio.sleep(POLL)

    async def start(_app: Any) -> None:
        if not tasks:  # on_startup runs for each of the SDK's two apps: one task is enough
            tasks.append(asyncio.get_running_loop().create_task(keep()))

    ctx.on_startup.append(start)
