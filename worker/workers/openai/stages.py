"""Time to ready, stage by stage: the worker names the moment it reaches each stage it can see.

Scale-from-zero is the wait a serverless user lives with, so where it goes must be readable per
launch, from the logs alone (no probe, no sleep). The boot's own lines give the container's start
and the engine's spawn (supervisord's `spawned:` line); this module adds one line per stage the
worker sees, each with the wall-clock time it saw it:

    bakery-worker: stage <name> at <unix seconds>: <what marked it>

in the order they come:
- `load_begins`: the first MODEL_LOG line holding one of BAKERY_LOAD_BEGIN_LOG_MSGS (the engine
  starts loading its model);
- `weights_loaded`: the first holding one of BAKERY_WEIGHTS_LOADED_LOG_MSGS (its weights are in);
- `engine_ready`: the first holding one of MODEL_LOAD_LOG_MSG (the line the SDK starts its
  benchmark on);
- `benchmark_done`: the SDK marked the model loaded (after its benchmark; with a key that came late,
  when the key came: guards' pubkey_retry holds the mark back until then);
- `ready_report_sent`: the status report saying so reached the control plane (report_soon's send).
An engine whose spec bakes no stage lines skips those stages; the gate (tests/image/stages.py) and
docs/cold-start.md read the lines. MODEL_LOG lines are read as the SDK reads them (log_tail's
callback), within its tail's poll. A matched line is shown escaped and cut (it is the engine's text).

This module imports only the standard library.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from workers.openai import config, log_escape

PREFIX = "bakery-worker: stage "
STAGES = ("load_begins", "weights_loaded", "engine_ready", "benchmark_done", "ready_report_sent")
LINE_STAGES = {  # the stages a MODEL_LOG line marks, and the variable holding their lines
    "load_begins": "BAKERY_LOAD_BEGIN_LOG_MSGS",
    "weights_loaded": "BAKERY_WEIGHTS_LOADED_LOG_MSGS",
}
DETAIL_CHARS = 160  # of the marking line, in the stage's line


def load(env: Mapping[str, str], warnings: list[str]) -> dict[str, tuple[str, ...]]:
    """The stage lines LINE_STAGES names, read from `env` (a bad value warns: no lines)."""
    return {stage: tuple(config.read(env, name, warnings) or ()) for stage, name in LINE_STAGES.items()}


class Stages:
    """Says each stage once, the first time it is reached; `say` prints a line, `clock` is the wall clock."""

    def __init__(self, lines: Mapping[str, Iterable[str]], say: Callable[[str], None],
                 clock: Callable[[], float] = time.time) -> None:
        self.lines = {stage: tuple(patterns) for stage, patterns in lines.items() if patterns}
        self.say = say
        self.clock = clock
        self.reached: dict[str, float] = {}

    def mark(self, stage: str, detail: str = "") -> None:
        """Say `stage` now, unless it was said before."""
        if stage in self.reached:
            return
        now = self.clock()
        self.reached[stage] = now
        shown = log_escape.clean(detail.strip(), DETAIL_CHARS) if detail else ""
        self.say(f"{PREFIX}{stage} at {now:.3f}" + (f": {shown}" if shown else ""))

    def seen(self, line: Any) -> None:
        """log_tail's callback: a MODEL_LOG line the SDK just read."""
        if len(self.reached) >= len(STAGES):
            return
        text = line if isinstance(line, str) else bytes(line).decode("utf-8", "replace")
        for stage in ("load_begins", "weights_loaded", "engine_ready"):
            if stage not in self.reached and any(pattern in text for pattern in self.lines.get(stage, ())):
                self.mark(stage, text)


def stage_lines(load_lines: Iterable[str], env_lines: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Every stage's lines: the baked stage lines, and the load lines (MODEL_LOAD_LOG_MSG) for engine_ready."""
    return {**env_lines, "engine_ready": tuple(load_lines)}
