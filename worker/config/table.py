"""The worker's environment: one table of every variable it reads (VARIABLES), and one parser.

Nothing else in the worker reads os.environ (tests/worker/test_config.py checks): modules resolve their
variables from one `snapshot()` through `read()` or `parse()`, so each rule has one implementation. Standard
library only: the entry point imports it too. See docs/architecture.md, "Environment contract (worker)".
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

TRUE_WORDS = ("true", "1", "yes")  # the words worker/boot/entrypoint.py's flags accept too
FALSE_WORDS = ("false", "0", "no")
MAX_DRAIN_SECONDS = 3600.0
MAX_COUNT = 4096  # a "count" variable's bound (BAKERY_ENGINE_READY_CONNECTIONS: a descriptor each)


@dataclass(frozen=True)
class Var:
    """One variable the worker (or its entry point) reads.

    `default` is None when it is the engine's own (baked, EngineDefaults), the benchmarked route's
    own, or there is none; `owner` is the module that resolves it; `reader` who reads it ("worker",
    "entry point", "start_server.sh"; the last two are listed so that the table is the whole contract).
    """

    name: str
    kind: str
    default: Any
    bad: str  # "exit" | "warn" | "none"
    owner: str
    doc: str
    reader: str = "worker"


# The order of each group is the order its problems are reported in.
VARIABLES: tuple[Var, ...] = (
    # The main switch (the entry point; boot/health.py reads it too): the worker on :3000 beside the engine.
    Var("SERVERLESS", "bool", False, "exit", "entrypoint",
        "run the worker on :3000 beside the engine (false: the engine alone)", "entry point"),
    # Baked per engine from images/<engine>.yaml (bake.env): the engine's facts are stated there only, so
    # the worker needs the first three (outside an image, set them; a missing one exits 2).
    Var("BACKEND", "text", None, "none", "core", "the worker the image runs (an alias is named in the banner)"),
    Var("MODEL_LOG", "text", None, "exit", "core", "the engine's log file the SDK reads"),
    Var("MODEL_LOAD_LOG_MSG", "lines", None, "exit", "core", "log lines that mean the model is loaded"),
    Var("MODEL_ERROR_LOG_MSGS", "lines", None, "exit", "core", "log lines that mean the engine failed"),
    Var("MODEL_INFO_LOG_MSGS", "lines", ('"message":"Download',), "warn", "core", "log lines reported as information"),
    Var("MODEL_HEALTH_ENDPOINT", "text", "/health", "none", "core",
        "a path (against MODEL_SERVER_URL) or a full URL"),
    Var("BAKERY_ENGINE_PROGRAM", "text", None, "none", "generic", "the engine's program name (its exit line's)"),
    Var("BAKERY_MODEL_VAR", "varname", None, "none", "core", "the variable holding the model id"),
    Var("BAKERY_ENGINE_CMD", "text", None, "exit", "entrypoint", "the engine's argv (JSON list)", "entry point"),
    Var("BAKERY_ENGINE_ARGS_VAR", "varname", None, "exit", "entrypoint",
        "the variable whose value is shell-split onto the argv", "entry point"),
    # Baked by an image of a CUDA line (bakery/spec/cuda.py): the entry point refuses an older driver (boot/driver.py).
    Var("BAKERY_CUDA_VERSION", "text", None, "none", "entrypoint", "the image's CUDA line (major.minor)",
        "entry point"),
    Var("BAKERY_CUDA_MIN_DRIVER", "digits", None, "exit", "entrypoint",
        "the NVIDIA driver major the image's CUDA line needs at least", "entry point"),
    # For tests only: where the driver's version is read (a container test supplies its own file there).
    Var("BAKERY_DRIVER_VERSION_FILE", "text", "/proc/driver/nvidia/version", "none", "entrypoint",
        "the NVIDIA driver's version file (tests only)", "entry point"),
    # Model id, first non-blank (core.model_id_vars; the variable BAKERY_MODEL_VAR names comes second).
    Var("MODEL_NAME", "text", None, "none", "core", "the served model id"),
    Var("VLLM_MODEL", "text", None, "none", "core", "upstream's vLLM model variable"),
    Var("SGLANG_MODEL", "text", None, "none", "core", "upstream's SGLang model variable"),
    Var("LLAMA_MODEL", "text", None, "none", "core", "upstream's llama.cpp model variable"),
    # Worker knobs.
    Var("MODEL_SERVER_URL", "url", "http://127.0.0.1:18000", "exit", "core", "the engine's origin"),
    Var("BENCHMARK_RUNS", "int", None, "warn", "core", "benchmark runs (default: the route's own)"),
    Var("BENCHMARK_CONCURRENCY", "int", None, "warn", "core", "benchmark concurrency (default: the route's own)"),
    Var("BENCHMARK_MAX_TOKENS", "int", 500, "warn", "core", "benchmark max_tokens, the workload unit"),
    Var("READINESS", "choice", "logs", "warn", "core", "logs | healthcheck"),
    Var("READINESS_TIMEOUT", "number", 1800.0, "warn", "core", "seconds to wait for readiness"),
    Var("HEALTHCHECK_PROBE_TIMEOUT", "number", 30.0, "warn", "core", "seconds of one health probe"),
    Var("BAKERY_LOG_REQUESTS", "bool", False, "warn", "core", "keep the per-request log lines"),
    Var("BAKERY_EVENT_LOOP", "choice", "uvloop", "warn", "core", "uvloop | asyncio: the worker's event loop"),
    Var("BAKERY_FRONT", "choice", "wire", "warn", "core",
        "wire | aiohttp: who reads port 3000's connections first (wire.py; aiohttp: every request aiohttp.web's)"),
    Var("BAKERY_FRONT_PROCESSES", "count", None, "warn", "fronts",
        "processes besides the worker that serve the plain signed requests of the connections given them "
        "(front/processes.py; 0: the worker alone; default: the engine's own, EngineDefaults.front_processes)"),
    Var("BAKERY_RELAY", "choice", "native", "warn", "core",
        "native | python: who moves a streamed body after its head (native_relay.py: bakery-relay, in C)"),
    Var("BAKERY_ENGINE_KEEP_WARM", "seconds", 60.0, "warn", "core",
        "seconds after the last request during which idle engine connections are renewed (0: never)"),
    Var("BAKERY_ENGINE_READY_CONNECTIONS", "count", None, "warn", "core",
        "engine connections opened when the model is loaded, for the first burst (default: the engine's own)"),
    Var("BAKERY_RELAY_PROGRAM", "text", None, "none", "core",
        "the bakery-relay program (default: worker/relay/bakery-relay, where an image build puts it)"),
    Var("UNSECURED", "bool", False, "exit", "core", "serve without a signature (offline only)"),
    Var("WORKER_STATE_DIR", "text", "/var/lib/bakery/worker", "none", "start_server.sh",
        "the worker's working directory", "start_server.sh"),
    Var("WORKER_PYTHON", "text", "/opt/bakery/venv/bin/python", "none", "start_server.sh",
        "the worker's interpreter", "start_server.sh"),
    # Routes (routes.py, uploads.py, workload.py).
    Var("OPENAI_ROUTES", "routes", None, "exit", "routes", "the routes served, comma-separated"),
    Var("BENCHMARK_ROUTE", "route", "/v1/completions", "exit", "routes", "the benchmarked route"),
    Var("OPENAI_MAX_UPLOAD_BYTES", "digits", 26214400, "warn", "routes", "largest uploaded file"),
    Var("OPENAI_MAX_REQUEST_UPLOAD_BYTES", "digits", 67108864, "warn", "routes", "largest uploads of a request"),
    Var("BENCHMARK_EMBED_CHARS", "digits", 600, "warn", "routes", "characters of an embedding benchmark"),
    Var("BENCHMARK_SPEECH_VOICE", "text", None, "none", "routes", "the speech benchmark's voice"),
    # Guard limits (guards.Limits; read strictly).
    Var("BAKERY_MAX_BODY_BYTES", "digits", 16 * 1024 * 1024, "exit", "guards", "largest request body in bytes"),
    Var("BAKERY_BODY_TIMEOUT", "number", 60.0, "exit", "guards", "time to receive a request body"),
    Var("BAKERY_HEADER_TIMEOUT", "number", 30.0, "exit", "guards",
        "time to receive request headers (and keep-alive idle)"),
    # A write a client takes no byte of: its connection is cut after this, in every state
    # (admission.SendWatch; bakery-relay's own send limit too).
    Var("BAKERY_SEND_TIMEOUT", "number", 30.0, "exit", "guards",
        "longest time a client may take no byte of an answer being written before its connection is reset"),
    Var("BAKERY_ENGINE_CONNECT_TIMEOUT", "number", 10.0, "exit", "guards", "time to connect to the engine"),
    Var("BAKERY_ENGINE_IDLE_TIMEOUT", "number", 600.0, "exit", "guards",
        "longest silence of the engine while answering"),
    Var("BAKERY_RETRY_AFTER", "digits", 10, "exit", "guards",
        "Retry-After seconds of a 503 (model not loaded, draining, over a global bound)"),
    Var("BAKERY_SESSIONS", "bool", False, "exit", "guards", "whether /session/* routes are served"),
    Var("BAKERY_SESSION_MAX_LIFETIME", "number", 600.0, "exit", "guards", "largest session lifetime"),
    Var("BAKERY_MAX_SESSIONS", "digits", 10, "exit", "guards", "open sessions at once"),
    Var("BAKERY_PUBKEY_BACKOFF_MAX", "number", 60.0, "exit", "guards", "longest wait between public-key fetches"),
    Var("BAKERY_PUBKEY_FETCH_TIMEOUT", "number", 10.0, "exit", "guards", "time for one public-key fetch"),
    Var("BAKERY_PUBKEY_REFRESH", "number", 300.0, "exit", "guards",
        "seconds between fetches of the public key once loaded (a rotated-away key is refused after at most this)"),
    Var("BAKERY_PUBKEY_REFETCH_MIN", "number", 10.0, "exit", "guards",
        "fewest seconds between key fetches a run of signature failures asks for"),
    # References the engine fetches (references.py; read strictly).
    Var("BAKERY_ALLOW_PRIVATE_REFERENCES", "hosts", None, "exit", "references",
        "host names, addresses and CIDR ranges a reference may reach though not public (comma-separated)"),
    Var("BAKERY_REFERENCE_RESOLVE_TIMEOUT", "number", 3.0, "exit", "references",
        "time to resolve the host names of a request's references"),
    Var("BAKERY_MAX_REFERENCES", "digits", 32, "exit", "references", "URLs one request may make the engine fetch"),
    # Global bounds (admission.py). 256 MiB of bodies at once: sixteen at the 16 MiB body limit, or 1024
    # streams (the top of a GPU engine's range, docs/serving.md) of 256 KiB prompts each; a body costs
    # the worker ~3x its size while parsed, so bodies stay under ~1 GiB of its memory. Unset, it is never
    # below two bodies of the body limit (2 x 96 MiB with upload routes).
    Var("BAKERY_MAX_BUFFERED_BYTES", "digits", 256 * 1024 * 1024, "exit", "guards",
        "request body bytes buffered at once, all connections together"),
    # 2048: twice the 1024 streams a GPU engine runs, for keep-alive connections idle between them (the
    # header timeout closes those); ~30 KiB per open stream (BENCHMARKS.md) is ~60 MiB at the cap, and
    # with one engine connection per request it needs ~4.3k open files (admission.fds_needed).
    Var("BAKERY_MAX_CONNECTIONS", "digits", 2048, "exit", "guards", "open connections on WORKER_PORT"),
    # Drain (drain.py; also read by the entry point, which sizes the worker's stopwaitsecs from it).
    Var("BAKERY_DRAIN_TIMEOUT", "drain", 8.0, "exit", "drain", "seconds requests in flight get after SIGTERM"),
    # The entry point's stop after the engine ended on its own (worker/boot/supervise.py).
    Var("BAKERY_EXIT_GRACE", "seconds", 10.0, "exit", "entrypoint",
        "seconds the worker gets to report an engine that ended before the container stops", "entry point"),
    # Late error lines (late_errors.py): the health probes that decide whether one counts.
    Var("BAKERY_LATE_ERROR_PROBES", "digits", 4, "warn", "late_errors",
        "health probes in a row that must answer 200 for an error line after load not to count"),
    Var("BAKERY_LATE_ERROR_INTERVAL", "number", 1.0, "warn", "late_errors", "seconds between those probes"),
    # Time to ready (stages.py): optional lines marking the load's stages in MODEL_LOG.
    Var("BAKERY_LOAD_BEGIN_LOG_MSGS", "lines", (), "warn", "stages", "log lines that mean the model load begins"),
    Var("BAKERY_WEIGHTS_LOADED_LOG_MSGS", "lines", (), "warn", "stages",
        "log lines that mean the model's weights are loaded"),
    # The image's health check (ready_mark.py; worker/boot/health.py and the entry point read it too).
    Var("BAKERY_RUN_DIR", "text", "/run/bakery", "none", "ready_mark",
        "the boot's run directory: the worker keeps its ready mark (worker-ready) there"),
    # Platform variables the SDK reads unguarded (core.check_platform_env).
    Var("CONTAINER_ID", "platform", None, "exit", "core", "the instance id (an integer)"),
    Var("REPORT_ADDR", "platform", None, "exit", "core", "the autoscaler's address(es)"),
    Var("PUBLIC_IPADDR", "platform", None, "exit", "core", "the instance's public address"),
    Var("WORKER_PORT", "port", None, "exit", "core", "the worker's port (3000 in bakery images)"),
    Var("WORKER_HTTP_PORT", "port", None, "exit", "core", "the SDK's plain-HTTP port (default WORKER_PORT+1)"),
    Var("VAST_TCP_PORT_<WORKER_PORT>", "platform", None, "exit", "core",
        "the public port mapped to WORKER_PORT (a name made from WORKER_PORT's value)"),
)
BY_NAME: Mapping[str, Var] = MappingProxyType({v.name: v for v in VARIABLES})


def snapshot() -> Mapping[str, str]:
    """A read-only snapshot of the process environment: what the worker resolves its settings from."""
    return MappingProxyType(dict(os.environ))


def export(name: str, value: str) -> None:
    """Set `name` in the process environment (for the SDK, which reads some variables itself)."""
    os.environ[name] = value


def value(env: Mapping[str, str], name: str) -> str | None:
    """The variable's raw text, or None when it is unset or blank (blank counts as unset)."""
    raw = env.get(name)
    if raw is None or not raw.strip():
        return None
    return raw


def text(env: Mapping[str, str], name: str) -> str | None:
    """The variable's text stripped, or None when it is unset or blank."""
    raw = value(env, name)
    return None if raw is None else raw.strip()


def parse_lines(raw: str) -> list[str]:
    """Split a log-line list: a JSON array of strings (the baked form) or newline-separated text.

    Each item is stripped and empty items are dropped.
    """
    stripped = raw.strip()
    items: list[str] | None = None
    if stripped.startswith("["):
        try:
            decoded = json.loads(stripped)
        except ValueError:
            decoded = None
        if isinstance(decoded, list) and all(isinstance(x, str) for x in decoded):
            items = decoded
    if items is None:
        items = raw.split("\n")  # \n only: \x85 or \u2028 inside a log line is text, not a break
    return [s for item in items if (s := item.strip())]


def parse_bool(name: str, raw: str | None) -> bool | None:
    """true/1/yes or false/0/no (any case, blanks around); None when unset or blank.

    Anything else raises ValueError with one line naming the variable (the strict reading).
    """
    if raw is None or not raw.strip():
        return None
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"{name}={raw!r} is neither true nor false: set {name}=true or false "
                     f"(true/1/yes, false/0/no) or leave it unset")


class BadValue(ValueError):
    """A variable's text that its kind refuses; str() is the one line naming it."""


def _number(raw: str) -> float:
    try:
        return float(raw.strip())
    except ValueError:
        return math.nan


def _convert(name: str, kind: str, raw: str, default: Any, bad: str) -> Any:
    """`raw` (set, not blank) read as `kind`, or BadValue with the line `bad` prints."""
    strict = bad == "exit"
    stripped = raw.strip()
    if kind == "text":
        return stripped
    if kind == "lines":
        lines = parse_lines(raw)
        if not lines and strict:
            raise BadValue(f"{name}={raw!r} holds no log line: set the engine's lines (a JSON list of strings, "
                           "or one per line)")
        if not lines:
            raise BadValue(f"{name}={raw!r} holds no log line; using the default {list(default)!r}")
        return lines
    if kind == "bool":
        if strict:
            try:
                return parse_bool(name, raw)
            except ValueError as exc:
                raise BadValue(str(exc)) from None
        word = stripped.lower()
        if word in TRUE_WORDS or word in FALSE_WORDS:
            return word in TRUE_WORDS
        raise BadValue(f"{name}={raw!r} is neither true nor false; using the default "
                       f"{'true' if default else 'false'}")
    if kind == "int":
        try:
            number = int(stripped)
        except ValueError:
            number = 0
        if number > 0:
            return number
        raise BadValue(f"{name}={raw!r} is not a positive integer; using the default {default}")
    if kind == "digits":
        if stripped.isdigit() and int(stripped) > 0:
            return int(stripped)
        if strict:
            raise BadValue(f"{name}={raw!r} is not a positive whole number (default {default})")
        raise BadValue(f"{name}={stripped!r} is not a positive integer; using the default {default}")
    if kind == "count":
        if stripped.isascii() and stripped.isdigit() and int(stripped) <= MAX_COUNT:
            return int(stripped)
        raise BadValue(f"{name}={raw!r} is not a whole number from 0 to {MAX_COUNT}; using the default {default}")
    if kind == "number":
        number = _number(raw)
        if math.isfinite(number) and number > 0:
            return number
        if strict:
            raise BadValue(f"{name}={raw!r} is not a positive number of seconds (default {default:g})")
        raise BadValue(f"{name}={raw!r} is not a positive finite number; using the default {default:g}")
    if kind == "seconds":
        number = _number(raw)
        if math.isfinite(number) and 0 <= number <= MAX_DRAIN_SECONDS:
            return number
        raise BadValue(f"{name}={raw!r} is not a number of seconds from 0 to {MAX_DRAIN_SECONDS:g} "
                       f"(default {default:g})")
    if kind == "drain":
        number = _number(raw)
        if math.isfinite(number) and 0 <= number <= MAX_DRAIN_SECONDS:
            return number
        raise BadValue(
            f"{name}={raw!r} is not a number of seconds from 0 to {MAX_DRAIN_SECONDS:g}: set it to how "
            f"long requests in flight may run after SIGTERM (default {default:g}; keep it below "
            "the stop grace, docker stop -t)")
    raise KeyError(f"the kind {kind!r} of {name} is judged by its owner module, not by table.parse")


def parse(env: Mapping[str, str], name: str, kind: str, bad: str, default: Any,
          warnings: list[str] | None = None, errors: list[str] | None = None) -> Any:
    """`name` from `env` read as `kind`: its value, or `default` when unset or blank.

    A bad value appends its one line to `errors` when `bad` is "exit", to `warnings` when "warn"
    (each list defaults to one that is dropped), and gives `default`.
    """
    raw = value(env, name)
    if raw is None:
        return default
    try:
        return _convert(name, kind, raw, default, bad)
    except BadValue as exc:
        target = errors if bad == "exit" else warnings
        if target is not None:
            target.append(str(exc))
        return default


def read(env: Mapping[str, str], name: str, warnings: list[str] | None = None,
         errors: list[str] | None = None, default: Any = None) -> Any:
    """`name` (a variable of VARIABLES) read by its row's kind and rule; `default` replaces the
    row's own when given (an engine's or a route's own default)."""
    var = BY_NAME[name]
    return parse(env, name, var.kind, var.bad, var.default if default is None else default, warnings, errors)


def is_set(env: Mapping[str, str], name: str) -> bool:
    """Whether `name` holds something (neither unset nor blank)."""
    return value(env, name) is not None
