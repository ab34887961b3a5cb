"""The worker's settings: an engine's defaults (EngineDefaults) and the environment, resolved once
into a frozen WorkerConfig (load_config). Plain functions over a mapping: every rule is unit-tested
without the SDK; a bad value is one ConfigError line (exit 2) or one warning and the default."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import urljoin, urlsplit

from app import event_loop
from config import routes, table, uploads
from engine import engine_warm, native_relay
from front import processes
from logs import late_errors, stages
from policy import admission, drain, guards, references

DEFAULT_SERVER_URL = "http://127.0.0.1:18000"
DEFAULT_HEALTH_ENDPOINT = "/health"
DEFAULT_INFO_LINES: tuple[str, ...] = table.BY_NAME["MODEL_INFO_LOG_MSGS"].default
# Upstream's benchmark budget (pyworker #88). Runs and concurrency are the benchmarked route's own
# (routes.ROUTE_TABLE: 3 x 10 for text) unless BENCHMARK_RUNS / BENCHMARK_CONCURRENCY are set.
DEFAULT_BENCHMARK_MAX_TOKENS = 500
DEFAULT_READINESS = "logs"
READINESS_MODES = ("logs", "healthcheck")
DEFAULT_READINESS_TIMEOUT = 1800.0
DEFAULT_HEALTHCHECK_PROBE_TIMEOUT = 30.0
# Upstream's precedence for the served model id (pyworker #88), checked against the specs' model_var by
# tests/unit/test_engine_facts_agree.py. Inside an image the engine's own variable, which the image
# bakes by name (BAKERY_MODEL_VAR), comes right after MODEL_NAME, so any engine's works.
MODEL_ID_VARS = ("MODEL_NAME", "VLLM_MODEL", "SGLANG_MODEL", "LLAMA_MODEL")
MODEL_VAR_VAR = "BAKERY_MODEL_VAR"
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
LOG_REQUESTS_VAR = "BAKERY_LOG_REQUESTS"
EVENT_LOOP_VAR = "BAKERY_EVENT_LOOP"
FRONT_VAR = "BAKERY_FRONT"
RELAY_VAR = "BAKERY_RELAY"
FRONTS = ("wire", "aiohttp")
TRUE_WORDS, FALSE_WORDS = table.TRUE_WORDS, table.FALSE_WORDS
_PLATFORM_HINT = "normally set by the Vast.ai platform when it launches the instance"


class ConfigError(Exception):
    """The environment cannot run a worker; each item of `lines` is one user-facing line."""

    def __init__(self, lines: list[str]):
        super().__init__("; ".join(lines))
        self.lines = lines


@dataclass(frozen=True)
class EngineDefaults:
    """What an engine's worker adapter states: its name and how the worker is tuned for it.

    The engine's facts (log file, log grammar, health endpoint) are not here: images/<engine>.yaml states
    them and the image bakes them (BAKED_FACTS). `ready_connections` is BAKERY_ENGINE_READY_CONNECTIONS's
    default (engine_warm.py), `front_processes` BAKERY_FRONT_PROCESSES's (processes.py).
    """

    engine: str
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


_value = table.value  # the raw text, or None when unset or blank (blank counts as unset)


parse_lines = table.parse_lines
# What every image bakes from its spec and the worker cannot run without (the engine's facts, stated once).
BAKED_FACTS = ("MODEL_LOG", "MODEL_LOAD_LOG_MSG", "MODEL_ERROR_LOG_MSGS")


def baked_facts(env: Mapping[str, str]) -> tuple[str, list[str], list[str]]:
    """(MODEL_LOG, MODEL_LOAD_LOG_MSG, MODEL_ERROR_LOG_MSGS) as the image baked them (or a launch template
    set them). Raises ConfigError with one line per variable missing or holding no line."""
    errors: list[str] = []
    values = []
    for name in BAKED_FACTS:
        if not table.is_set(env, name):
            errors.append(f"{name} is not set: an image bakes it from images/<engine>.yaml (bake.env); outside an "
                          "image, set it to the engine's")
        values.append(table.read(env, name, errors=errors))  # a set value that holds no line: its own line
    if errors:
        raise ConfigError(errors)
    model_log, load_lines, error_lines = values
    return model_log, load_lines, error_lines


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
    model_log, load_lines, error_lines = baked_facts(env)
    benchmarked = routes.ROUTES[route_settings.benchmark_route]
    server_url, server_base, server_port = resolve_server(env)
    health = _value(env, "MODEL_HEALTH_ENDPOINT") or DEFAULT_HEALTH_ENDPOINT
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
        model_log=model_log,
        server_url=server_url,
        server_base=server_base,
        server_port=server_port,
        healthcheck_url=resolve_health_url(health, server_url),
        load_lines=load_lines,
        error_lines=error_lines,
        info_lines=env_lines(env, "MODEL_INFO_LOG_MSGS", DEFAULT_INFO_LINES, warnings),
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


def banner(settings: Settings) -> str:
    """The first line the worker prints: the real engine, and the alias when BACKEND differs."""
    line = f"Using worker backend: {settings.engine}"
    if settings.backend != settings.engine:
        line += f" (BACKEND={settings.backend} is an alias of {settings.engine})"
    return line


def describe(settings: Settings) -> str:
    """One line naming what the worker will watch and call (for the first minutes of an incident)."""
    return (
        f"bakery-worker: log={settings.model_log} server={settings.server_url} "
        f"health={settings.healthcheck_url} model={settings.model_id or '(none)'} "
        f"benchmark={settings.benchmark_runs}x{settings.benchmark_concurrency} "
        f"max_tokens={settings.benchmark_max_tokens} port={settings.worker_port} "
        f"request_lines={'logged' if settings.log_requests else 'dropped'}"
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
