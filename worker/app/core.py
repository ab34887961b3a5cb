"""Shared core of bakery's OpenAI-compatible workers (vllm, sglang, llama; openai is an alias).

vLLM, SGLang and llama.cpp serve the same OpenAI surface, so one worker proxies all three; each
engine's `worker.py` only supplies an `EngineDefaults`. The routes it serves (OPENAI_ROUTES), the one
it benchmarks (BENCHMARK_ROUTE), uploads and workloads come from routes.py (docs/routes.md); the
guards on port 3000 from guards.py (docs/security.md). Every default can be overridden from the
environment (the image bakes per-engine values; see docs/architecture.md, "Environment contract
(worker)").

The environment is resolved by plain functions that take a mapping, so every rule is unit-tested
without the SDK. The `vastai` SDK is imported only by `run()`, inside the worker's own venv.
"""

from __future__ import annotations

import errno
import fcntl
import importlib
import inspect
import logging
import math
import os
import re
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urljoin, urlsplit

from app import event_loop, serving
from config import routes, table, uploads
from control import own_handler, queue_wait, sdk_seam
from engine import engine_warm, forward, native_relay
from front import processes
from logs import late_errors, stages
from policy import admission, drain, guards, references, signature_memo

DEFAULT_SERVER_URL = "http://127.0.0.1:18000"
DEFAULT_HEALTH_ENDPOINT = "/health"
DEFAULT_INFO_LINES = ('"message":"Download',)
# Upstream's benchmark budget (pyworker #88). Runs and concurrency are the benchmarked route's own
# (routes.ROUTE_TABLE: 3 x 10 for text) unless BENCHMARK_RUNS / BENCHMARK_CONCURRENCY are set.
DEFAULT_BENCHMARK_MAX_TOKENS = 500
DEFAULT_READINESS = "logs"
READINESS_MODES = ("logs", "healthcheck")
DEFAULT_READINESS_TIMEOUT = 1800.0
DEFAULT_HEALTHCHECK_PROBE_TIMEOUT = 30.0
# Upstream handler settings: requests may run in parallel, queued up to 10 minutes.
MAX_QUEUE_TIME = 600.0
# Upstream's precedence for the served model id (pyworker #88), checked against the specs' model_var by
# tests/unit/test_engine_facts_agree.py. Inside an image the engine's own variable, which the image
# bakes by name (BAKERY_MODEL_VAR), comes right after MODEL_NAME, so any engine's works.
MODEL_ID_VARS = ("MODEL_NAME", "VLLM_MODEL", "SGLANG_MODEL", "LLAMA_MODEL")
MODEL_VAR_VAR = "BAKERY_MODEL_VAR"
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
WORDS_FILE = Path(__file__).with_name("benchmark_words.txt")
# The SDK logs this (and then retries forever) when it cannot start its HTTP servers.
SDK_LAUNCH_FAILURE = "Worker Server failed to launch"
# The SDK's four DEBUG lines per proxied request (vastai 1.9.1: `Starting Request N`, `posting to
# endpoint: '<route>', payload keys: [...]`, `Request N succeeded`, `Ending Request N`; a request in a
# session is `Request N in Session M`). Dropped unless BAKERY_LOG_REQUESTS is true; see quiet_requests().
LOG_REQUESTS_VAR = "BAKERY_LOG_REQUESTS"
EVENT_LOOP_VAR = "BAKERY_EVENT_LOOP"
FRONT_VAR = "BAKERY_FRONT"
RELAY_VAR = "BAKERY_RELAY"
FRONTS = ("wire", "aiohttp")
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
# Where the SDK's request envelope type lives; its from_json_msg calls inspect.signature 7x per request.
SDK_AUTH_DATA = (sdk_seam.DATA_TYPES_MODULE, sdk_seam.hook("auth_signature").attr)
SDK_JSON_ERROR = sdk_seam.hook("json_data_exception").attr  # what that from_json_msg raises for missing fields
TRUE_WORDS, FALSE_WORDS = table.TRUE_WORDS, table.FALSE_WORDS

EXIT_CONFIG = 2  # bad or missing environment
EXIT_PORT_BUSY = 3  # the worker's port is taken (another worker or another process)
EXIT_SDK = 4  # the SDK is missing or could not start

_PLATFORM_HINT = "normally set by the Vast.ai platform when it launches the instance"


class ConfigError(Exception):
    """The environment cannot run a worker; each item of `lines` is one user-facing line."""

    def __init__(self, lines: list[str]):
        super().__init__("; ".join(lines))
        self.lines = lines


class PortBusy(Exception):
    """The worker's port (or the SDK's internal HTTP port) is already taken."""


@dataclass(frozen=True)
class EngineDefaults:
    """What one engine's image would bake: its name, log file and log grammar.

    Each field is the fallback for an environment variable: `model_log` for MODEL_LOG,
    `load_lines` for MODEL_LOAD_LOG_MSG, `error_lines` for MODEL_ERROR_LOG_MSGS, `info_lines` for
    MODEL_INFO_LOG_MSGS, `health_endpoint` for MODEL_HEALTH_ENDPOINT, `ready_connections` for
    BAKERY_ENGINE_READY_CONNECTIONS (engine_warm.py), `front_processes` for BAKERY_FRONT_PROCESSES
    (processes.py).
    """

    engine: str
    model_log: str
    load_lines: tuple[str, ...]
    error_lines: tuple[str, ...]
    info_lines: tuple[str, ...] = DEFAULT_INFO_LINES
    health_endpoint: str = DEFAULT_HEALTH_ENDPOINT
    ready_connections: int = 0
    # BAKERY_FRONT_PROCESSES's default; None: one when the worker may run on 2 CPUs or more (processes.py)
    front_processes: int | None = 0


@dataclass(frozen=True)
class Settings:
    """Everything `run()` needs, resolved from an `EngineDefaults` and the environment."""

    engine: str
    backend: str
    model_log: str
    server_url: str  # scheme://host:port, as given or defaulted
    server_base: str  # scheme://host, what the SDK's WorkerConfig.model_server_url wants
    server_port: int
    healthcheck_url: str
    load_lines: list[str]
    error_lines: list[str]
    info_lines: list[str]
    model_id: str | None
    benchmark_runs: int  # of the benchmarked route: BENCHMARK_RUNS, else the route's own
    benchmark_concurrency: int  # likewise BENCHMARK_CONCURRENCY
    benchmark_max_tokens: int
    readiness: str
    readiness_timeout: float
    healthcheck_probe_timeout: float
    worker_port: int
    worker_http_port: int
    log_requests: bool = False
    loop_choice: str = event_loop.DEFAULT  # BAKERY_EVENT_LOOP: the loop the worker runs on (event_loop.py)
    front: str = FRONTS[0]  # BAKERY_FRONT: wire.py reads port 3000's connections first, or aiohttp.web alone
    relay: str = native_relay.DEFAULT  # BAKERY_RELAY: bakery-relay moves streamed bodies, or Python does
    relay_program: str | None = None  # BAKERY_RELAY_PROGRAM
    front_processes: int = 0  # BAKERY_FRONT_PROCESSES (processes.py)
    engine_keep_warm: float = engine_warm.DEFAULT  # BAKERY_ENGINE_KEEP_WARM: seconds (engine_warm.py)
    engine_ready_connections: int = 0  # BAKERY_ENGINE_READY_CONNECTIONS (engine_warm.py)
    unsecured: bool = False  # UNSECURED, read strictly: the SDK is handed this reading (run())
    # OPENAI_ROUTES, BENCHMARK_ROUTE, the upload limits (routes.load_route_settings)
    routes: routes.RouteSettings = field(
        default_factory=lambda: routes.RouteSettings(routes.DEFAULT_ROUTES, routes.DEFAULT_BENCHMARK_ROUTE))
    warnings: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- environment rules


_value = table.value  # the raw text, or None when unset or blank (blank counts as unset)
parse_lines = table.parse_lines


def env_lines(
    env: Mapping[str, str], name: str, default: tuple[str, ...], warnings: list[str]
) -> list[str]:
    """A log-line list from `name`; the default when unset, blank or holding no line."""
    return table.parse(env, name, "lines", "warn", list(default), warnings)


def env_positive_int(env: Mapping[str, str], name: str, default: int, warnings: list[str]) -> int:
    """A positive integer from `name`; anything else (text, 0, negative, fraction) → default."""
    return table.parse(env, name, "int", "warn", default, warnings)


def env_positive_float(
    env: Mapping[str, str], name: str, default: float, warnings: list[str]
) -> float:
    """A positive finite number from `name`; text, 0, negative, inf or nan → default."""
    return table.parse(env, name, "number", "warn", default, warnings)


def env_bool(env: Mapping[str, str], name: str, default: bool, warnings: list[str]) -> bool:
    """A boolean from `name`: true/1/yes or false/0/no (any case); anything else → default, one warning."""
    return table.parse(env, name, "bool", "warn", default, warnings)


def model_id_vars(env: Mapping[str, str]) -> tuple[str, ...]:
    """Where the served model id is looked for, in order: MODEL_NAME, the variable the image names in
    BAKERY_MODEL_VAR (when it is a variable name), then upstream's engine variables."""
    baked = (_value(env, MODEL_VAR_VAR) or "").strip()
    names = [MODEL_ID_VARS[0], *([baked] if _VAR_NAME.match(baked) else []), *MODEL_ID_VARS[1:]]
    return tuple(dict.fromkeys(names))


def resolve_model_id(env: Mapping[str, str]) -> str | None:
    """The served model id: the first non-blank of model_id_vars(env) (MODEL_NAME, the image's own
    model variable, then VLLM_MODEL, SGLANG_MODEL, LLAMA_MODEL)."""
    for name in model_id_vars(env):
        value = _value(env, name)
        if value is not None:
            return value.strip()
    return None


def resolve_server(env: Mapping[str, str]) -> tuple[str, str, int]:
    """MODEL_SERVER_URL → (url, scheme://host, port). Only an origin is allowed (no path)."""
    url = (_value(env, "MODEL_SERVER_URL") or DEFAULT_SERVER_URL).strip().rstrip("/")
    bad = ConfigError([
        f"MODEL_SERVER_URL={url!r} is not an engine server address: give scheme, host and port "
        f"only, e.g. {DEFAULT_SERVER_URL}"
    ])
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise bad
    if parts.path or parts.query or parts.fragment or parts.username or parts.password:
        raise bad
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise bad from None
    host = parts.hostname
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    base = f"{parts.scheme}://{host}"
    return f"{base}:{port}", base, port


def resolve_health_url(endpoint: str, server_url: str) -> str:
    """A path resolves against the engine server's URL; a full URL is used as is."""
    endpoint = endpoint.strip()
    if urlsplit(endpoint).scheme in ("http", "https"):
        return endpoint
    return urljoin(server_url + "/", endpoint)


def check_platform_env(env: Mapping[str, str]) -> tuple[int, int]:
    """Check the variables the SDK reads unguarded; return (WORKER_PORT, the SDK's HTTP port).

    Raises ConfigError with one line per missing or malformed variable instead of letting the SDK
    die on a KeyError (or a ValueError) deep inside.
    """
    lines: list[str] = []
    for name in ("CONTAINER_ID", "REPORT_ADDR", "PUBLIC_IPADDR"):
        if _value(env, name) is None:
            lines.append(f"{name} is not set: it is {_PLATFORM_HINT}")
    container_id = _value(env, "CONTAINER_ID")
    if container_id is not None and not container_id.strip().lstrip("-").isdigit():
        lines.append(f"CONTAINER_ID={container_id!r} is not an integer (the instance id)")

    worker_port = http_port = 0
    raw_port = _value(env, "WORKER_PORT")
    if raw_port is None:
        lines.append(f"WORKER_PORT is not set: it is {_PLATFORM_HINT} (bakery images listen on 3000)")
    elif not raw_port.isdigit() or not 0 < int(raw_port) < 65536:
        lines.append(f"WORKER_PORT={raw_port!r} is not a port number")
    else:
        worker_port = int(raw_port)
        mapped = f"VAST_TCP_PORT_{raw_port}"
        if _value(env, mapped) is None:
            lines.append(
                f"{mapped} is not set: the Vast.ai platform sets VAST_TCP_PORT_<n> at launch only "
                f"for mapped ports, so the image must EXPOSE {raw_port} (bakery images EXPOSE 3000)"
            )
        raw_http = _value(env, "WORKER_HTTP_PORT")
        if raw_http is None:
            http_port = worker_port + 1
        elif raw_http.strip().isdigit() and 0 < int(raw_http) < 65536:
            http_port = int(raw_http)
        else:
            lines.append(f"WORKER_HTTP_PORT={raw_http!r} is not a port number")
    if lines:
        raise ConfigError(lines)
    return worker_port, http_port


def front_processes(env: Mapping[str, str], front: str, warnings: list[str], default: int | None = 0) -> int:
    """BAKERY_FRONT_PROCESSES (processes.count; `default` is the engine's), 0 unless the wire front reads
    port 3000 (a front process runs it): asked for with BAKERY_FRONT=aiohttp, a warning."""
    count = processes.count(env, warnings, default=default)
    if front == "wire" or count == 0:
        return count
    if table.is_set(env, processes.PROCESSES_VAR):
        warnings.append(f"{processes.PROCESSES_VAR}={count} needs {FRONT_VAR}=wire (a front process runs the wire "
                        "front); the worker serves alone")
    return 0


def load_settings(defaults: EngineDefaults, env: Mapping[str, str]) -> Settings:
    """Resolve every setting from `defaults` and `env`. Raises ConfigError on unusable input."""
    warnings: list[str] = []
    worker_port, http_port = check_platform_env(env)
    errors: list[str] = []
    unsecured = bool(table.read(env, "UNSECURED", errors=errors))
    if errors:
        raise ConfigError(errors)
    try:
        route_settings = routes.load_route_settings(env)
    except routes.RouteConfigError as exc:
        raise ConfigError(exc.lines) from None
    benchmarked = routes.ROUTES[route_settings.benchmark_route]
    server_url, server_base, server_port = resolve_server(env)
    health = _value(env, "MODEL_HEALTH_ENDPOINT") or defaults.health_endpoint
    readiness = (_value(env, "READINESS") or DEFAULT_READINESS).strip().lower()
    if readiness not in READINESS_MODES:
        warnings.append(
            f"READINESS={env.get('READINESS')!r} is not one of {', '.join(READINESS_MODES)}; "
            f"using {DEFAULT_READINESS}"
        )
        readiness = DEFAULT_READINESS
    loop_choice = (_value(env, EVENT_LOOP_VAR) or event_loop.DEFAULT).strip().lower()
    if loop_choice not in event_loop.CHOICES:
        warnings.append(f"{EVENT_LOOP_VAR}={env.get(EVENT_LOOP_VAR)!r} is not one of "
                        f"{', '.join(event_loop.CHOICES)}; using {event_loop.DEFAULT}")
        loop_choice = event_loop.DEFAULT
    front = (_value(env, FRONT_VAR) or FRONTS[0]).strip().lower()
    if front not in FRONTS:
        warnings.append(f"{FRONT_VAR}={env.get(FRONT_VAR)!r} is not one of {', '.join(FRONTS)}; using {FRONTS[0]}")
        front = FRONTS[0]
    relay = (_value(env, RELAY_VAR) or native_relay.DEFAULT).strip().lower()
    if relay not in native_relay.CHOICES:
        warnings.append(f"{RELAY_VAR}={env.get(RELAY_VAR)!r} is not one of {', '.join(native_relay.CHOICES)}; "
                        f"using {native_relay.DEFAULT}")
        relay = native_relay.DEFAULT
    return Settings(
        engine=defaults.engine,
        backend=(_value(env, "BACKEND") or defaults.engine).strip(),
        model_log=(_value(env, "MODEL_LOG") or defaults.model_log).strip(),
        server_url=server_url,
        server_base=server_base,
        server_port=server_port,
        healthcheck_url=resolve_health_url(health, server_url),
        load_lines=env_lines(env, "MODEL_LOAD_LOG_MSG", defaults.load_lines, warnings),
        error_lines=env_lines(env, "MODEL_ERROR_LOG_MSGS", defaults.error_lines, warnings),
        info_lines=env_lines(env, "MODEL_INFO_LOG_MSGS", defaults.info_lines, warnings),
        model_id=resolve_model_id(env),
        benchmark_runs=env_positive_int(env, "BENCHMARK_RUNS", benchmarked.runs, warnings),
        benchmark_concurrency=env_positive_int(
            env, "BENCHMARK_CONCURRENCY", benchmarked.concurrency, warnings
        ),
        benchmark_max_tokens=env_positive_int(
            env, "BENCHMARK_MAX_TOKENS", DEFAULT_BENCHMARK_MAX_TOKENS, warnings
        ),
        readiness=readiness,
        readiness_timeout=env_positive_float(
            env, "READINESS_TIMEOUT", DEFAULT_READINESS_TIMEOUT, warnings
        ),
        healthcheck_probe_timeout=env_positive_float(
            env, "HEALTHCHECK_PROBE_TIMEOUT", DEFAULT_HEALTHCHECK_PROBE_TIMEOUT, warnings
        ),
        worker_port=worker_port,
        worker_http_port=http_port,
        log_requests=env_bool(env, LOG_REQUESTS_VAR, False, warnings),
        loop_choice=loop_choice,
        front=front,
        relay=relay,
        relay_program=_value(env, "BAKERY_RELAY_PROGRAM"),
        front_processes=front_processes(env, front, warnings, defaults.front_processes),
        engine_keep_warm=table.read(env, "BAKERY_ENGINE_KEEP_WARM", warnings=warnings),
        engine_ready_connections=table.read(env, "BAKERY_ENGINE_READY_CONNECTIONS", warnings=warnings,
                                             default=defaults.ready_connections),
        unsecured=unsecured,
        routes=route_settings,
        warnings=[*warnings, *route_settings.warnings],
    )


def readiness_kwargs(settings: Settings, config_cls: Any) -> tuple[dict[str, Any], str]:
    """The readiness arguments `config_cls` (the SDK's WorkerConfig) accepts, and a note to print.

    Feature-detected with inspect.signature: an SDK without health-gated readiness (vastai 1.9.1)
    gets no readiness argument at all and the worker runs in log mode.
    """
    params = inspect.signature(config_cls).parameters
    if "readiness" not in params:
        note = "readiness: logs (this vastai SDK has no health-gated readiness"
        if settings.readiness != "logs":
            note += f"; READINESS={settings.readiness} ignored"
        return {}, note + ")"
    wanted = {
        "readiness": settings.readiness,
        "readiness_timeout": settings.readiness_timeout,
        "healthcheck_probe_timeout": settings.healthcheck_probe_timeout,
    }
    kwargs = {k: v for k, v in wanted.items() if k in params}
    extra = "".join(f", {k}={v:g}" for k, v in kwargs.items() if k != "readiness")
    return kwargs, f"readiness: {settings.readiness}{extra}"


# --------------------------------------------------------------------------- body limit


BODY_LIMIT_VAR = guards.VARIABLES["max_body_bytes"][0]  # BAKERY_MAX_BODY_BYTES


def carries_files(route_settings: routes.RouteSettings) -> bool:
    """Whether a served route takes files in the body (base64 uploads, or data: URI references)."""
    return any(routes.ROUTES[r].uploads or routes.ROUTES[r].references for r in route_settings.routes)


def upload_body_bytes(request_upload_bytes: int) -> int:
    """The body that carries `request_upload_bytes` of uploads: 3/2 of them, i.e. base64's 4/3 plus
    a sixth (10.7 MiB at the 64 MiB default) for line breaks, JSON escaping and the other fields."""
    return request_upload_bytes * 3 // 2


def reconcile_limits(limits: guards.Limits, route_settings: routes.RouteSettings,
                     env: Mapping[str, str]) -> tuple[guards.Limits, list[str], list[str]]:
    """The body limit (BAKERY_MAX_BODY_BYTES) against the upload limits; (limits, notes, warnings).

    The body limit is the outer bound: the HTTP server refuses a larger body (413) before buffering
    it, and only then are uploads decoded and checked (422). Base64 makes a file 4/3 larger, so the
    16 MiB default could never carry upstream's 25 MiB file. When BAKERY_MAX_BODY_BYTES is unset and
    a served route takes files, the body limit follows OPENAI_MAX_REQUEST_UPLOAD_BYTES
    (upload_body_bytes; never below the default); a text-only worker keeps 16 MiB. A body limit set
    below one base64'd OPENAI_MAX_UPLOAD_BYTES file is kept, with a warning.
    """
    if not carries_files(route_settings):
        return limits, [], []
    files = route_settings.limits
    if _value(env, BODY_LIMIT_VAR) is None:
        body = max(limits.max_body_bytes, upload_body_bytes(files.request_bytes))
        note = (f"{BODY_LIMIT_VAR}={body} (follows {uploads.MAX_REQUEST_UPLOAD_BYTES_VAR}="
                f"{files.request_bytes}: routes with uploads are served; set {BODY_LIMIT_VAR} to change it)")
        return replace(limits, max_body_bytes=body), [note], []
    one_file = math.ceil(files.file_bytes / 3) * 4
    if limits.max_body_bytes >= one_file:
        return limits, [], []
    return limits, [], [
        f"{BODY_LIMIT_VAR}={limits.max_body_bytes} cannot carry one {uploads.MAX_UPLOAD_BYTES_VAR}="
        f"{files.file_bytes} upload (base64: {one_file} bytes): larger uploads get 413; raise "
        f"{BODY_LIMIT_VAR} to at least {upload_body_bytes(files.file_bytes)} or lower "
        f"{uploads.MAX_UPLOAD_BYTES_VAR}"]


# --------------------------------------------------------------------------- requests


def load_words(path: Path = WORDS_FILE) -> list[str]:
    """The benchmark vocabulary shipped with the worker (one word a line, `#` comments)."""
    stripped = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [word for word in stripped if word and not word.startswith("#")]


# --------------------------------------------------------------------------- ports


def bind_test(port: int) -> None:
    """Raise PortBusy if a listener holds `port` on any address the SDK would bind (all interfaces).

    Binds the way asyncio's create_server(host=None) does: every passive address, SO_REUSEADDR,
    IPv6 sockets v6-only. A socket lingering in TIME_WAIT therefore does not count as busy.
    """
    infos = socket.getaddrinfo(None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    for family, kind, proto, _, address in infos:
        try:
            sock = socket.socket(family, kind, proto)
        except OSError:  # e.g. no IPv6 on this host
            continue
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise PortBusy(f"port {port} is already in use") from None
                if exc.errno != errno.EADDRNOTAVAIL:
                    raise


def claim_port(port: int, lock_dir: Path | None = None) -> int:
    """Take the per-port worker lock and return its fd (keep it open for the process's life).

    The lock closes the race a bind test alone leaves open: two workers started together (the
    upstream incident of a worker launched by two paths) both pass a bind test before either binds.
    """
    directory = lock_dir or Path(tempfile.gettempdir())
    path = directory / f"bakery-worker-port-{port}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise PortBusy(f"another bakery worker already runs on port {port} (lock {path})") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def claim_ports(settings: Settings, lock_dir: Path | None = None) -> int:
    """Lock the worker port, then check both ports the SDK will bind; return the lock's fd."""
    fd = claim_port(settings.worker_port, lock_dir)
    try:
        for port in (settings.worker_port, settings.worker_http_port):
            bind_test(port)
    except BaseException:
        os.close(fd)
        raise
    return fd


# --------------------------------------------------------------------------- running


def line_out(stream: TextIO, line: str) -> None:
    """Write `line` and its newline in one write. The worker runs unbuffered (PYTHONUNBUFFERED), so
    print() would make two writes to the container's output, and the entry point's lines, written
    to the same pipe, could land between a line and its newline (glued onto it)."""
    stream.write(line + "\n")
    stream.flush()


def _say(message: str) -> None:
    line_out(sys.stdout, message)


def _warn(message: str) -> None:
    line_out(sys.stderr, f"bakery-worker: warning: {message}")


def _fail(message: str, code: int) -> None:
    line_out(sys.stderr, f"bakery-worker: error: {message}")
    raise SystemExit(code)


def banner(settings: Settings) -> str:
    """The first line the worker prints: the real engine, and the alias when BACKEND differs."""
    line = f"Using worker backend: {settings.engine}"
    if settings.backend != settings.engine:
        line += f" (BACKEND={settings.backend} is an alias of {settings.engine})"
    return line


def _import_sdk() -> Any:
    """The vastai module, with its serverless names checked (vastai turns an ImportError into None)."""
    try:
        import vastai
    except ImportError as exc:
        _fail(f"the vastai SDK is not importable in {sys.executable}: {exc}", EXIT_SDK)
    if vastai.Worker is None or vastai.WorkerConfig is None:
        try:  # re-import the parts vastai/__init__ swallowed, to name what is missing
            for name in ("vastai.serverless.server.worker", "vastai.sync.client", "vastai.async_.client",
                         "vastai.serverless.remote"):
                importlib.import_module(name)
        except ImportError as exc:
            _fail(f"vastai's serverless worker cannot be imported in {sys.executable}: {exc}", EXIT_SDK)
        _fail("vastai's serverless worker cannot be imported (vastai.Worker is None)", EXIT_SDK)
    return vastai


def _raising_json_error(parse: Callable[[Any], dict[str, Any]], json_error: type) -> Callable[[Any], dict[str, Any]]:
    """`parse`, with an UploadError turned into the SDK's JsonDataException (its 422)."""
    def parser(body: Any) -> dict[str, Any]:
        try:
            return parse(body)
        except uploads.UploadError as exc:
            raise json_error({exc.field: exc.message}) from None
    return parser


def sdk_handlers(specs: list[routes.HandlerSpec], sdk: Any, max_queue_time: float,
                 data_types: Any = None) -> list[Any]:
    """The SDK's HandlerConfigs for `specs`. `sdk` is the vastai module (HandlerConfig,
    BenchmarkConfig); `data_types` is vastai.serverless.server.lib.data_types (imported if None)."""
    types = data_types or importlib.import_module("vastai.serverless.server.lib.data_types")
    web = importlib.import_module("aiohttp.web")

    async def respond(request: Any, answer: Any) -> Any:  # the SDK's response_generator (public)
        return await forward.respond(web, request, answer)

    handlers = []
    for spec in specs:
        bench = None
        if spec.benchmark is not None:
            bench = sdk.BenchmarkConfig(generator=spec.benchmark.generator, runs=spec.benchmark.runs,
                                        concurrency=spec.benchmark.concurrency)
        extra: dict[str, Any]
        if spec.upload:
            extra = {"payload_class": uploads.payload_class(
                spec.route, spec.limits, spec.references,
                spec.benchmark.generator if spec.benchmark else None, types, spec.model_id)}
        else:
            parse = spec.request_parser or routes.request_parser(spec.route, spec.limits)
            extra = {"request_parser": _raising_json_error(parse, types.JsonDataException),
                     "workload_calculator": spec.workload}
        handlers.append(sdk.HandlerConfig(route=spec.route, allow_parallel_requests=True,
                                          max_queue_time=max_queue_time, benchmark_config=bench,
                                          response_generator=respond, **extra))
    return handlers


def build_worker_config(settings: Settings, sdk: Any, words: list[str],
                        max_sessions: int = guards.Limits.max_sessions) -> tuple[Any, str]:
    """The SDK's WorkerConfig for `settings`, and the readiness note to print.

    One handler per served route (OPENAI_ROUTES, in order), built by routes.py; only the
    benchmarked route (BENCHMARK_ROUTE) carries the benchmark.
    """
    specs = routes.handler_specs(
        settings.routes, words=words, model_id=settings.model_id, max_tokens=settings.benchmark_max_tokens,
        runs=settings.benchmark_runs, concurrency=settings.benchmark_concurrency)
    handlers = sdk_handlers(specs, sdk, MAX_QUEUE_TIME)
    extra, note = readiness_kwargs(settings, sdk.WorkerConfig)
    config = sdk.WorkerConfig(
        model_server_url=settings.server_base,
        model_server_port=settings.server_port,
        model_log_file=settings.model_log,
        model_healthcheck_url=settings.healthcheck_url,
        handlers=handlers,
        log_action_config=sdk.LogActionConfig(
            on_load=settings.load_lines,
            on_error=settings.error_lines,
            on_info=settings.info_lines,
        ),
        max_sessions=max_sessions,  # always positive: the SDK takes 0 or None as "no cap"
        **extra,
    )
    return config, note


SDK_HANDLER_FACTORY = (sdk_seam.WORKER_MODULE, sdk_seam.hook("handler_factory").attr)


def endpoint_handlers(config: Any) -> dict[str, Any] | None:
    """The SDK's EndpointHandler of each route of `config`, made as the SDK's Worker makes them (the
    outcomes guard counts a refused request's workload with them); None when a changed SDK has no
    factory."""
    try:
        factory = getattr(importlib.import_module(SDK_HANDLER_FACTORY[0]), SDK_HANDLER_FACTORY[1])
    except (ImportError, AttributeError):
        return None
    return factory(config).get_all_handlers()


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
            _warn(f"MODEL_LOG={path} still does not exist after {waited:.0f} s: the worker waits for the "
                  "engine's log there (wrong MODEL_LOG? engine not started?)")
            delay = every

    thread = threading.Thread(target=loop, name="bakery-log-watch", daemon=True)
    thread.start()
    return thread


class _LaunchFailureExit(logging.Handler):
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


class _OwnSignature:
    """A class's `__signature__`, computed once, for that class only: on a subclass or an instance the
    attribute is absent, as it was, so inspect.signature() computes a subclass's own signature."""

    def __init__(self, owner: type) -> None:
        self.owner = owner
        self.signature = inspect.signature(owner)

    def __get__(self, instance: object, owner: type | None = None) -> inspect.Signature:
        if instance is None and owner is self.owner:
            return self.signature
        raise AttributeError("__signature__")


def cache_signature(module_name: str = SDK_AUTH_DATA[0], class_name: str = SDK_AUTH_DATA[1]) -> bool:
    """Make inspect.signature() of the SDK's AuthData a lookup instead of a computation, and its
    from_json_msg look it up once instead of seven times.

    vastai 1.9.1's `AuthData.from_json_msg` calls `inspect.signature(cls)` 7 times per request: ~190 us
    computed, ~22 us even as a lookup (BENCHMARKS.md). `__signature__` is the documented way (PEP 362)
    for an object to state its signature; the stated one is the one inspect computes. The class's
    from_json_msg is replaced by one with the same rules, in the same order, that asks for the
    signature once (~3 us): nothing the SDK sees changes. Returns False, touching nothing, when the
    class is not found (a changed SDK); without the module's JsonDataException or the class's
    from_json_msg, only the signature is stated.
    """
    module = sys.modules.get(module_name)
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        return False
    if not isinstance(cls.__dict__.get("__signature__"), _OwnSignature):
        cls.__signature__ = _OwnSignature(cls)  # type: ignore[attr-defined]
    refusal = getattr(module, SDK_JSON_ERROR, None)
    parse = cls.__dict__.get("from_json_msg")
    if isinstance(refusal, type) and isinstance(parse, classmethod) and not hasattr(parse, "bakery_once"):
        cls.from_json_msg = _parse_once(refusal, cls)  # type: ignore[attr-defined]
    return True


def _parse_once(refusal: type, owner: type) -> classmethod:
    """vastai 1.9.1's AuthData.from_json_msg with its signature asked for once: for `owner` at
    install (a dataclass's fields do not change; even as a lookup, inspect.signature() was ~2 % of a
    request's CPU), for a subclass at each call."""
    owner_parameters = inspect.signature(owner).parameters

    def from_json_msg(cls: type, json_msg: Any) -> Any:
        parameters = owner_parameters if cls is owner else inspect.signature(cls).parameters
        errors = {name: "missing parameter" for name in parameters if name not in json_msg}
        if errors:
            raise refusal(errors)
        return cls(**{key: value for key, value in json_msg.items() if key in parameters})

    made = classmethod(from_json_msg)
    made.bakery_once = True  # type: ignore[attr-defined]
    return made


def describe(settings: Settings, signature_cached: bool = True) -> str:
    """One line naming what the worker will watch and call (for the first minutes of an incident)."""
    return (
        f"bakery-worker: log={settings.model_log} server={settings.server_url} "
        f"health={settings.healthcheck_url} model={settings.model_id or '(none)'} "
        f"benchmark={settings.benchmark_runs}x{settings.benchmark_concurrency} "
        f"max_tokens={settings.benchmark_max_tokens} port={settings.worker_port} "
        f"request_lines={'logged' if settings.log_requests else 'dropped'} "
        f"envelope_signature={'cached' if signature_cached else 'computed'}"
    )


@dataclass(frozen=True)
class WorkerConfig:
    """The worker's whole configuration, resolved once from the environment by load_config()."""

    settings: Settings
    limits: guards.Limits  # reconciled with the upload limits (reconcile_limits)
    drain_seconds: float
    report_addr: str  # REPORT_ADDR as given (stripped): the sessions guard's callback hosts, the key's URL
    limit_notes: tuple[str, ...]
    warnings: tuple[str, ...]  # the settings' and the limits', in the order they are printed
    model_id_vars: tuple[str, ...]  # where the model id was looked for (for the warning without one)
    reference_policy: references.Policy = field(default_factory=references.Policy)  # what a reference may reach
    late_errors: late_errors.Bounds = late_errors.DEFAULT_BOUNDS  # how a late error line is checked
    run_dir: str = table.BY_NAME["BAKERY_RUN_DIR"].default  # where the ready mark is kept (ready_mark.py)
    stage_lines: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # the worker's stage lines (stages.py)


def load_config(defaults: EngineDefaults, env: Mapping[str, str]) -> WorkerConfig:
    """Everything the worker reads from `env`, checked at once. Raises ConfigError (exit 2) with one
    line per variable that cannot run a worker; the rest are warnings in the result."""
    settings = load_settings(defaults, env)
    limits, errors = guards.load_limits(env)
    drain_seconds, drain_errors = drain.load(env)
    errors += drain_errors
    policy, reference_errors = references.load(env, settings.routes.limits)
    errors += reference_errors
    if errors:
        raise ConfigError(errors)
    limits, limit_notes, limit_warnings = reconcile_limits(limits, settings.routes, env)
    limits, bound_errors = admission.reconcile(limits, env)  # the byte bound against the body limit
    if bound_errors:
        raise ConfigError(bound_errors)
    late_warnings: list[str] = []
    late = late_errors.load(env, late_warnings)
    stages.check(env, late_warnings)
    stage_lines = stages.worker_lines(settings.load_lines)
    return WorkerConfig(settings=settings, limits=limits, drain_seconds=drain_seconds,
                        report_addr=table.text(env, "REPORT_ADDR") or "", limit_notes=tuple(limit_notes),
                        warnings=(*settings.warnings, *limit_warnings, *late_warnings),
                        model_id_vars=model_id_vars(env), reference_policy=policy, late_errors=late,
                        run_dir=table.read(env, "BAKERY_RUN_DIR"), stage_lines=stage_lines)


def install_parts(worker: Any, cfg: WorkerConfig, handlers: dict[str, Any] | None,
                  signature_layer: Any = signature_memo.install) -> Any:
    """Add to the SDK's `worker` everything bakery adds, in its order; the guards' Context. Raises
    guards.GuardError when an SDK hook is gone. `signature_layer(backend)` makes the innermost layer
    of the signature check and returns its knows(url, signature) (a front process's: the primary's pairs)."""
    settings, limits = cfg.settings, cfg.limits
    # First, so the guards' wrappers of the engine call (timeouts, engine_close) wrap this one too.
    pool = forward.install(worker.backend, limits.engine_connect_timeout, limits.engine_idle_timeout,
                           guards.ENGINE_KEEPALIVE, settings.engine_keep_warm)
    known = signature_layer(worker.backend)  # likewise: the innermost layer of the signature check
    ctx = guards.install(worker, limits, routes=settings.routes.routes, http_port=settings.worker_http_port,
                         report_addr=cfg.report_addr, handlers=handlers)
    ctx.signature_known = known
    ctx.drain = serving.install(ctx, cfg.drain_seconds, limits.retry_after,  # stream release, prompt report, drain,
                    settings.error_lines, cfg.late_errors, cfg.run_dir,  # late error lines, ready mark
                    stages.Stages(cfg.stage_lines, _say))  # the time to ready's stages
    references.install(ctx, cfg.reference_policy)  # last: the outermost wrapper of the engine call
    ctx.pool = pool
    if pool is not None:
        share = processes.ready_share(settings.engine_ready_connections, settings.front_processes)
        engine_warm.install(ctx, pool, share)
        if ctx.admission is not None and settings.engine_ready_connections > limits.max_connections:
            # admission raised the open-files limit for one engine connection per admitted request
            warning = admission.raise_fd_limit(limits.max_connections, settings.engine_ready_connections)
            if warning:
                _warn(warning)
    return ctx


def install_front(settings: Settings, ctx: Any, backend: Any, handlers: dict[str, Any] | None,
                  serve: Any, header_timeout: float) -> tuple[str, Any]:
    """Put wire.py's front on WORKER_PORT's connections (BAKERY_FRONT=wire, the default); (the startup
    line saying who reads them, the wire.Front or None). Call after the access logger class is chosen
    (wire logs through it)."""
    if settings.front != "wire":
        return f"bakery-worker: front: aiohttp.web reads every request ({FRONT_VAR}=aiohttp)", None
    from front import wire  # msgspec (signed_first): the worker venv's
    served = {route: handlers[route] for route in settings.routes.routes if handlers and route in handlers}
    made = None
    if serve is not None and served and ctx.signature_known is not None:
        metrics = sdk_seam.find(backend, "metrics", "wire.py")
        made = wire.install(ctx, served, serve, ctx.signature_known, backend, header_timeout,
                            lambda: bool(metrics.system_metrics.model_is_loaded))
    if made is None:
        return (f"bakery-worker: front: aiohttp.web reads every request (the wire front needs the limits "
                f"guard, the drain and the SDK's route handlers; {FRONT_VAR}=wire asked for it)"), None
    return (f"bakery-worker: front: wire.py serves plain signed requests to {', '.join(served)} below "
            f"aiohttp.web (bodies up to {wire.BODY_MAX} bytes); everything else is aiohttp.web's ({FRONT_VAR})"), made


def install_fronts(defaults: EngineDefaults, settings: Settings, ctx: Any, backend: Any, made: Any) -> str | None:
    """Start BAKERY_FRONT_PROCESSES front processes with the server (processes.py); the startup line, or
    None when there are none."""
    count = settings.front_processes
    if count <= 0:
        return None
    if made is None or ctx.signature_known is None or ctx.admission is None:
        _warn(f"{processes.PROCESSES_VAR}={count}: front processes need the wire front ({FRONT_VAR}=wire, "
              "the SDK's route handlers, the limits guard); the worker serves alone")
        return None
    metrics = sdk_seam.find(backend, "metrics", "processes.py")
    slots = processes.Slots(count + 1)
    ctx.admission[0].share(slots, 0)  # the body budget: every process's bytes
    fleet = processes.Fleet(count, defaults, backend, ctx.drain, ctx.signature_known,
                         loaded=lambda: bool(metrics.system_metrics.model_is_loaded),
                         wait_time=lambda: sdk_seam.get(metrics, "model_metrics").wait_time,
                         slots=slots, released=made.released)
    made.fleet = fleet
    fleet.take_back = made.take_back
    ctx.drain.holds.append(fleet.hold)
    ctx.drain.notes.append(fleet.draining)
    ctx.key_changed.append(fleet.key_changed)

    async def start(_app: Any) -> None:
        fleet.start()  # once: on_startup runs for each of the SDK's two apps

    ctx.on_startup.append(start)
    return fleet.describe()


def run(defaults: EngineDefaults, env: Mapping[str, str] | None = None) -> None:
    """Resolve the environment, claim the port, build the SDK's WorkerConfig and run the Worker."""
    try:
        cfg = load_config(defaults, table.snapshot() if env is None else env)
    except ConfigError as exc:
        for line in exc.lines:
            line_out(sys.stderr, f"bakery-worker: error: {line}")
        raise SystemExit(EXIT_CONFIG) from None
    settings, limits = cfg.settings, cfg.limits
    _say(banner(settings))
    for warning in cfg.warnings:
        _warn(warning)
    if settings.model_id is None:
        _warn(f"no model id ({', '.join(cfg.model_id_vars)} all unset): benchmark requests omit 'model'")
    words = load_words()
    if not words:
        _fail(f"the benchmark word list {WORDS_FILE} is empty", EXIT_CONFIG)
    sdk = _import_sdk()
    signature_cached = cache_signature()
    if not signature_cached:
        _warn(f"{'.'.join(SDK_AUTH_DATA)} not found (a changed SDK): its signature is not cached, "
              "requests are served as the SDK serves them")
    sdk_config, note = build_worker_config(settings, sdk, words, limits.max_sessions)
    _say(describe(settings, signature_cached))
    for line in routes.startup_lines(settings.routes):
        _say(line)
    _say(f"bakery-worker: {note}")
    try:
        lock_fd = claim_ports(settings)
    except PortBusy as exc:
        _fail(f"{exc}: stop the other listener or set WORKER_PORT", EXIT_PORT_BUSY)
    # The SDK reads UNSECURED itself (distutils' strtobool: a blank or " true" crashes it, "on" or "t"
    # passes): it gets the worker's strict reading, and is checked to hold it.
    table.export("UNSECURED", "true" if settings.unsecured else "false")
    worker = sdk.Worker(sdk_config)
    if getattr(worker.backend, "unsecured", None) is not settings.unsecured:
        _fail(f"the SDK did not take UNSECURED={settings.unsecured} (vastai changed how it reads it)", EXIT_SDK)
    gone = sdk_seam.missing(worker)
    if gone:  # every hook checked before any is used: a changed SDK stops the worker, naming what is gone
        _fail(sdk_seam.describe_missing(gone), EXIT_SDK)
    handlers = endpoint_handlers(sdk_config)
    if handlers is None:
        _warn(f"{'.'.join(SDK_HANDLER_FACTORY)} not found (a changed SDK): a refused request's outcome is "
              "reported with no load")
    try:
        ctx = install_parts(worker, cfg, handlers)
    except guards.GuardError as exc:
        _fail(str(exc), EXIT_SDK)
    if not queue_wait.install(sdk_seam.find(worker.backend, "metrics", "queue_wait")):
        _warn(f"{sdk_seam.hook('wait_time').where} or {sdk_seam.hook('requests_working').where} not found (a "
              "changed SDK): the queue estimate is summed on every request, as the SDK does")
    serve = own_handler.install(worker.backend)
    if serve is None:
        _warn(f"a hook of own_handler.py ({', '.join(own_handler.HOOK_KEYS)}) not found (a changed SDK): "
              "every request is handled by the SDK's own handler")
    _say(guards.describe(guards.ACTIVE, limits))
    _say(drain.describe(cfg.drain_seconds))
    _say(references.describe(cfg.reference_policy))
    _say(late_errors.describe(cfg.late_errors))
    for line in cfg.limit_notes:
        _say(f"bakery-worker: {line}")
    if settings.unsecured:
        _say("bakery-worker: UNSECURED=true: requests are served without a signature (offline use only)")
    watch_log_file(settings.model_log)
    # Added after Worker() so the SDK still installs its own log handler on the root logger.
    logging.getLogger().addHandler(_LaunchFailureExit())
    if not settings.log_requests:
        ctx.runner_kwargs["access_log_class"] = quiet_access_log_class()
        missing = quiet_requests()
        if missing:
            _warn(f"the SDK's per-request lines cannot be dropped (no logger in {', '.join(missing)}); "
                  f"they are logged as with {LOG_REQUESTS_VAR}=true")
    front_line, made = install_front(settings, ctx, worker.backend, handlers, serve, limits.header_timeout)
    _say(front_line)
    fronts_line = install_fronts(defaults, settings, ctx, worker.backend, made)
    if fronts_line:
        _say(fronts_line)
    loop_name, loop_warning = event_loop.install(settings.loop_choice)
    if loop_warning:
        _warn(loop_warning)
    _say(f"bakery-worker: event loop: {loop_name}; {event_loop.tune_collector()}")
    relay_name, relay_warning = native_relay.install(settings.relay, settings.relay_program, limits.send_timeout)
    if relay_warning:
        _warn(relay_warning)
    _say(f"bakery-worker: streamed bodies after their head: {relay_name}")
    share = processes.ready_share(settings.engine_ready_connections, settings.front_processes)
    _say(f"bakery-worker: {engine_warm.describe(settings.engine_keep_warm, settings.engine_ready_connections, share)}")
    if native_relay.ACTIVE is not None and ctx.drain is not None:
        ctx.drain.notes.append(native_relay.ACTIVE.describe)  # said when the drain begins
    try:
        worker.run()
    finally:
        os.close(lock_fd)
