"""An error line in the engine's log after the model loaded counts only if the engine is really down.

vastai 1.9.1 marks the worker errored for good on any error line, but engines log tracebacks they handle.
After load a line counts only if it is the engine's exit line or its health endpoint fails; one that counts
asks for a status report at the SDK's next tick. Standard library only. The policy: docs/engines.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from config import table

PROBES_VAR = "BAKERY_LATE_ERROR_PROBES"
INTERVAL_VAR = "BAKERY_LATE_ERROR_INTERVAL"
EXIT_PREFIX = "INFO exited: "  # the line worker/boot/supervise.py writes into MODEL_LOG when the engine exits
PROBE_TIMEOUT = 5.0  # seconds one health probe may take before it counts as a failure
WARN_EVERY = 60.0  # seconds between two warnings about lines that did not count
LINE_CHARS = 300  # of a log line, in a warning

log = logging.getLogger("bakery.late_errors")

Probe = Callable[[], Awaitable["str | None"]]


@dataclass(frozen=True)
class Bounds:
    """How a late error line is checked: `probes` health probes in a row, `interval` seconds apart."""

    probes: int
    interval: float
    probe_timeout: float = PROBE_TIMEOUT

    @property
    def healthy_seconds(self) -> float:
        """How long a check takes when the engine answers at once (the usual case)."""
        return (self.probes - 1) * self.interval

    @property
    def longest_seconds(self) -> float:
        """The longest a check of one line can take (every probe answering 200 just within its timeout)."""
        return self.probes * self.probe_timeout + self.healthy_seconds


DEFAULT_BOUNDS = Bounds(table.BY_NAME[PROBES_VAR].default, table.BY_NAME[INTERVAL_VAR].default)


def load(env: Mapping[str, str], warnings: list[str] | None = None) -> Bounds:
    """BAKERY_LATE_ERROR_PROBES and BAKERY_LATE_ERROR_INTERVAL (table.VARIABLES; a bad value warns
    and takes the default)."""
    return Bounds(table.read(env, PROBES_VAR, warnings), table.read(env, INTERVAL_VAR, warnings))


def describe(bounds: Bounds) -> str:
    """The startup line naming the policy and its bounds."""
    return (f"bakery-worker: late errors: after load an error line counts only if the engine's health fails "
            f"({bounds.probes} probe(s) {bounds.interval:g} s apart, {bounds.probe_timeout:g} s each; "
            f"{PROBES_VAR}, {INTERVAL_VAR}); the exit line counts at once")


def _short(line: str) -> str:
    return line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + "..."


class LateErrors:
    """Decides, for each error the SDK reports, whether it reaches the SDK's `backend_errored`.

    `errored` is the SDK's own backend_errored; `plane` the ControlPlane (readiness, reports); `probe` one
    health probe (None when it answered 200, else what
    failed); `error_lines` MODEL_ERROR_LOG_MSGS as the SDK was given them.
    """

    def __init__(self, errored: Callable[[str], Any], plane: Any, probe: Probe, error_lines: Iterable[str],
                 bounds: Bounds, clock: Callable[[], float] = time.monotonic) -> None:
        self.errored = errored
        self.plane = plane
        self.probe = probe
        self.error_lines = frozenset(error_lines)
        self.bounds = bounds
        self.clock = clock
        self.last_line: str | None = None  # the last line the SDK read from MODEL_LOG (log_tail)
        self.held = 0  # lines that did not count since the last warning
        self.last_warning: float | None = None
        self._pending: tuple[str, str] | None = None  # (pattern, line) of the latest line under check
        self._left = 0  # probes still to pass before the lines under check are let go
        self._lines = 0  # lines under check
        self._task: asyncio.Task[None] | None = None

    def seen(self, line: str) -> None:
        """log_tail's callback: a line the SDK's tail just read (it matches it before reading on)."""
        self.last_line = line.rstrip()

    def backend_errored(self, msg: str) -> None:
        """What the SDK calls instead of its own backend_errored (ControlPlane.replace_errored)."""
        if msg not in self.error_lines:  # the SDK's own: its health check, the benchmark, the key
            self.errored(msg)
            return
        line = self.last_line if self.last_line and msg in self.last_line else msg
        if msg.startswith(EXIT_PREFIX) or not self.plane.ready():
            self.count(msg)
            return
        self._pending = (msg, line)
        self._left = self.bounds.probes  # a new line gets a whole check
        self._lines += 1
        if self._task is None or self._task.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # not called from the SDK's loop (none in 1.9.1): nothing can probe
                self.count(msg)
                return
            log.debug("error line after load: checking the engine's health before counting it: %s", _short(line))
            self._task = loop.create_task(self.check())

    def count(self, msg: str) -> None:
        """Mark the worker errored with `msg` and ask for a report at the SDK's next tick."""
        self.errored(msg)
        self.plane.ask_report()

    async def check(self) -> None:
        """Probe the engine's health until `probes` probes in a row answered 200 since the last line
        under check; count that line if one failed. Ends early when the worker got errored otherwise."""
        first = True
        while self._left > 0:
            if not first:
                await asyncio.sleep(self.bounds.interval)
            first = False
            if not self.plane.ready():  # errored meanwhile (the exit line, the SDK's own check)
                self._lines = 0
                return
            failure = await self.probe()
            self._left -= 1
            if failure is not None and self._pending is not None and self.plane.ready():
                msg, line = self._pending
                log.warning("an error line after load counts: the engine's health failed (%s); the worker "
                            "reports itself errored: %s", failure, _short(line))
                self._lines = 0
                self.count(msg)
                return
        if self._pending is not None:
            self.let_go(self._pending[1])

    def let_go(self, line: str) -> None:
        """The lines under check did not count: a warning at most once per WARN_EVERY seconds (counting
        the lines since the last one), a debug line for the checks in between."""
        self.held += self._lines
        self._lines = 0
        now = self.clock()
        quiet = self.last_warning is not None and now - self.last_warning < WARN_EVERY
        level = logging.DEBUG if quiet else logging.WARNING
        log.log(level, "%d error line(s) after load while the engine's health answered 200 (%d probe(s) over "
                "%g s): not counted, the worker stays ready; last: %s", self.held, self.bounds.probes,
                self.bounds.healthy_seconds, _short(line))
        if not quiet:
            self.last_warning = now
            self.held = 0


def health_probe(plane: Any, timeout: float) -> Probe:
    """One GET of the engine's health URL (the SDK's healthcheck_url) on the engine session: None when
    it answered 200, else what failed."""
    url = plane.health_url()

    async def get() -> int:  # as the SDK's own health check asks it
        async with plane.engine_session().get(url) as response:
            await response.read()
            return int(response.status)

    async def probe() -> str | None:
        if not url:  # nothing to ask (the SDK checks nothing either): the line counts, as before
            return "no health endpoint (MODEL_HEALTH_ENDPOINT)"
        try:
            status = await asyncio.wait_for(get(), timeout)
        except asyncio.TimeoutError:
            return f"no answer from {url} within {timeout:g} s"
        except Exception as exc:  # noqa: BLE001 (a refused connection, a reset: the engine is not there)
            return f"{url}: {type(exc).__name__}: {exc}"[:200]
        return None if status == 200 else f"{url} answered {status}"

    return probe


def install(ctx: Any, error_lines: Iterable[str], bounds: Bounds) -> LateErrors:
    """Wrap the SDK's backend_errored with the policy; returns it (log_tail feeds its `seen`)."""
    plane = ctx.sdk
    policy = LateErrors(lambda msg: None, plane, health_probe(plane, bounds.probe_timeout), error_lines, bounds)
    policy.errored = plane.replace_errored(policy.backend_errored)
    return policy
