"""Time to ready, stage by stage: each moment of the boot is named by whoever sees it happen.

The entry point's `watch` stamps the engine's stages from MODEL_LOG (`bakery: stage ...`); the worker stamps
what only it sees (`bakery-worker: stage ...`). Standard library only: the entry point imports it before the
engine starts. The stages and who reads them: docs/cold-start.md.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from config import table
from logs import log_escape

PREFIX = "bakery-worker: stage "  # the worker's lines
BOOT_PREFIX = "bakery: stage "  # the entry point's lines
ENGINE_STAGES = ("load_begins", "weights_loaded", "engine_ready")  # the entry point's, from MODEL_LOG
WORKER_STAGES = ("benchmark_begins", "benchmark_done", "ready_report_sent")
STAGES = ENGINE_STAGES + WORKER_STAGES
LINE_STAGES = {  # the engine's stages a MODEL_LOG line marks, and the variable holding their lines
    "load_begins": "BAKERY_LOAD_BEGIN_LOG_MSGS",
    "weights_loaded": "BAKERY_WEIGHTS_LOADED_LOG_MSGS",
    "engine_ready": "MODEL_LOAD_LOG_MSG",
}
DETAIL_CHARS = 160  # of the marking line, in the stage's line
POLL_SECONDS = 0.02  # the entry point's read of MODEL_LOG while the engine loads: a stage's precision
SLOW_POLL_AFTER = 600.0  # seconds of a load that never ends; then it is read every SLOW_POLL_SECONDS
SLOW_POLL_SECONDS = 0.5
MAX_LINE_BYTES = 65536  # a longer run without a newline (a progress bar) is matched and dropped


def load(env: Mapping[str, str], warnings: list[str]) -> dict[str, tuple[str, ...]]:
    """The engine's stage lines LINE_STAGES names, read from `env` (a bad value warns: no lines)."""
    return {stage: tuple(table.read(env, name, warnings) or ()) for stage, name in LINE_STAGES.items()}


class Stages:
    """Says each stage once, the first time it is reached; `say` prints a line, `clock` is the wall clock.

    `lines` maps a stage to the log lines that mark it; `seen` tries them in that order."""

    def __init__(self, lines: Mapping[str, Iterable[str]], say: Callable[[str], None],
                 clock: Callable[[], float] = time.time, prefix: str = PREFIX) -> None:
        self.lines = {stage: tuple(patterns) for stage, patterns in lines.items() if patterns}
        self.say = say
        self.clock = clock
        self.prefix = prefix
        self.reached: dict[str, float] = {}

    def mark(self, stage: str, detail: str = "") -> None:
        """Say `stage` now, unless it was said before."""
        if stage in self.reached:
            return
        now = self.clock()
        self.reached[stage] = now
        shown = log_escape.clean(detail.strip(), DETAIL_CHARS) if detail else ""
        self.say(f"{self.prefix}{stage} at {now:.3f}" + (f": {shown}" if shown else ""))

    def lines_done(self) -> bool:
        """Whether every stage a line marks has been reached."""
        return all(stage in self.reached for stage in self.lines)

    def seen(self, line: Any) -> None:
        """A MODEL_LOG line just read (log_tail's callback in the worker; `watch` in the entry point)."""
        if self.lines_done():
            return
        text = line if isinstance(line, str) else bytes(line).decode("utf-8", "replace")
        for stage, patterns in self.lines.items():
            if stage not in self.reached and any(pattern in text for pattern in patterns):
                self.mark(stage, text)


def watch(path: Path, timeline: Stages, stop: threading.Event,
          clock: Callable[[], float] = time.monotonic) -> None:
    """Read `path` from its start as it grows, handing each complete line to `timeline`, until every
    line stage is reached, `stop` is set, or the file is replaced (a new inode). Runs in a thread of
    the entry point; never raises (a stage line is a report, not a reason to stop the boot)."""
    began = clock()
    pending = b""
    try:
        with open(path, "rb") as handle:
            inode = Path(path).stat().st_ino
            while not timeline.lines_done() and not stop.is_set():
                chunk = handle.read(MAX_LINE_BYTES)
                if chunk:
                    pending += chunk
                    *complete, pending = pending.split(b"\n")
                    if len(pending) > MAX_LINE_BYTES:
                        complete.append(pending)
                        pending = b""
                    for line in complete:
                        timeline.seen(line.decode("utf-8", "replace"))
                    continue
                try:
                    if Path(path).stat().st_ino != inode:
                        return
                except OSError:
                    return
                slow = clock() - began > SLOW_POLL_AFTER
                stop.wait(SLOW_POLL_SECONDS if slow else POLL_SECONDS)
    except Exception:  # noqa: BLE001 - see the docstring
        return


def start_watch(path: Path, env: Mapping[str, str], say: Callable[[str], None]) -> threading.Event:
    """Start `watch` on `path` with the engine's stage lines from `env`, in a daemon thread; set the
    returned event to stop it. A bad stage variable is the worker's to warn about: here it means no line."""
    stop = threading.Event()
    timeline = Stages(load(env, []), say, prefix=BOOT_PREFIX)
    if timeline.lines:
        threading.Thread(target=watch, args=(path, timeline, stop), name="bakery-stages", daemon=True).start()
    return stop


def check(env: Mapping[str, str], warnings: list[str]) -> None:
    """Warn (in the worker's own warnings) about a bad stage variable, which the entry point reads
    silently: there it only means that stage is not named."""
    for name in ("BAKERY_LOAD_BEGIN_LOG_MSGS", "BAKERY_WEIGHTS_LOADED_LOG_MSGS"):
        table.read(env, name, warnings)


def worker_lines(load_lines: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """The worker's line stage: `benchmark_begins`, when the SDK's tail reads one of its load lines."""
    return {"benchmark_begins": tuple(load_lines)}
