"""The per-request lines of a served request are dropped unless BAKERY_LOG_REQUESTS is true.

vastai 1.9.1 logs `Starting Request N`, `posting to endpoint: ...`, `Request N succeeded` and
`Ending Request N` for every request, and aiohttp an access line; those go, except the access line of
an answer that is not 2xx (the only trace of a refused request). Every other line of the SDK
(readiness, benchmark, errors, status reports, sessions) must stay. Unit tests of the rules and the
filters, then the real SDK.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

import tests.worker.helpers  # noqa: F401 (puts worker/ on sys.path first)
from app import core, output, worker_config
from tests.worker.helpers import SDK_READY, WORKER_DIR, Harness, baked_facts, post_enveloped
from workers.vllm.worker import DEFAULTS as VLLM

PLATFORM = {"CONTAINER_ID": "7", "REPORT_ADDR": "http://127.0.0.1:9", "PUBLIC_IPADDR": "127.0.0.1",
            "WORKER_PORT": "3000", "VAST_TCP_PORT_3000": "41000", **baked_facts("vllm")}
VAR = "BAKERY_LOG_REQUESTS"

# The four lines, as vastai 1.9.1 words them (metrics.py, backend.py), for one plain request and
# for one inside a session.
DROPPED = [
    "Starting Request 42",
    "posting to endpoint: '/v1/completions', payload keys: ['prompt', 'max_tokens', 'model']",
    "Request 42 succeeded",
    "Ending Request 42",
    "Starting Request 3 in Session 17",
    "posting to endpoint: '/v1/chat/completions', payload keys: []",
    "Request 3 in Session 17 succeeded",
    "Ending Request 3 in Session 17",
]
# Other SDK lines (all of them DEBUG unless said): they must stay.
KEPT = [
    "Starting Session 17",  # a session's own start and end, not a request's
    "Ending Session 17",
    "Canceling Request 42",
    "Rejecting Request 42",
    "Request 42 cancelled (client disconnect)",
    "Starting work on request 42",
    "posting multipart to endpoint: '/v1/audio', fields: ['file']",
    "Starting Worker Server...",
    "Starting TCP session with model server at http://127.0.0.1:18000",
    "Starting HTTP-only server for /session/end on port 3001",
    "Running benchmark",
    "Performing benchmark on endpoint /v1/completions",
    "Healthcheck confirmed - marking model as loaded",
    "Deleting requests: [42, 43]",
    "\n#################### Worker Status ####################\n{}\n#######",
    "Got log line indicating error: RuntimeError: Engine core initialization failed",
    "Request 42 succeeded twice",  # not the SDK's wording: kept
    "Ending Request 42 now",
    "Request 42 succeeded\nRequest 43 succeeded",
]


def settings(**env: str) -> core.Settings:
    return worker_config.load_settings(VLLM, {**PLATFORM, **env})


# --------------------------------------------------------------------------- the variable


def test_default_drops_the_lines() -> None:
    """Unset or blank: the lines are dropped, no warning."""
    for s in (settings(), settings(**{VAR: ""}), settings(**{VAR: "  "})):
        assert s.log_requests is False
        assert s.warnings == []


@pytest.mark.parametrize("raw", ["true", "TRUE", " True ", "1", "yes", "Yes"])
def test_true_keeps_the_lines(raw: str) -> None:
    s = settings(**{VAR: raw})
    assert s.log_requests is True and s.warnings == []


@pytest.mark.parametrize("raw", ["false", "False", "0", "no", " NO "])
def test_false_drops_the_lines(raw: str) -> None:
    s = settings(**{VAR: raw})
    assert s.log_requests is False and s.warnings == []


@pytest.mark.parametrize("raw", ["ture", "2", "on", "off", "y", "truee", "-1", "true false"])
def test_anything_else_warns_once_and_drops(raw: str) -> None:
    """Strict: a typo is not silently taken either way; one warning naming the variable, default."""
    s = settings(**{VAR: raw})
    assert s.log_requests is False
    assert len(s.warnings) == 1
    assert s.warnings[0].startswith(f"{VAR}={raw!r} is neither true nor false")


def test_the_startup_line_says_which() -> None:
    assert core.describe(settings()).endswith(" request_lines=dropped")
    assert core.describe(settings(**{VAR: "true"})).endswith(" request_lines=logged")


# --------------------------------------------------------------------------- the filter


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def sdk_logger() -> tuple[logging.Logger, Recorder]:
    """A logger named like the SDK's (by file path), DEBUG, recording what passes its filters."""
    logger = logging.getLogger(f"/opt/bakery/venv/site-packages/vastai/serverless/server/lib/test-{time.time_ns()}.py")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    recorder = Recorder()
    logger.addHandler(recorder)
    return logger, recorder


def test_filter_drops_exactly_the_four_debug_lines(sdk_logger: tuple[logging.Logger, Recorder]) -> None:
    logger, recorder = sdk_logger
    logger.addFilter(output.PerRequestLines())
    for message in DROPPED + KEPT:
        logger.debug(message)
    assert recorder.messages == KEPT


def test_filter_keeps_them_above_debug(sdk_logger: tuple[logging.Logger, Recorder]) -> None:
    """Only the SDK's DEBUG lines are dropped: the same words at INFO or ERROR are not these lines."""
    logger, recorder = sdk_logger
    logger.addFilter(output.PerRequestLines())
    logger.info(DROPPED[0])
    logger.error(DROPPED[2])
    logger.error("Request 42 errored: boom")
    assert recorder.messages == [DROPPED[0], DROPPED[2], "Request 42 errored: boom"]


def test_filter_reads_the_formatted_message(sdk_logger: tuple[logging.Logger, Recorder]) -> None:
    """%-style arguments are matched after formatting, as the line would be printed."""
    logger, recorder = sdk_logger
    logger.addFilter(output.PerRequestLines())
    logger.debug("Starting Request %d", 7)
    logger.debug("Starting %s", "Session 7")
    assert recorder.messages == ["Starting Session 7"]


def test_quiet_requests_filters_the_sdk_module_loggers(monkeypatch: pytest.MonkeyPatch,
                                                       sdk_logger: tuple[logging.Logger, Recorder]) -> None:
    """The filter goes on each named module's `log`, once however often it is called; a module
    without one is reported (a changed SDK) and nothing else is touched."""
    logger, recorder = sdk_logger
    monkeypatch.setitem(sys.modules, "fake_sdk.metrics", types.SimpleNamespace(log=logger))
    monkeypatch.setitem(sys.modules, "fake_sdk.renamed", types.SimpleNamespace(logger=logger))
    names = ("fake_sdk.metrics", "fake_sdk.renamed", "fake_sdk.absent")
    access = f"fake_aiohttp.access.{time.time_ns()}"
    assert core.quiet_requests(names, access) == ["fake_sdk.renamed", "fake_sdk.absent"]
    assert core.quiet_requests(names, access) == ["fake_sdk.renamed", "fake_sdk.absent"]
    assert sum(isinstance(f, output.PerRequestLines) for f in logger.filters) == 1
    assert [type(f) for f in logging.getLogger(access).filters] == [output.AccessLines]
    logger.debug("Ending Request 1")
    logger.debug("Running benchmark")
    assert recorder.messages == ["Running benchmark"]


def test_quiet_requests_makes_no_record_for_a_dropped_line(monkeypatch: pytest.MonkeyPatch,
                                                           sdk_logger: tuple[logging.Logger, Recorder]) -> None:
    """The SDK's `log.debug` returns before any record is made for the four lines (making them was
    ~9 % of the worker's CPU per request); other lines, %-style calls and other levels go on."""
    logger, recorder = sdk_logger
    made: list[str] = []
    monkeypatch.setattr(logger, "makeRecord",
                        lambda *a, **k: made.append(a[4]) or logging.Logger.makeRecord(logger, *a, **k))
    monkeypatch.setitem(sys.modules, "fake_sdk.quiet", types.SimpleNamespace(log=logger))
    assert core.quiet_requests(("fake_sdk.quiet",), f"fake_aiohttp.access.{time.time_ns()}") == []
    core.quiet_requests(("fake_sdk.quiet",), f"fake_aiohttp.access.{time.time_ns()}")  # once is enough
    for message in DROPPED:
        logger.debug(message)
    logger.debug("Running benchmark")
    logger.debug("Starting Request %d", 7)  # with arguments: left to the filter, which drops it
    logger.info(DROPPED[0])
    assert made == ["Running benchmark", "Starting Request %d", DROPPED[0]]
    assert recorder.messages == ["Running benchmark", DROPPED[0]]


QUIET_ACCESS_PROBE = """
import logging, sys, types
from app import core
seen = []
class Keep(logging.Handler):
    def emit(self, record):
        seen.append(record.getMessage())
logger = logging.getLogger("quiet-access-probe")
logger.setLevel(logging.INFO)
logger.propagate = False
logger.addHandler(Keep())
cls = core.quiet_access_log_class()
access = cls(logger, '%r %s')
formatted = []
original = access._format_line
access._format_line = lambda *a: formatted.append(a[0].path) or original(*a)
for path, status in [("/v1/completions", 200), ("/session/create", 201), ("/v1/completions", 401),
                     ("/pyworker/update", 200), ("/v1/chat/completions", 204)]:
    request = types.SimpleNamespace(path=path, method="POST", version=(1, 1), remote="127.0.0.1", headers={})
    response = types.SimpleNamespace(status=status, body_length=0, headers={})
    access.log(request, response, 0.001)
print(len(seen), ",".join(formatted))
"""


def test_quiet_access_logger_skips_2xx_before_formatting(worker_python: Path) -> None:
    """With aiohttp (the worker venv): a model route's 2xx line is never formatted; a refusal's, and
    every /session and /pyworker line, are formatted and logged as before."""
    result = subprocess.run([str(worker_python), "-c", QUIET_ACCESS_PROBE], capture_output=True, text=True,
                            timeout=60, check=False, env={"PYTHONPATH": str(WORKER_DIR), "PATH": os.environ["PATH"]})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["3", "/session/create,/v1/completions,/pyworker/update"], result.stdout


def test_the_access_logger_is_aiohttps() -> None:
    assert output.ACCESS_LOGGER == "aiohttp.access"


@pytest.mark.parametrize(("status", "kept"), [(200, False), (201, False), (204, False), (299, False),
                                              (101, True), (304, True), (400, True), (401, True),
                                              (422, True), (429, True), (500, True), (503, True)])
def test_access_filter_drops_only_2xx(status: int, kept: bool, sdk_logger: tuple[logging.Logger, Recorder]) -> None:
    """aiohttp passes the status as the record's `response_status` (its `extra`)."""
    logger, recorder = sdk_logger
    logger.addFilter(output.AccessLines())
    logger.info(f'127.0.0.1 "POST /v1/completions HTTP/1.1" {status} 10', extra={"response_status": status})
    assert bool(recorder.messages) is kept


def test_access_filter_keeps_records_without_a_status(sdk_logger: tuple[logging.Logger, Recorder]) -> None:
    """aiohttp's own "Error in logging" and anything else on the logger: not an access line, kept."""
    logger, recorder = sdk_logger
    logger.addFilter(output.AccessLines())
    logger.error("Error in logging")
    logger.info("200 looks like a status", extra={"response_status": "200"})
    assert recorder.messages == ["Error in logging", "200 looks like a status"]


def test_the_default_modules_are_the_sdks() -> None:
    assert output.SDK_REQUEST_LOGGERS == ("vastai.serverless.server.lib.metrics",
                                        "vastai.serverless.server.lib.backend")


# --------------------------------------------------------------------------- the real SDK


def _request_lines(out: str, reqnum: int) -> list[str]:
    """The SDK's start/succeeded/end lines of request `reqnum` in the worker's output."""
    wanted = (f"Starting Request {reqnum}", f"Request {reqnum} succeeded", f"Ending Request {reqnum}")
    return [line for line in out.splitlines() if line.endswith(wanted)]


@pytest.mark.slow
@pytest.mark.parametrize("log_requests", [None, "false", "true"])
def test_real_sdk_lines(log_requests: str | None, harness: Harness) -> None:
    """The real SDK behind start_server.sh: without the variable (or false) no request prints its four
    lines, and readiness, benchmark, status-report and access lines all stay; true keeps all four."""
    served = harness.worker("vllm", harness.standin("vllm"), VLLM_MODEL="standin-model", **{VAR: log_requests})
    worker, port, report_server = served.worker, served.port, harness.reports
    worker.wait_for(SDK_READY, timeout=60)
    for reqnum in (501, 502, 503):
        status, body, _ = post_enveloped(port, "/v1/chat/completions",
                                         {"model": "standin-model", "messages": [{"role": "user", "content": "hi"}],
                                          "max_tokens": 4}, reqnum=reqnum)
        assert status == 200, body
    status, body, _ = post_enveloped(port, "/v1/completions", {"prompt": "hi"}, reqnum=504,
                                     auth={"url": None})  # no auth_data.url: the SDK answers 422
    assert status == 422, body
    # About a second later the SDK reports the finished requests (a DEBUG line) and a status with
    # the served workload: once both are in, the output of those requests is complete.
    worker.wait_for(r"Deleting requests: \[[^\]]*\b503\b", timeout=30, regex=True)
    report_server.wait_status(lambda status: status.get("cur_perf", 0) > 0)
    out = worker.text
    logged = log_requests == "true"
    for reqnum in (501, 502, 503):
        assert len(_request_lines(out, reqnum)) == (3 if logged else 0), reqnum
    # the benchmark posts to /v1/completions: the chat route's posting lines are these requests'
    assert out.count("posting to endpoint: '/v1/chat/completions'") == (3 if logged else 0)
    for kept in ("HTTP servers started, beginning log tracking", "Running benchmark", "Benchmark complete",
                 SDK_READY, "Worker Status", '"POST /v1/completions HTTP/1.1" 422'):
        assert kept in out, kept
    # aiohttp's access line of a 2xx answer goes with the four lines; the 422 above stays either way
    assert out.count('"POST /v1/chat/completions HTTP/1.1" 200') == (3 if logged else 0)
    assert f"request_lines={'logged' if logged else 'dropped'}\n" in out
    assert "bakery-worker: warning" not in out
