"""Guards the worker puts around the vastai SDK's HTTP server (port 3000): what the SDK leaves open.

Each guard is named in ACTIVE and installed by install(); removing a name disables that guard and
nothing else. The guards and the SDK internals they hook (vastai 1.9.1). Every hook is a row of
sdk_seam.HOOKS and is reached through sdk_seam's functions only (this module names no SDK private);
the table is checked at start (core.run exits 4 naming a missing hook instead of running unguarded)
and pinned by tests/worker/test_sdk_seam.py and test_guard_hooks.py:

- own_url: a signature counts only when auth_data.url is this worker's own URL (the `url` of its
  status reports, `Metrics.url`) -> 401. Hook: the instance's `_Backend__check_signature`.
- sessions: /session/* answers 404 unless BAKERY_SESSIONS=true; when on, every call must be signed
  for this worker, lifetimes are capped and the close callback may only go to REPORT_ADDR's host.
- self_update: /pyworker/* -> 403 (an image is version-locked; vastai lets an empty MASTER_TOKEN in).
- limits: request body size (413), body read time (408), header time (keep-alive timer), engine
  connect and idle-read timeouts (504). Hooks: the `web` name the SDK's server module uses
  (Application/AppRunner/TCPSite), the `session` cached_property, `_Backend__call_backend`.
- not_ready: the model routes answer 503 + Retry-After until the SDK marks the model loaded.
- envelope: a malformed envelope -> 422 JSON (never the SDK's 500), and the SDK's body-less refusals
  (401/429/500) get a JSON body.
- pubkey_retry: the public key is fetched until it loads, with bounded backoff; the worker reports
  itself loaded only once it has the key. Hooks: `_fetch_pubkey`, `_Backend__pubkey_fetch_complete`,
  `Metrics._model_loaded`.
- log_hygiene: no log line prints a query string.
- http_listener: the SDK's second listener (WORKER_HTTP_PORT) binds 127.0.0.1 only.
- outcomes: what the autoscaler is told about refused requests. A refusal the SDK never sees (503
  before the model is loaded or while draining) or does not report (its own 422), of an envelope
  signed for this worker, reaches /delete_requests/ as "Rejected", as the SDK's own 401/429 do; and
  a forged request (its 401 is reported by the SDK) counts no load in rej_load, since its workload is
  computed from a payload nobody signed. Hooks: `_Backend__check_signature`, `Metrics._request_reject`,
  the SDK's AuthData and RequestMetrics types.

This module imports only the standard library at import time (its rules are unit-tested on the host);
aiohttp and the SDK are imported by install(), inside the worker's venv.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from workers.openai import config, sdk_seam
from workers.openai.sdk_seam import GuardError

ACTIVE = (
    "own_url",
    "sessions",
    "self_update",
    "limits",
    "not_ready",
    "envelope",
    "pubkey_retry",
    "log_hygiene",
    "http_listener",
    "outcomes",
)

SERVER_MODULE = sdk_seam.SERVER_MODULE
DATA_TYPES_MODULE = sdk_seam.DATA_TYPES_MODULE
# The SDK's AuthData fields, and the JSON types the worker accepts for each (what the SDK can use
# without crashing: it max()es reqnum, hashes request_idx, b64decodes signature, json.dumps url).
# `()` is any value: the SDK does not use cost or endpoint of a plain request, so they are not judged.
AUTH_FIELDS: dict[str, tuple[type, ...]] = {
    "cost": (),
    "endpoint": (),
    "reqnum": (int,),
    "request_idx": (int,),
    "signature": (str,),
    "url": (str,),
}
LOOPBACK = "127.0.0.1"
# Seconds an idle engine connection is kept for the next request. A new connection per request (the
# SDK's force_close) cost the worker a third of its CPU per request (1360 -> 890 us, issue 6): at 16
# requests to an engine answering in 50 ms, 0.75x -> 0.94x direct throughput, p50 added 17 -> 2.7 ms (BENCHMARKS.md,
# issue 14). 4 s rather than 2 s: a burst that comes 2-4 s after the last one (a 1 s streamed answer
# away) reuses its connections instead of opening 16 at once, first token added at 16 streams
# +11.0 -> +5.2 ms (three A/B pairs). Below the engines' own keep-alive timeout (uvicorn's and
# llama.cpp's: 5 s) with a second to spare: aiohttp never hands out a connection idle longer than
# this, so an engine never closes one just as the worker reuses it.
ENGINE_KEEPALIVE = 4.0
_QUERY = re.compile(r"(?<=[^\s?])\?[^\s\"'<>]+")

log = logging.getLogger("bakery.guards")


# --------------------------------------------------------------------------- limits (environment)


@dataclass(frozen=True)
class Limits:
    """Every limit the guards enforce; each has a default and a variable (VARIABLES)."""

    max_body_bytes: int = 16 * 1024 * 1024
    body_timeout: float = 60.0
    header_timeout: float = 30.0
    engine_connect_timeout: float = 10.0
    engine_idle_timeout: float = 600.0
    retry_after: int = 10
    sessions: bool = False
    session_max_lifetime: float = 600.0
    max_sessions: int = 10
    pubkey_backoff_max: float = 60.0
    pubkey_fetch_timeout: float = 10.0


# field -> (variable, kind, what it is): each row is the variable's row of config.VARIABLES.
LIMIT_VARS: dict[str, str] = {
    "max_body_bytes": "BAKERY_MAX_BODY_BYTES",
    "body_timeout": "BAKERY_BODY_TIMEOUT",
    "header_timeout": "BAKERY_HEADER_TIMEOUT",
    "engine_connect_timeout": "BAKERY_ENGINE_CONNECT_TIMEOUT",
    "engine_idle_timeout": "BAKERY_ENGINE_IDLE_TIMEOUT",
    "retry_after": "BAKERY_RETRY_AFTER",
    "sessions": "BAKERY_SESSIONS",
    "session_max_lifetime": "BAKERY_SESSION_MAX_LIFETIME",
    "max_sessions": "BAKERY_MAX_SESSIONS",
    "pubkey_backoff_max": "BAKERY_PUBKEY_BACKOFF_MAX",
    "pubkey_fetch_timeout": "BAKERY_PUBKEY_FETCH_TIMEOUT",
}
VARIABLES: dict[str, tuple[str, str, str]] = {
    attr: (name, config.BY_NAME[name].kind, config.BY_NAME[name].doc) for attr, name in LIMIT_VARS.items()}
TRUE_WORDS, FALSE_WORDS = config.TRUE_WORDS, config.FALSE_WORDS
parse_bool = config.parse_bool


def load_limits(env: Mapping[str, str]) -> tuple[Limits, list[str]]:
    """The Limits from `env` (unset or blank: the default), and one error line per bad variable."""
    errors: list[str] = []
    values = {attr: config.read(env, name, errors=errors) for attr, name in LIMIT_VARS.items()}
    return Limits(**values), errors


def describe(active: tuple[str, ...], limits: Limits) -> str:
    """The startup line: the active guards and every limit."""
    return (
        f"bakery-worker: guards={','.join(active) or '(none)'} "
        f"max_body={limits.max_body_bytes}B body_timeout={limits.body_timeout:g}s "
        f"header_timeout={limits.header_timeout:g}s engine_connect={limits.engine_connect_timeout:g}s "
        f"engine_idle={limits.engine_idle_timeout:g}s retry_after={limits.retry_after}s "
        f"sessions={'on' if limits.sessions else 'off'} session_lifetime<={limits.session_max_lifetime:g}s "
        f"max_sessions={limits.max_sessions} pubkey_backoff<={limits.pubkey_backoff_max:g}s"
    )


# --------------------------------------------------------------------------- pure rules


def envelope_error(data: Any) -> str | None:
    """Why `data` (a decoded request body) is not an envelope the SDK can serve, or None.

    Every shape the SDK would answer with a 500 (a body that is not an object, auth_data that is not
    an object, a field of a type the SDK cannot use) or a 422 (missing fields) is named here.
    """
    if not isinstance(data, dict):
        return "the request body must be a JSON object {\"auth_data\": {...}, \"payload\": {...}}"
    auth = data.get("auth_data")
    if not isinstance(auth, dict):
        return "auth_data must be a JSON object" if "auth_data" in data else "auth_data is missing"
    error = auth_error(auth, "auth_data")
    if error:
        return error
    if not isinstance(data.get("payload"), dict):
        return "payload must be a JSON object" if "payload" in data else "payload is missing"
    session_id = data.get("session_id")
    if session_id is not None and not isinstance(session_id, str):
        return "session_id must be a string"
    return None


def auth_error(auth: dict[str, Any], where: str) -> str | None:
    """Why `auth` is not a usable auth_data object (missing field, wrong JSON type), or None."""
    for name, kinds in AUTH_FIELDS.items():
        if name not in auth:
            return f"{where}.{name} is missing"
        value = auth[name]
        if kinds and (isinstance(value, bool) or not isinstance(value, kinds)):
            wanted = " or ".join("string" if k is str else "integer" if k is int else "number" for k in kinds)
            return f"{where}.{name} must be {'an' if wanted[0] in 'aeiou' else 'a'} {wanted}"
    return None


def redact_query(text: str) -> str:
    """`text` with every URL query string replaced by `?<redacted>` (the SDK's client puts its api
    key in one)."""
    return _QUERY.sub("?<redacted>", text)


def report_hosts(report_addr: str) -> set[str]:
    """The host names of REPORT_ADDR (comma-separated addresses are tried in order by the SDK)."""
    hosts = set()
    for item in report_addr.split(","):
        host = urlsplit(item.strip()).hostname
        if host:
            hosts.add(host.lower())
    return hosts


def callback_error(route: Any, hosts: set[str]) -> str | None:
    """Why a session's on_close_route may not be called, or None (absent, or an http(s) URL on
    REPORT_ADDR's host without credentials)."""
    if route is None:
        return None
    if not isinstance(route, str):
        return "on_close_route must be a string URL"
    parts = urlsplit(route)
    try:
        parts.port  # noqa: B018 (raises on a malformed port)
    except ValueError:
        return "on_close_route has a malformed port"
    if parts.scheme not in ("http", "https") or (parts.hostname or "").lower() not in hosts:
        return "on_close_route must be an http(s) URL on the autoscaler's host (REPORT_ADDR)"
    if parts.username is not None or parts.password is not None:
        return "on_close_route must not carry credentials"
    return None


def session_create_error(payload: Any, max_lifetime: float, hosts: set[str]) -> str | None:
    """Why a /session/create payload is refused (lifetime, callback), or None."""
    if not isinstance(payload, dict):
        return "payload must be a JSON object"
    lifetime = payload.get("lifetime", 60.0)
    if isinstance(lifetime, bool) or not isinstance(lifetime, (int, float)) or not math.isfinite(lifetime) \
            or not 0 < lifetime <= max_lifetime:
        return f"payload.lifetime must be a number of seconds in (0, {max_lifetime:g}] (BAKERY_SESSION_MAX_LIFETIME)"
    return callback_error(payload.get("on_close_route"), hosts)


def backoff(cap: float, first: float = 1.0) -> Iterator[float]:
    """Waits between retries: first, doubling, never above `cap`."""
    delay = min(first, cap)
    while True:
        yield delay
        delay = min(delay * 2, cap)


def _is_under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


# --------------------------------------------------------------------------- installing


@dataclass
class Context:
    """What the guards hook into, and what they contribute to the SDK's server (collected first,
    applied once by the `web` shim)."""

    backend: Any
    limits: Limits
    routes: tuple[str, ...]
    http_port: int
    report_addr: str
    middlewares: list[tuple[int, Any]] = field(default_factory=list)
    app_kwargs: dict[str, Any] = field(default_factory=dict)
    runner_kwargs: dict[str, Any] = field(default_factory=dict)
    site_hosts: dict[int, str] = field(default_factory=dict)
    on_startup: list[Callable[[Any], Awaitable[None]]] = field(default_factory=list)
    handlers: Mapping[str, Any] = field(default_factory=dict)  # route -> the SDK's EndpointHandler


# Middleware order, outermost first: refusals that need no body before those that read it.
# outcomes is outermost (outside the drain's -1): it sees every refusal, the drain's 503 included.
RANK = {"outcomes": -2, "self_update": 0, "limits_body": 1, "sessions": 2, "not_ready": 3, "envelope": 4,
        "limits_engine": 5}
# Set per request by the limits guard; the engine-call wrapper records a timeout in it (a task the
# SDK creates for the call copies the context, and with it this same dict).
_OUTCOME: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("bakery_outcome", default=None)


def _hook(obj: Any, key: str, guard: str) -> Any:
    """The SDK hook `key` (sdk_seam.HOOKS) on `obj`, or GuardError naming the guard that needs it."""
    return sdk_seam.find(obj, key, f"guard {guard}")


def _error(web: Any, status: int, message: str, **headers: str) -> Any:
    return web.json_response({"error": message}, status=status, headers=headers or None)


async def _read_json(request: Any) -> tuple[Any, str | None]:
    """The request's JSON body decoded as aiohttp's request.json() would, or an error."""
    body = await request.read()
    try:
        text = body.decode(request.charset or "utf-8")
    except (LookupError, UnicodeDecodeError):
        return None, "the request body is not valid UTF-8 (or names an unknown charset)"
    try:
        return json.loads(text), None
    except (ValueError, RecursionError):
        return None, "the request body is not valid JSON"


def _install_own_url(ctx: Context, web: Any) -> None:
    backend = ctx.backend
    own = _hook(_hook(backend, "metrics", "own_url"), "own_url", "own_url")
    original = _hook(backend, "check_signature", "own_url")
    refused = [0]

    def check_signature(auth_data: Any) -> bool:
        if not backend.unsecured and auth_data.url != own:
            refused[0] += 1
            if refused[0] in (1, 10, 100, 1000, 10000) or refused[0] % 100000 == 0:
                log.warning("refused %d request(s) signed for another worker's URL (last: %r; this worker "
                            "is %r)", refused[0], redact_query(str(auth_data.url))[:200], own)
            return False
        return original(auth_data)

    sdk_seam.put(backend, "check_signature", check_signature)


def _install_sessions(ctx: Context, web: Any) -> None:
    _, auth_cls = sdk_seam.module_hook("auth_data", "guard sessions")
    _hook(ctx.backend, "check_signature", "sessions")  # called per request (own_url may wrap it)
    backend, limits, hosts = ctx.backend, ctx.limits, report_hosts(ctx.report_addr)

    @web.middleware
    async def sessions(request: Any, handler: Any) -> Any:
        if not _is_under(request.path, "/session"):
            return await handler(request)
        if not limits.sessions:
            return _error(web, 404, "sessions are disabled on this worker (BAKERY_SESSIONS)")
        data, error = await _read_json(request)
        if error is None and not isinstance(data, dict):
            error = "the request body must be a JSON object"
        if error is None:
            creating = request.path == "/session/create"
            key = "auth_data" if creating else "session_auth"
            auth = data.get(key)
            error = auth_error(auth, key) if isinstance(auth, dict) else f"{key} must be a JSON object"
            if error is None and creating:
                error = session_create_error(data.get("payload"), limits.session_max_lifetime, hosts)
                cost = auth["cost"]
                if error is None and (not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost < 0):
                    error = "auth_data.cost must be a non-negative number for a session"
            if error is None and not creating and not isinstance(data.get("session_id"), str):
                error = "session_id must be a string"
        if error is not None:
            return _error(web, 422, error)
        if not sdk_seam.check_signature(backend, auth_cls.from_json_msg(auth)):
            return _error(web, 401, "the session request is not signed for this worker")
        return await handler(request)

    ctx.middlewares.append((RANK["sessions"], sessions))


def _install_self_update(ctx: Context, web: Any) -> None:
    @web.middleware
    async def self_update(request: Any, handler: Any) -> Any:
        if _is_under(request.path, "/pyworker"):
            return _error(web, 403, "self-update is disabled: this image is version-locked")
        return await handler(request)

    ctx.middlewares.append((RANK["self_update"], self_update))


def _install_limits(ctx: Context, web: Any) -> None:
    import aiohttp

    backend, limits, routes = ctx.backend, ctx.limits, ctx.routes
    sdk_seam.require_session_property(backend, "guard limits")
    call_backend = _hook(backend, "call_backend", "limits")
    ctx.app_kwargs["client_max_size"] = limits.max_body_bytes
    # aiohttp closes a connection whose handler waits for a request longer than this: at the start
    # of a connection (headers not complete) and between requests.
    ctx.runner_kwargs["keepalive_timeout"] = limits.header_timeout

    async def engine_session(app: Any) -> None:
        if sdk_seam.has_engine_session(backend):
            return
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=limits.engine_connect_timeout,
                                        sock_read=limits.engine_idle_timeout)
        # As the SDK makes it, plus the timeouts, and with engine connections kept alive between
        # requests (the SDK's force_close opened one per request: see ENGINE_KEEPALIVE).
        sdk_seam.set_engine_session(backend, aiohttp.ClientSession(
            backend.model_server_url, timeout=timeout,
            connector=aiohttp.TCPConnector(keepalive_timeout=ENGINE_KEEPALIVE, enable_cleanup_closed=True)))

    async def call_with_timeouts(*args: Any, **kwargs: Any) -> Any:
        try:
            response = await call_backend(*args, **kwargs)
            # A non-streamed answer is read here, so that an engine going silent mid-answer is
            # seen as a timeout of this call (the SDK would read it later and answer 500).
            if getattr(response, "content_type", None) == "application/json" and hasattr(response, "read"):
                await response.read()
            return response
        except asyncio.TimeoutError as exc:
            outcome = _OUTCOME.get()
            if outcome is not None:
                outcome["timeout"] = type(exc).__name__
            raise

    sdk_seam.put(backend, "call_backend", call_with_timeouts)
    ctx.on_startup.append(engine_session)

    @web.middleware
    async def limits_body(request: Any, handler: Any) -> Any:
        length = request.content_length
        if length is not None and length > limits.max_body_bytes:
            return _error(web, 413, f"the request body is larger than {limits.max_body_bytes} bytes "
                                    "(BAKERY_MAX_BODY_BYTES)")
        if request.can_read_body:
            try:
                await _within(request.read(), limits.body_timeout)
            except web.HTTPRequestEntityTooLarge:
                return _error(web, 413, f"the request body is larger than {limits.max_body_bytes} bytes "
                                        "(BAKERY_MAX_BODY_BYTES)")
            except asyncio.TimeoutError:
                return _error(web, 408, f"the request body did not arrive within {limits.body_timeout:g} s "
                                        "(BAKERY_BODY_TIMEOUT)")
        return await handler(request)

    @web.middleware
    async def limits_engine(request: Any, handler: Any) -> Any:
        if request.path not in routes:
            return await handler(request)
        outcome: dict[str, str] = {}
        token = _OUTCOME.set(outcome)
        try:
            response = await handler(request)
        finally:
            _OUTCOME.reset(token)
        if "timeout" in outcome and response.status == 500 and not response.prepared:
            return _error(web, 504, f"the engine did not answer in time ({outcome['timeout']}; "
                                    "BAKERY_ENGINE_CONNECT_TIMEOUT, BAKERY_ENGINE_IDLE_TIMEOUT)")
        return response

    ctx.middlewares.append((RANK["limits_body"], limits_body))
    ctx.middlewares.append((RANK["limits_engine"], limits_engine))


async def _within(awaitable: Awaitable[Any], seconds: float) -> Any:
    """`awaitable`'s result, or asyncio.TimeoutError after `seconds` (no extra task on Python 3.11+)."""
    if hasattr(asyncio, "timeout"):
        async with asyncio.timeout(seconds):
            return await awaitable
    return await asyncio.wait_for(awaitable, seconds)


def _install_not_ready(ctx: Context, web: Any) -> None:
    _hook(_hook(ctx.backend, "metrics", "not_ready"), "model_is_loaded", "not_ready")
    metrics, routes, retry = ctx.backend.metrics, ctx.routes, str(ctx.limits.retry_after)

    @web.middleware
    async def not_ready(request: Any, handler: Any) -> Any:
        if request.path in routes and not metrics.system_metrics.model_is_loaded:
            return _error(web, 503, "the model is not loaded yet", **{"Retry-After": retry})
        return await handler(request)

    ctx.middlewares.append((RANK["not_ready"], not_ready))


# The SDK answers these without a body; the envelope guard gives them one.
_BARE = {401: "the request is not signed for this worker", 410: "the session does not exist",
         429: "the worker's queue is full; retry later", 500: "the engine request failed"}


def _install_envelope(ctx: Context, web: Any) -> None:
    routes = ctx.routes

    @web.middleware
    async def envelope(request: Any, handler: Any) -> Any:
        if request.path not in routes:
            return await handler(request)
        data, error = await _read_json(request)
        if error is None:
            error = envelope_error(data)
        if error is not None:
            return _error(web, 422, error)
        response = await handler(request)
        if response.status in _BARE and not response.prepared and not getattr(response, "body", b"x"):
            return _error(web, response.status, _BARE[response.status])
        return response

    ctx.middlewares.append((RANK["envelope"], envelope))


def _install_pubkey_retry(ctx: Context, web: Any) -> None:
    import aiohttp
    from Crypto.PublicKey import RSA

    backend, limits = ctx.backend, ctx.limits
    _hook(backend, "fetch_pubkey", "pubkey_retry")
    _hook(backend, "pubkey", "pubkey_retry")
    fetched = _hook(backend, "pubkey_fetched", "pubkey_retry")
    metrics = _hook(backend, "metrics", "pubkey_retry")
    report_loaded = _hook(metrics, "model_loaded", "pubkey_retry")
    first = ctx.report_addr.split(",")[0].strip().rstrip("/")
    url = f"{first}/pubkey/"
    waiting: list[float] = []

    def model_loaded(max_throughput: float) -> None:
        if sdk_seam.get(backend, "pubkey") is None and not backend.unsecured:
            if not waiting:
                log.warning("the model is ready; it is reported loaded once the public key from %s loads", url)
            waiting.append(max_throughput)
            return
        report_loaded(max_throughput=max_throughput)

    async def fetch_until_loaded() -> None:
        # Set at once: the SDK's readiness waits 60 s for it and then errors the worker for good.
        # Readiness is held back in model_loaded() instead, until the key is here.
        fetched.set()
        if backend.unsecured:
            return
        started, tries = time.monotonic(), 0
        for delay in backoff(limits.pubkey_backoff_max):
            tries += 1
            try:
                timeout = aiohttp.ClientTimeout(total=limits.pubkey_fetch_timeout)
                async with aiohttp.ClientSession(timeout=timeout) as client, client.get(url) as response:
                    response.raise_for_status()
                    key = RSA.import_key(await response.text())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 (any failure: retry later, the key may come)
                if tries == 1:
                    log.warning("the public key is not available from %s (%s); retrying with backoff up to "
                                "%g s until it is (requests get 503 meanwhile)", url,
                                redact_query(str(exc)) or type(exc).__name__, limits.pubkey_backoff_max)
                await asyncio.sleep(delay)
                continue
            sdk_seam.put(backend, "pubkey", key)
            log.warning("public key loaded from %s (try %d, after %.1f s)", url, tries, time.monotonic() - started)
            if waiting:
                report_loaded(max_throughput=waiting[-1])
            return

    sdk_seam.put(metrics, "model_loaded", model_loaded)
    sdk_seam.put(backend, "fetch_pubkey", fetch_until_loaded)


class QueryRedactor(logging.Filter):
    """Rewrites a record whose message holds a URL query string (see redact_query); drops nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "?" in message:
            clean = redact_query(message)
            if clean != message:
                record.msg, record.args = clean, None
        return True


REDACTED_LOGGERS = ("aiohttp.access", "aiohttp.server", "aiohttp.web", "aiohttp.client")


def _install_log_hygiene(ctx: Context, web: Any) -> None:
    redactor = QueryRedactor()
    for handler in logging.getLogger().handlers:
        handler.addFilter(redactor)
    for name in REDACTED_LOGGERS:  # also when a record does not reach the root's handlers
        logging.getLogger(name).addFilter(redactor)


def _install_http_listener(ctx: Context, web: Any) -> None:
    ctx.site_hosts[ctx.http_port] = LOOPBACK


# --------------------------------------------------------------------------- outcomes

# The refusals whose outcome the SDK never reports: the worker's own 503s (not loaded, draining) and
# 422s, and the SDK's 422. (413 and 408 are left: their body was never read whole, so they name no
# request; every other status was reported by the SDK's handler.)
REPORTED_REFUSALS = (422, 503)
# How long the outcomes guard waits for the body of a refused request it has not read yet (a 503 while
# draining comes before any body is read): the platform's envelopes arrive at once.
REFUSAL_READ_SECONDS = 2.0
_SIGNATURE: contextvars.ContextVar[dict[str, bool] | None] = contextvars.ContextVar("bakery_signature", default=None)


def _install_outcomes(ctx: Context, web: Any) -> None:
    _, auth_cls = sdk_seam.module_hook("auth_data", "guard outcomes")
    _, metrics_cls = sdk_seam.module_hook("request_metrics", "guard outcomes")
    backend = ctx.backend
    metrics = _hook(backend, "metrics", "outcomes")
    reject = _hook(metrics, "request_reject", "outcomes")
    check = _hook(backend, "check_signature", "outcomes")  # own_url's, when it is installed first
    _hook(backend, "pubkey", "outcomes")
    routes, handlers = ctx.routes, ctx.handlers

    def check_signature(auth_data: Any) -> bool:
        valid = check(auth_data)
        seen = _SIGNATURE.get()
        if seen is not None:
            seen["forged"] = not valid
        return valid

    def request_reject(request_metrics: Any) -> None:
        seen = _SIGNATURE.get()
        if seen is not None and seen.get("forged"):
            request_metrics.workload = 0.0  # the SDK computed it from an unsigned payload
        reject(request_metrics)

    def workload_of(route: str, data: dict[str, Any]) -> float:
        # The SDK's own count for the route (its handler's payload type), 0 for a payload it cannot read.
        handler = handlers.get(route)
        try:
            _, payload, _ = handler.get_data_from_request(data)
            return float(payload.count_workload())
        except Exception:  # noqa: BLE001 (an unusable payload is no load)
            return 0.0

    async def signed_envelope(request: Any) -> dict[str, Any] | None:
        """The request's envelope when it is signed for this worker, else None (nothing to trust)."""
        if sdk_seam.get(backend, "pubkey") is None and not backend.unsecured:
            return None  # no key yet: no signature can be checked
        try:
            data, error = await _within(_read_json(request), REFUSAL_READ_SECONDS)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 (too slow, too large, cut: an unread body names no request)
            return None
        auth = data.get("auth_data") if error is None and isinstance(data, dict) else None
        if not isinstance(auth, dict) or auth_error(auth, "auth_data"):
            return None
        return data if sdk_seam.check_signature(backend, auth_cls.from_json_msg(auth)) else None

    @web.middleware
    async def outcomes(request: Any, handler: Any) -> Any:
        if request.path not in routes:
            return await handler(request)
        seen: dict[str, bool] = {}
        token = _SIGNATURE.set(seen)
        try:
            response = await handler(request)
            if response.status in REPORTED_REFUSALS and "forged" not in seen:
                data = await signed_envelope(request)
                if data is not None:
                    auth = data["auth_data"]
                    reject(metrics_cls(request_idx=auth["request_idx"], reqnum=auth["reqnum"],
                                       workload=workload_of(request.path, data), status="Created",
                                       entered_queue_at=time.time()))
            return response
        finally:
            _SIGNATURE.reset(token)

    sdk_seam.put(backend, "check_signature", check_signature)
    sdk_seam.put(metrics, "request_reject", request_reject)
    ctx.middlewares.append((RANK["outcomes"], outcomes))


INSTALLERS: dict[str, Callable[[Context, Any], None]] = {
    "own_url": _install_own_url,
    "sessions": _install_sessions,
    "self_update": _install_self_update,
    "limits": _install_limits,
    "not_ready": _install_not_ready,
    "envelope": _install_envelope,
    "pubkey_retry": _install_pubkey_retry,
    "log_hygiene": _install_log_hygiene,
    "http_listener": _install_http_listener,
    "outcomes": _install_outcomes,
}


WebShim = sdk_seam.WebShim  # applies what the guards collected in their Context to the SDK's apps


def install(worker: Any, limits: Limits, *, routes: tuple[str, ...], http_port: int, report_addr: str,
            active: tuple[str, ...] | None = None, handlers: Mapping[str, Any] | None = None) -> Context:
    """Install the guards named in `active` (default ACTIVE) around the SDK Worker `worker`.

    Call after the Worker is made (it owns the Backend) and before worker.run(). `handlers` maps each
    served route to the SDK's EndpointHandler for it (the outcomes guard counts a refused request's
    workload with it; without it a refusal counts no load). Raises GuardError for an unknown name or a
    missing SDK hook.
    """
    names = ACTIVE if active is None else active
    unknown = [name for name in names if name not in INSTALLERS]
    if unknown:
        raise GuardError(f"unknown guard(s) {', '.join(unknown)} in ACTIVE; known: {', '.join(INSTALLERS)}")
    real_web = sdk_seam.real_web("install")
    backend = getattr(worker, "backend", None)
    if backend is None:
        raise GuardError("install: the SDK's Worker has no backend any more (vastai changed): update "
                         f"{sdk_seam.SEAM_FILE}")
    ctx = Context(backend=backend, limits=limits, routes=tuple(routes),
                  http_port=http_port, report_addr=report_addr, handlers=dict(handlers or {}))
    for name in names:
        INSTALLERS[name](ctx, real_web)
    sdk_seam.install_web(real_web, ctx)
    return ctx
