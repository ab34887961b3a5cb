"""What the worker adds for serving under real traffic, one module per job.

engine_close, report_keep, report_soon, ready_mark, late_errors, log_tail, stages and drain: each module's
docstring says what it does. Installed after the guards, on their Context (see core.run). See docs/serving.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from control import ready_mark, report_keep, report_soon
from engine import engine_close
from logs import late_errors, log_tail, stages
from policy import drain

log = logging.getLogger("bakery.serving")


def install(ctx: Any, drain_seconds: float, retry_after: int, error_lines: Iterable[str] = (),
            late_bounds: late_errors.Bounds | None = None, run_dir: str | None = None,
            timeline: stages.Stages | None = None) -> drain.Drain:
    """Install the parts (late_errors only with `late_bounds`, ready_mark only with `run_dir`, the
    stage lines only with `timeline`); raises guards.GuardError when an SDK hook is missing."""
    engine_close.install(ctx)
    report_keep.install(ctx)  # before report_soon, which sends through the wrapped send
    if timeline is None:
        report_soon.install(ctx)
    else:
        report_soon.install(ctx, on_loaded=lambda: timeline.mark("benchmark_done"),
                            on_sent=lambda: timeline.mark("ready_report_sent"))
    if run_dir is not None:
        ready_mark.install(ctx, run_dir)
    policy = None if late_bounds is None else late_errors.install(ctx, error_lines, late_bounds)
    watchers = [seen for seen in (None if policy is None else policy.seen,
                                  None if timeline is None else timeline.seen) if seen is not None]
    log_tail.install(_each(watchers) if watchers else None)
    return drain.install(ctx, drain_seconds, retry_after)


def _each(watchers: list[Callable[[Any], None]]) -> Callable[[Any], None]:
    """One log_tail callback that hands each line to every watcher, in order. It runs inside the SDK's
    tail loop, which reads the load and error lines: a watcher that raises is logged and skipped for
    that line, never allowed to end the loop (the worker would then never see its engine load)."""

    def seen(line: Any) -> None:
        for watch in watchers:
            try:
                watch(line)
            except Exception:
                log.exception("a log-line watcher failed on a MODEL_LOG line; the tail reads on")

    return seen
