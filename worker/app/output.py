"""What the worker writes: its own lines (one write each), its exit statuses, and the SDK's per-request
and access lines it drops unless BAKERY_LOG_REQUESTS is true (they cost CPU per request)."""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from typing import Any, TextIO

from control import sdk_seam

# The SDK logs this (and then retries forever) when it cannot start its HTTP servers.
SDK_LAUNCH_FAILURE = "Worker Server failed to launch"


# The SDK's four DEBUG lines per proxied request (vastai 1.9.1: `Starting Request N`, `posting to
# endpoint: '<route>', payload keys: [...]`, `Request N succeeded`, `Ending Request N`; a request in a
# session is `Request N in Session M`). Dropped unless BAKERY_LOG_REQUESTS is true; see quiet_requests().
_REQUEST_ID = r"Request \d+(?: in Session \d+)?"


PER_REQUEST_LINE = re.compile(
    rf"(?:Starting {_REQUEST_ID}|{_REQUEST_ID} succeeded|Ending {_REQUEST_ID})\Z|posting to endpoint: '"
)


# The SDK modules that log those lines, each through its module-level `log`.
SDK_REQUEST_LOGGERS = (sdk_seam.METRICS_MODULE, sdk_seam.BACKEND_MODULE)


# aiohttp's access logger: one INFO line per request; only the 2xx ones are dropped (see AccessLines).
ACCESS_LOGGER = "aiohttp.access"


# Access lines of these paths are always kept, 2xx too.
AUDITED_PATHS = ("/session", "/pyworker")


EXIT_CONFIG = 2  # bad or missing environment


EXIT_PORT_BUSY = 3  # the worker's port is taken (another worker or another process)


EXIT_SDK = 4  # the SDK is missing or could not start


def line_out(stream: TextIO, line: str) -> None:
    """Write `line` and its newline in one write. The worker runs unbuffered (PYTHONUNBUFFERED), so
    print() would make two writes to the container's output, and the entry point's lines, written
    to the same pipe, could land between a line and its newline (glued onto it)."""
    stream.write(line + "\n")
    stream.flush()


def say(message: str) -> None:
    line_out(sys.stdout, message)


def warn(message: str) -> None:
    line_out(sys.stderr, f"bakery-worker: warning: {message}")


def fail(message: str, code: int) -> None:
    line_out(sys.stderr, f"bakery-worker: error: {message}")
    raise SystemExit(code)


def watch_log_file(path: str, first: float = 60.0, every: float = 300.0,
                   stop: threading.Event | None = None) -> threading.Thread:
    """Warn on stderr while `path` (MODEL_LOG) does not exist: the SDK waits for it silently, forever.

    Upstream incident: a wrong log path showed only as "no benchmark in 1800 s". The first warning
    comes after `first` seconds, then every `every` seconds, until the file appears or `stop` is set.
    """
    halt = stop or threading.Event()

    def loop() -> None:
        waited, delay = 0.0, first
        while not os.path.exists(path):
            if halt.wait(delay):
                return
            waited += delay
            if os.path.exists(path):
                return
            warn(f"MODEL_LOG={path} still does not exist after {waited:.0f} s: the worker waits for the "
                  "engine's log there (wrong MODEL_LOG? engine not started?)")
            delay = every

    thread = threading.Thread(target=loop, name="bakery-log-watch", daemon=True)
    thread.start()
    return thread


class LaunchFailureExit(logging.Handler):
    """Exit the process when the SDK reports it could not start its servers (it would loop forever)."""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(SDK_LAUNCH_FAILURE):
            line_out(sys.stderr, f"bakery-worker: error: {message}")
            sys.stdout.flush()
            os._exit(EXIT_PORT_BUSY if "address already in use" in message.lower() else EXIT_SDK)


class PerRequestLines(logging.Filter):
    """Drops the SDK's four DEBUG lines per proxied request (PER_REQUEST_LINE); every other line passes.

    Each line costs the worker's only thread a format and a write, and in an image the container log
    driver's CPU on the same cores: in an image the worker proxies ~1.3x as many
    requests without them (BENCHMARKS.md). Readiness, benchmark, error, status-report
    and session lines all stay.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno != logging.DEBUG or PER_REQUEST_LINE.match(record.getMessage()) is None


class AccessLines(logging.Filter):
    """Drops aiohttp's access line of a model request answered 2xx; every other status (the SDK answers
    a bad envelope 422, a bad signature 401, a full queue 429, an engine failure 500, none of them with
    a line of its own), every /session/ and /pyworker/ line (rare, and what a reviewer audits) and
    every other record passes.

    aiohttp gives the status to the record as `response_status` and the request line as
    `first_request_line`; a record without a status passes.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "response_status", None)
        if not (isinstance(status, int) and 200 <= status < 300):
            return True
        line = getattr(record, "first_request_line", "")
        parts = line.split(" ", 2) if isinstance(line, str) else []
        return is_audited(parts[1].split("?", 1)[0] if len(parts) > 1 else "")


def _add_filter_once(logger: logging.Logger, kind: type[logging.Filter]) -> None:
    if not any(isinstance(f, kind) for f in logger.filters):
        logger.addFilter(kind())


class _QuietDebug:
    """A logger's `debug` that returns at once for a per-request line (PER_REQUEST_LINE) before any
    record is made: making and filtering the SDK's four records was ~9 % of the worker's CPU per
    request (a py-spy profile, issue 14). Any other call goes to the logger's own `debug`."""

    drops_request_lines = True  # read by forward.py: a line this drops is not worth formatting

    def __init__(self, logger: logging.Logger) -> None:
        self.own = type(logger).debug.__get__(logger)

    def __call__(self, msg: object, *args: Any, **kwargs: Any) -> None:
        if not args and isinstance(msg, str) and PER_REQUEST_LINE.match(msg):
            return
        self.own(msg, *args, **kwargs)


def quiet_requests(module_names: tuple[str, ...] = SDK_REQUEST_LOGGERS,
                   access_logger: str = ACCESS_LOGGER) -> list[str]:
    """Drop the SDK's per-request lines on the loggers of `module_names` (their module-level `log`):
    their `debug` returns early for those lines, and PerRequestLines filters what still gets made;
    put AccessLines on the logger named `access_logger`.

    A filter on the logger itself drops a record before any handler sees it (a root handler's
    filter would still run the others). Returns the modules whose logger could not be found (a
    changed SDK): their lines are then not dropped, nothing else changes.
    """
    missing = []
    for name in module_names:
        logger = getattr(sys.modules.get(name), "log", None)
        if isinstance(logger, logging.Logger):
            _add_filter_once(logger, PerRequestLines)
            if not isinstance(logger.__dict__.get("debug"), _QuietDebug):
                logger.debug = _QuietDebug(logger)  # type: ignore[method-assign]
        else:
            missing.append(name)
    _add_filter_once(logging.getLogger(access_logger), AccessLines)
    return missing


def is_audited(path: str) -> bool:
    """Whether access lines of `path` are always kept (AUDITED_PATHS and what is under them)."""
    return any(path == p or path.startswith(p + "/") for p in AUDITED_PATHS)


def quiet_access_log_class() -> type:
    """aiohttp's AccessLogger, but a model request answered 2xx is skipped before its line is
    formatted (AccessLines would drop it after: formatting cost ~3 % of the worker's CPU per request).
    Passed to the SDK's AppRunner (the guards' web shim) when per-request lines are dropped."""
    from aiohttp.web_log import AccessLogger

    class QuietAccessLogger(AccessLogger):
        def log(self, request: Any, response: Any, time: float) -> None:
            if 200 <= response.status < 300 and not is_audited(request.path):
                return
            super().log(request, response, time)

    return QuietAccessLogger
