"""late_errors: after the model loaded, an error line counts only if the engine's health fails too.

vastai 1.9.1 marks the worker errored for good on any line of MODEL_LOG that matches an error
pattern, also a handled traceback printed by an engine that goes on serving (vLLM's and SGLang's
grammar holds `Traceback (most recent call last):`). late_errors probes the engine's health first
(docs/engines.md, "The worker's error policy after load"). Checked here on the policy alone (a fake
SDK, a fake probe, no clock) and end to end with the real SDK on loopback: the vLLM stand-in (which
prints vLLM's lines and answers /health as vLLM does) and the guard engine (whose /health can be
told to fail while it still serves).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from config.table import parse_lines
from control import sdk_seam
from logs import late_errors
from tests.worker.helpers import (
    GUARD_ENGINE,
    HERE,
    SDK_READY,
    Engine,
    Harness,
    Proc,
    ReportServer,
    baked_facts,
    make_signing_key,
    post_enveloped,
)

MODEL = "standin-model"
TRACEBACK = "Traceback (most recent call last):"
EXIT_LINE = "INFO exited: vllm"
VLLM_ERRORS = parse_lines(baked_facts("vllm")["MODEL_ERROR_LOG_MSGS"])  # what the vLLM image bakes
HELD = "not counted, the worker stays ready"  # late_errors' warning when the health held
COUNTED = "an error line after load counts"  # ... and when it failed
CHECKING = "checking the engine's health before counting it"  # its debug line when a check starts
SDK_MATCHED = "Got log line indicating error"  # the SDK's debug line for each error line it matched
SDK_HEALTHY = "Healthcheck successful"  # the SDK's debug line after each of its own 10 s health checks


# --------------------------------------------------------------------------- the policy alone


class FakeMetrics:
    """The three attributes late_errors reads and sets on the SDK's Metrics."""

    def __init__(self, loaded: bool) -> None:
        self.system_metrics = SimpleNamespace(model_is_loaded=loaded)
        self.model_metrics = SimpleNamespace(error_msg=None)
        self.update_pending = False


class Fake:
    """A LateErrors over FakeMetrics, whose errored() does what the SDK's does, and a probe that
    answers from `answers` (None: 200) and records each call."""

    def __init__(self, loaded: bool = True, answers: list[str | None] | None = None, probes: int = 3) -> None:
        self.metrics = FakeMetrics(loaded)
        self.errors: list[str] = []
        self.answers = list(answers or [])
        self.probed = 0
        self.now = 0.0

        def errored(msg: str) -> None:  # the SDK's _model_errored
            self.errors.append(msg)
            self.metrics.model_metrics.error_msg = msg
            self.metrics.system_metrics.model_is_loaded = True

        async def probe() -> str | None:
            self.probed += 1
            return self.answers.pop(0) if self.answers else None

        plane = sdk_seam.ControlPlane(SimpleNamespace(metrics=self.metrics))
        self.policy = late_errors.LateErrors(errored, plane, probe, VLLM_ERRORS,
                                             late_errors.Bounds(probes, 0.001), clock=lambda: self.now)

    def line(self, text: str, pattern: str) -> None:
        """What the SDK does for a matching line: the tail reads it, then reports the pattern."""
        self.policy.seen(text + "\n")
        self.policy.backend_errored(pattern)

    async def settle(self) -> None:
        """Let the running check end (bounded)."""
        for _ in range(1000):
            task = self.policy._task
            if task is None or task.done():
                return
            await asyncio.sleep(0.001)
        raise AssertionError("the check did not end")


def run(scenario: Callable[[], Any]) -> Any:
    return asyncio.run(scenario())


def test_the_sdks_own_errors_pass_through_unchanged() -> None:
    fake = Fake(answers=["down"])

    async def scenario() -> None:
        for msg in ("Healthcheck failed with status: 500", "No successful responses from benchmark",
                    "Benchmark failed with error: boom"):
            fake.policy.backend_errored(msg)
        await fake.settle()

    run(scenario)
    assert fake.errors == ["Healthcheck failed with status: 500", "No successful responses from benchmark",
                           "Benchmark failed with error: boom"]
    assert fake.probed == 0 and fake.metrics.update_pending is False


def test_before_load_an_error_line_counts_at_once() -> None:
    fake = Fake(loaded=False)

    async def scenario() -> None:
        fake.line("(EngineCore pid=9) ERROR [core.py:1] Traceback (most recent call last):", TRACEBACK)
        await fake.settle()

    run(scenario)
    assert fake.errors == [TRACEBACK] and fake.probed == 0
    assert fake.metrics.update_pending is True  # reported at the SDK's next tick


def test_the_exit_line_counts_at_once_after_load() -> None:
    fake = Fake()

    async def scenario() -> None:
        fake.line("INFO exited: vllm (exit status 1; not expected)", EXIT_LINE)
        await fake.settle()

    run(scenario)
    assert fake.errors == [EXIT_LINE] and fake.probed == 0 and fake.metrics.update_pending is True


def test_after_load_a_line_with_a_healthy_engine_does_not_count(caplog: pytest.LogCaptureFixture) -> None:
    fake = Fake(probes=3)
    text = "(APIServer pid=7) ERROR 12-01 10:00:00 [serving.py:12] Traceback (most recent call last):"

    async def scenario() -> None:
        with caplog.at_level(logging.DEBUG, logger="bakery.late_errors"):
            fake.line(text, TRACEBACK)
            await fake.settle()

    run(scenario)
    assert fake.errors == [] and fake.probed == 3 and fake.metrics.update_pending is False
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and HELD in warnings[0] and text in warnings[0], warnings  # the whole line


@pytest.mark.parametrize("failing", [0, 2])
def test_after_load_a_line_counts_when_a_probe_fails(failing: int, caplog: pytest.LogCaptureFixture) -> None:
    """The first probe, or a later one (a dying engine logs before its health fails)."""
    fake = Fake(probes=3, answers=[None] * failing + ["http://e/health answered 503"])

    async def scenario() -> None:
        with caplog.at_level(logging.WARNING, logger="bakery.late_errors"):
            fake.line("RuntimeError: Engine loop has died", "RuntimeError: Engine")
            await fake.settle()

    run(scenario)
    assert fake.errors == ["RuntimeError: Engine"] and fake.probed == failing + 1
    assert fake.metrics.update_pending is True
    assert [r.getMessage() for r in caplog.records if COUNTED in r.getMessage() and "503" in r.getMessage()]


def test_a_line_during_a_check_gets_a_whole_check_of_its_own() -> None:
    fake = Fake(probes=3)

    async def scenario() -> None:
        fake.line("Traceback (most recent call last):", TRACEBACK)
        while fake.probed < 2:  # bounded by settle's caller: the check runs 3 probes at least
            await asyncio.sleep(0.001)
        fake.line("RuntimeError: Engine step failed", "RuntimeError: Engine")
        fake.answers = [None, None, "down"]  # the third probe after the second line fails
        await fake.settle()

    run(scenario)
    assert fake.errors == ["RuntimeError: Engine"] and fake.probed == 5


def test_the_warning_is_rate_limited_and_counts_the_lines(caplog: pytest.LogCaptureFixture) -> None:
    fake = Fake(probes=1)

    async def scenario() -> None:
        with caplog.at_level(logging.DEBUG, logger="bakery.late_errors"):
            for at in (0.0, 1.0, 2.0, late_errors.WARN_EVERY + 1):
                fake.now = at
                fake.line(f"Traceback (most recent call last): at {at}", TRACEBACK)
                await fake.settle()

    run(scenario)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("1 error line(s)") and warnings[1].startswith("3 error line(s)"), warnings
    assert warnings[1].endswith(f"at {late_errors.WARN_EVERY + 1}") and fake.errors == []
    # The checks in between still say what they decided, at debug level (one line each).
    quiet = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and HELD in r.getMessage()]
    assert [m.rsplit(" at ", 1)[1] for m in quiet] == ["1.0", "2.0"], quiet


def test_an_errored_worker_takes_every_line() -> None:
    fake = Fake()
    fake.metrics.model_metrics.error_msg = "Healthcheck failed with status: 500"

    async def scenario() -> None:
        fake.line("Traceback (most recent call last):", TRACEBACK)
        await fake.settle()

    run(scenario)
    assert fake.errors == [TRACEBACK] and fake.probed == 0


def test_the_exit_prefix_is_the_one_the_entry_point_writes() -> None:
    """worker/boot/supervise.py writes `INFO exited: <program> ...` into MODEL_LOG; every engine's exit
    line starts with late_errors' prefix."""
    sys.path.insert(0, str(HERE.parents[1] / "worker" / "boot"))
    import supervise

    assert supervise.EXIT_LINE.format(name="vllm", how="exit status 1", reason="not expected").startswith(
        late_errors.EXIT_PREFIX + "vllm (")
    assert VLLM_ERRORS[0].startswith(late_errors.EXIT_PREFIX)


def test_the_bounds_are_read_from_the_environment() -> None:
    warnings: list[str] = []
    assert late_errors.load({}) == late_errors.DEFAULT_BOUNDS == late_errors.Bounds(4, 1.0)
    bounds = late_errors.load({late_errors.PROBES_VAR: "2", late_errors.INTERVAL_VAR: "0.5"})
    assert (bounds.probes, bounds.interval, bounds.healthy_seconds) == (2, 0.5, 0.5)
    assert bounds.longest_seconds == 2 * late_errors.PROBE_TIMEOUT + 0.5
    assert late_errors.load({late_errors.PROBES_VAR: "0", late_errors.INTERVAL_VAR: "-1"}, warnings) \
        == late_errors.DEFAULT_BOUNDS
    assert len(warnings) == 2 and late_errors.PROBES_VAR in warnings[0] and late_errors.INTERVAL_VAR in warnings[1]


# --------------------------------------------------------------------------- with the real SDK


def vllm_prefix(marker: str) -> str:
    """vLLM's prefix of an ERROR record's lines, with `marker` as the source file's name."""
    return f"(APIServer pid=4242) ERROR 12-01 10:00:00 [{marker}.py:1234] "


def held(marker: str) -> str:
    """late_errors' line when the check of the traceback `marker` ended with the health holding."""
    return f"{HELD}; last: {vllm_prefix(marker)}{TRACEBACK}"


def handled_traceback(marker: str) -> str:
    """A traceback as vLLM logs a handled one (logger.exception: every line with the record's prefix,
    joined by \\r\\n), for an error in one request; `marker` is in each line's prefix (the worker's
    lines about it name the line, so a test finds them by it)."""
    prefix = vllm_prefix(marker)
    lines = [f"Error in chat completion stream generator ({marker}).", TRACEBACK,
             '  File "/opt/venv/lib/python3.12/site-packages/vllm/entrypoints/openai/serving.py", line 1234, '
             "in chat_completion_stream_generator",
             "    raise ValueError(message)", f"ValueError: one request's problem ({marker})"]
    return "\r\n".join(prefix + line for line in lines) + "\n"


def append(log: Path, text: str) -> None:
    with log.open("a", encoding="utf-8") as out:
        out.write(text)


def errored(reports: ReportServer) -> list[str]:
    """The error_msg of every errored status report so far."""
    return [str(s["error_msg"]) for s in reports.statuses() if s.get("error_msg")]


def wait_for_text(worker: Proc, text: str, reports: ReportServer, timeout: float, start: int = 0) -> None:
    """Wait until the worker's output (after `start`) has `text`; fail at once on an errored report."""
    deadline = time.monotonic() + timeout
    while text not in worker.text[start:]:
        assert not errored(reports), f"errored while waiting for {text!r}: {errored(reports)}\n{worker.text[-3000:]}"
        assert time.monotonic() < deadline, f"no {text!r} within {timeout} s:\n{worker.text[-3000:]}"
        time.sleep(0.05)


def after_a_health_check(worker: Proc, reports: ReportServer) -> None:
    """Return right after one of the SDK's own 10 s health checks passed: the next one is ~10 s away,
    so what fails /health now is seen by late_errors' probe, not by the SDK's check."""
    wait_for_text(worker, SDK_HEALTHY, reports, 15, start=len(worker.text))


def wait_errored(reports: ReportServer, error: str, timeout: float) -> float:
    """Wait for a status report with error_msg `error`; the seconds it took."""
    started = time.monotonic()
    reports.wait_status(lambda s: s.get("error_msg") == error, timeout=timeout)
    return time.monotonic() - started


def test_a_handled_traceback_after_load_leaves_the_worker_ready(harness: Harness, worker_python: Path) -> None:
    """(1) A traceback in vLLM's format appended while /health answers 200: the SDK matches it, the
    worker is not reported errored, and a signed request is still served."""
    assert TRACEBACK in VLLM_ERRORS
    key = make_signing_key(worker_python)
    reports = harness.report_server(key.pem)
    engine = harness.standin("vllm")
    served = harness.serve("vllm", engine, reports, UNSECURED=None, MODEL_NAME=MODEL)
    append(engine.log, handled_traceback("late_1"))
    bounds = late_errors.DEFAULT_BOUNDS
    wait_for_text(served.worker, held("late_1"), reports, bounds.longest_seconds + 15)
    assert SDK_MATCHED in served.worker.text  # the SDK did match the line: it was held, not missed
    signed = {"signature": key.sign(served.url), "url": served.url}
    status, body, _ = post_enveloped(served.port, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 4},
                                     reqnum=7301, auth=signed)
    assert status == 200, body
    # A report made after that request (its 4 units served): an errored worker's would say so (the SDK
    # never clears error_msg).
    reports.wait_status(lambda s: s.get("cur_perf") == pytest.approx(4.0), timeout=20)
    assert errored(reports) == [], errored(reports)


def start_guard_engine(harness: Harness) -> Engine:
    slot = harness.slot("engine")
    return harness.engine([sys.executable, str(GUARD_ENGINE), "--port", str(slot.port), "--log", str(slot.log)],
                          slot, output=harness.tmp / "engine.out")


def tell_engine(engine: Engine, prompt: str) -> None:
    """A request straight to the guard engine (not through the worker)."""
    data = json.dumps({"prompt": prompt}).encode()
    request = urllib.request.Request(f"{engine.url}/v1/completions", data=data, method="POST",  # noqa: S310
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 (loopback http)
        assert response.status == 200


def test_an_error_line_with_a_failing_health_endpoint_errors(harness: Harness) -> None:
    """(2) The engine still serves but /health answers 500: a traceback then counts, and the errored
    report leaves within the check and the SDK's next 1 s tick, before the SDK's own check would see it."""
    engine = start_guard_engine(harness)
    errors = json.dumps(["INFO exited: llama", TRACEBACK])  # llama's grammar plus the traceback line
    served = harness.serve("llama", engine, LLAMA_MODEL="guard", MODEL_ERROR_LOG_MSGS=errors)
    assert served.reports is not None
    after_a_health_check(served.worker, served.reports)
    tell_engine(engine, "health 500")
    append(engine.log, handled_traceback("late_2"))
    took = wait_errored(served.reports, TRACEBACK, 8)
    assert COUNTED in served.worker.text and "answered 500" in served.worker.text, served.worker.text[-3000:]
    assert took < 8


def test_the_exit_line_errors_at_once(harness: Harness) -> None:
    """(3) The entry point's exit line counts without a health probe, and is reported at the next tick."""
    engine = harness.standin("vllm")
    served = harness.serve("vllm", engine, MODEL_NAME=MODEL)
    assert served.reports is not None
    append(engine.log, f"2026-12-01 10:00:00,000 {EXIT_LINE} (exit status 1; not expected)\n")
    took = wait_errored(served.reports, EXIT_LINE, 10)
    assert took < 5, f"the errored report took {took:.1f} s"
    assert CHECKING not in served.worker.text  # no probe delayed it


def test_an_error_line_before_load_errors_as_before(harness: Harness) -> None:
    """(4) Before the model is loaded every error line counts (here no engine ever comes up)."""
    slot = harness.slot("vllm")
    append(slot.log, handled_traceback("early"))
    served = harness.worker("vllm", slot, MODEL_NAME=MODEL)
    assert served.reports is not None
    wait_errored(served.reports, TRACEBACK, 30)
    assert CHECKING not in served.worker.text and SDK_READY not in served.worker.text


def test_after_a_held_line_a_real_failure_still_errors(harness: Harness) -> None:
    """(5) A handled traceback is held; then the engine dies (killed: no exit line on the host) and
    logs another: the SDK still reads on, the probe finds nothing listening, the worker is errored."""
    engine = harness.standin("vllm")
    served = harness.serve("vllm", engine, MODEL_NAME=MODEL)
    assert served.reports is not None and engine.proc is not None
    append(engine.log, handled_traceback("held"))
    wait_for_text(served.worker, held("held"), served.reports, late_errors.DEFAULT_BOUNDS.longest_seconds + 15)
    after_a_health_check(served.worker, served.reports)
    os.killpg(engine.proc.popen.pid, signal.SIGKILL)
    engine.proc.popen.wait(10)
    append(engine.log, handled_traceback("dying"))
    wait_errored(served.reports, TRACEBACK, 8)
    assert COUNTED in served.worker.text, served.worker.text[-3000:]
