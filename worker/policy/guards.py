"""Guards the worker puts around the vastai SDK's HTTP server (port 3000): what the SDK leaves open.

Each guard is named in ACTIVE and installed by install(); removing a name disables that guard alone. The rules
are rules.py's; every SDK hook is a row of sdk_seam.HOOKS, checked at start (a missing one exits 4 rather than
run unguarded). Stdlib only at import; install() imports aiohttp and the SDK. See docs/security.md.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from config import request_path, table
from control import own_handler, sdk_seam
from control.sdk_seam import GuardError
from logs import log_escape
from policy import admission, key_rotation, rules

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

log = logging.getLogger("bakery.guards")


# --------------------------------------------------------------------------- limits (environment)


@dataclass(frozen=True)
class Limits:
    """Every limit the guards enforce; each has a default and a variable (VARIABLES)."""

    max_body_bytes: int = 16 * 1024 * 1024
    body_timeout: float = 60.0
    header_timeout: float = 30.0
    send_timeout: float = 30.0
    engine_connect_timeout: float = 10.0
    engine_idle_timeout: float = 600.0
    retry_after: int = 10
    sessions: bool = False
    session_max_lifetime: float = 600.0
    max_sessions: int = 10
    pubkey_backoff_max: float = 60.0
    pubkey_fetch_timeout: float = 10.0
    pubkey_refresh: float = 300.0
    pubkey_refetch_min: float = 10.0
    max_buffered_bytes: int = 256 * 1024 * 1024  # why: table.VARIABLES
    max_connections: int = 2048


# field -> (variable, kind, what it is): each row is the variable's row of table.VARIABLES.
LIMIT_VARS: dict[str, str] = {
    "max_body_bytes": "BAKERY_MAX_BODY_BYTES",
    "body_timeout": "BAKERY_BODY_TIMEOUT",
    "header_timeout": "BAKERY_HEADER_TIMEOUT",
    "send_timeout": "BAKERY_SEND_TIMEOUT",
    "engine_connect_timeout": "BAKERY_ENGINE_CONNECT_TIMEOUT",
    "engine_idle_timeout": "BAKERY_ENGINE_IDLE_TIMEOUT",
    "retry_after": "BAKERY_RETRY_AFTER",
    "sessions": "BAKERY_SESSIONS",
    "session_max_lifetime": "BAKERY_SESSION_MAX_LIFETIME",
    "max_sessions": "BAKERY_MAX_SESSIONS",
    "pubkey_backoff_max": "BAKERY_PUBKEY_BACKOFF_MAX",
    "pubkey_fetch_timeout": "BAKERY_PUBKEY_FETCH_TIMEOUT",
    "pubkey_refresh": "BAKERY_PUBKEY_REFRESH",
    "pubkey_refetch_min": "BAKERY_PUBKEY_REFETCH_MIN",
    "max_buffered_bytes": "BAKERY_MAX_BUFFERED_BYTES",
    "max_connections": "BAKERY_MAX_CONNECTIONS",
}
VARIABLES: dict[str, tuple[str, str, str]] = {
    attr: (name, table.BY_NAME[name].kind, table.BY_NAME[name].doc) for attr, name in LIMIT_VARS.items()}
TRUE_WORDS, FALSE_WORDS = table.TRUE_WORDS, table.FALSE_WORDS
parse_bool = table.parse_bool


def load_limits(env: Mapping[str, str]) -> tuple[Limits, list[str]]:
    """The Limits from `env` (unset or blank: the default), and one error line per bad variable."""
    errors: list[str] = []
    values = {attr: table.read(env, name, errors=errors) for attr, name in LIMIT_VARS.items()}
    return Limits(**values), errors


def describe(active: tuple[str, ...], limits: Limits) -> str:
    """The startup line: the active guards and every limit."""
    return (
        f"bakery-worker: guards={','.join(active) or '(none)'} "
        f"max_body={limits.max_body_bytes}B body_timeout={limits.body_timeout:g}s "
        f"header_timeout={limits.header_timeout:g}s send_timeout={limits.send_timeout:g}s "
        f"engine_connect={limits.engine_connect_timeout:g}s engine_idle={limits.engine_idle_timeout:g}s "
        f"retry_after={limits.retry_after}s "
        f"sessions={'on' if limits.sessions else 'off'} session_lifetime<={limits.session_max_lifetime:g}s "
        f"max_sessions={limits.max_sessions} pubkey_backoff<={limits.pubkey_backoff_max:g}s "
        f"max_buffered={limits.max_buffered_bytes}B max_connections={limits.max_connections} "
        f"pubkey_refresh={limits.pubkey_refresh:g}s pubkey_refetch>={limits.pubkey_refetch_min:g}s"
    )


# --------------------------------------------------------------------------- pure rules


def backoff(cap: float, first: float = 1.0) -> Iterator[float]:
    """Waits between retries: first, doubling, never above `cap`."""
    delay = min(first, cap)
    while True:
        yield delay
        delay = min(delay * 2, cap)


# --------------------------------------------------------------------------- installing


@dataclass
class Context:
    """What the guards hook into, and what they contribute to the SDK's server (collected first,
    applied once by the `web` shim)."""

    sdk: Any  # sdk_seam.ControlPlane: the SDK's control plane, by name
    limits: Limits
    routes: tuple[str, ...]
    http_port: int
    report_addr: str
    platform: Any  # signature.Trust: the platform's key and UNSECURED
    outcomes: Any  # sdk_seam.Outcomes (a front process's own): where a request's outcome is reported
    # The request path's two chains, bakery's own (config/request_path.py): each guard wraps its layer on.
    check_signature: Callable[[Any], bool]
    call_engine: Callable[..., Awaitable[Any]]
    middlewares: list[tuple[int, Any]] = field(default_factory=list)
    app_kwargs: dict[str, Any] = field(default_factory=dict)
    runner_kwargs: dict[str, Any] = field(default_factory=dict)
    site_hosts: dict[int, str] = field(default_factory=dict)
    on_startup: list[Callable[[Any], Awaitable[None]]] = field(default_factory=list)
    handlers: Mapping[str, Any] = field(default_factory=dict)  # route -> its own_handler.Route
    # wrap(runner, port) -> the runner a listener on `port` is made on (admission's connection cap)
    site_runners: list[Callable[[Any, int | None], Any]] = field(default_factory=list)
    listen_backlog: int = 0  # every listener's but http_port's (admission.listen_backlog); 0: aiohttp's
    admission: tuple[Any, Any] | None = None  # (Budget, Connections) of the limits guard, when installed
    drain: Any = None  # serving.install's Drain
    signature_known: Callable[[str, str], bool] | None = None  # signature_memo's knows(url, signature)
    pool: Any = None  # forward.Pool, the engine connections (core.install_parts)
    key_changed: list[Callable[[], None]] = field(default_factory=list)  # called when key rotation loads a key


_OUTCOME = rules.OUTCOME  # the engine call's timeout, for the limits_engine middleware's 504
# The request rules live in rules.py (bakery's HTTP policy); named here too, as the guards' rules.
AUTH_FIELDS, REDACTED_LOGGERS, QueryRedactor = rules.AUTH_FIELDS, rules.REDACTED_LOGGERS, rules.QueryRedactor
envelope_error, auth_error, redact_query = rules.envelope_error, rules.auth_error, rules.redact_query
report_hosts, callback_error = rules.report_hosts, rules.callback_error
session_create_error = rules.session_create_error



now_and_then = rules.now_and_then


def _install_own_url(ctx: Context, web: Any) -> None:
    own = ctx.sdk.own_url()
    original, platform = ctx.check_signature, ctx.platform
    refused, misshapen = [0], [0]
    sized: list[Any] = [None, 0]  # (key, its size in bytes): pycryptodome recomputes it from the modulus

    def check_signature(auth_data: Any) -> bool:
        if not platform.unsecured and auth_data.url != own:
            refused[0] += 1
            if now_and_then(refused[0]):
                log.warning("refused %d request(s) signed for another worker's URL (last: %r; this worker "
                            "is %r)", refused[0], redact_query(str(auth_data.url))[:200], own)
            return False
        key = platform.pubkey()
        if not platform.unsecured and key is not None:
            if sized[0] is not key:
                sized[:] = [key, key.size_in_bytes()]
            problem = rules.signature_error(str(auth_data.signature), sized[1])
            if problem:  # refused before any RSA step
                misshapen[0] += 1
                if now_and_then(misshapen[0]):
                    log.warning("refused %d request(s) whose signature is not one (last: %s)", misshapen[0], problem)
                return False
        return original(auth_data)

    ctx.check_signature = request_path.layer("own_url", check_signature, original)


def signature_check(ctx: Context, who: str) -> Callable[[dict[str, Any]], bool]:
    """The signature check as a request meets it (every guard's layer, looked up at each call), on an
    envelope's auth object whose fields signed_first.py read (all of them: auth_error refused the rest)."""
    made, fields = own_handler.AuthData, own_handler.AUTH_FIELDS
    return lambda auth: ctx.check_signature(made(*(auth[name] for name in fields)))


def _install_sessions(ctx: Context, web: Any) -> None:
    from policy import signed_first  # msgspec: the worker venv's
    limits = ctx.limits
    verify = signature_check(ctx, "sessions")
    ctx.middlewares.append(request_path.middleware("sessions", signed_first.sessions_middleware(
        web, limits.sessions, limits.session_max_lifetime, report_hosts(ctx.report_addr), verify)))


def _install_self_update(ctx: Context, web: Any) -> None:
    ctx.middlewares.append(request_path.middleware("self_update", rules.self_update_middleware(web)))


def _install_limits(ctx: Context, web: Any) -> None:
    import aiohttp

    plane, limits, routes = ctx.sdk, ctx.limits, ctx.routes
    call_engine = ctx.call_engine
    ctx.app_kwargs["client_max_size"] = limits.max_body_bytes
    # aiohttp closes a connection whose handler waits for a request longer than this: at the start
    # of a connection (headers not complete) and between requests.
    ctx.runner_kwargs["keepalive_timeout"] = limits.header_timeout

    async def engine_session(app: Any) -> None:
        if plane.has_engine_session():
            return
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=limits.engine_connect_timeout,
                                        sock_read=limits.engine_idle_timeout)
        # As the SDK makes it, plus the timeouts, and with engine connections kept alive between
        # requests (the SDK's force_close opened one per request: see ENGINE_KEEPALIVE).
        plane.set_engine_session(aiohttp.ClientSession(
            plane.engine_url(), timeout=timeout,
            connector=aiohttp.TCPConnector(keepalive_timeout=ENGINE_KEEPALIVE, enable_cleanup_closed=True)))

    async def call_with_timeouts(*args: Any, **kwargs: Any) -> Any:
        try:
            response = await call_engine(*args, **kwargs)
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

    ctx.call_engine = request_path.layer("engine_timeouts", call_with_timeouts, call_engine)
    ctx.on_startup.append(engine_session)
    ctx.middlewares.append(request_path.middleware("limits_body", rules.limits_body_middleware(
        web, limits.max_body_bytes, limits.body_timeout)))
    ctx.middlewares.append(request_path.middleware("limits_engine", rules.limits_engine_middleware(web, routes)))
    ctx.admission = admission.install(ctx, web)


def _install_not_ready(ctx: Context, web: Any) -> None:
    ctx.middlewares.append(request_path.middleware("not_ready", rules.not_ready_middleware(
        web, ctx.routes, ctx.outcomes.loaded, ctx.limits.retry_after)))


def _install_envelope(ctx: Context, web: Any) -> None:
    from policy import signed_first  # msgspec: the worker venv's

    outcomes = ctx.outcomes
    verify = signature_check(ctx, "envelope")

    def reject(auth: dict[str, Any]) -> None:
        # As the SDK reports its own 401, with no load: nobody signed the payload.
        outcomes.reject(outcomes.new(auth["request_idx"], auth["reqnum"], 0.0))

    ctx.middlewares.append(request_path.middleware(
        "envelope", signed_first.envelope_middleware(web, ctx.routes, verify, reject)))


def new_key(ctx: Context, key: Any) -> None:
    """Load the platform's new key, and tell who must know in the same step (front/processes.py: a front process
    serves no pair of the old key from here on)."""
    ctx.platform.set_pubkey(key)
    for changed in ctx.key_changed:
        changed()


def _install_pubkey_retry(ctx: Context, web: Any) -> None:
    plane, limits, platform = ctx.sdk, ctx.limits, ctx.platform
    first = ctx.report_addr.split(",")[0].strip().rstrip("/")
    url = f"{first}/pubkey/"
    waiting: list[float] = []
    rotation = key_rotation.Rotation(
        url, limits.pubkey_refresh, limits.pubkey_refetch_min,
        lambda: key_rotation.fetch_key(url, limits.pubkey_fetch_timeout),
        platform.pubkey, lambda key: new_key(ctx, key))

    def model_loaded(max_throughput: float) -> None:
        if platform.pubkey() is None and not platform.unsecured:
            if not waiting:
                log.warning("the model is ready; it is reported loaded once the public key from %s loads", url)
            waiting.append(max_throughput)
            return
        report_loaded(max_throughput=max_throughput)

    async def fetch_until_loaded() -> None:
        # Set at once: the SDK's readiness waits 60 s for it and then errors the worker for good.
        # Readiness is held back in model_loaded() instead, until the key is here.
        plane.key_fetch_done()
        if platform.unsecured:
            return
        started, tries = time.monotonic(), 0
        for delay in backoff(limits.pubkey_backoff_max):
            tries += 1
            try:
                key = await key_rotation.fetch_key(url, limits.pubkey_fetch_timeout)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 (any failure: retry later, the key may come)
                if tries == 1:
                    log.warning("the public key is not available from %s (%s); retrying with backoff up to "
                                "%g s until it is (requests get 503 meanwhile)", url,
                                redact_query(str(exc)) or type(exc).__name__, limits.pubkey_backoff_max)
                await asyncio.sleep(delay)
                continue
            platform.set_pubkey(key)
            log.warning("public key loaded from %s (try %d, after %.1f s)", url, tries, time.monotonic() - started)
            if waiting:
                report_loaded(max_throughput=waiting[-1])
            await rotation.run()  # from now on the key follows the autoscaler's (for the worker's lifetime)
            return

    def keyed() -> bool:  # failures count only while signatures are checked against a key
        return not platform.unsecured and platform.pubkey() is not None

    report_loaded = plane.replace_loaded_mark(model_loaded)
    plane.replace_key_fetch(fetch_until_loaded)
    # Over own_url's layer: its refusals (a signature of another key size is misshapen for this one) count.
    ctx.check_signature = key_rotation.counting(ctx.check_signature, rotation, keyed)


def _install_log_hygiene(ctx: Context, web: Any) -> None:
    redactor, escaper = QueryRedactor(), log_escape.Escaper()
    for handler in logging.getLogger().handlers:
        handler.addFilter(escaper)  # first: the redactors then see each value on one line
        handler.addFilter(redactor)
        handler.addFilter(rules.TokenRedactor())
    for name in REDACTED_LOGGERS:  # also when a record does not reach the root's handlers
        logging.getLogger(name).addFilter(escaper)
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
    from policy import signed_first  # msgspec: the worker venv's

    told, platform = ctx.outcomes, ctx.platform
    reject = told.reject
    check = ctx.check_signature  # own_url's, when it is installed first
    routes, handlers = ctx.routes, ctx.handlers
    verify = signature_check(ctx, "outcomes")

    def check_signature(auth_data: Any) -> bool:
        valid = check(auth_data)
        seen = _SIGNATURE.get()
        if seen is not None:
            seen["forged"] = not valid
        return valid

    def request_reject(request_metrics: Any) -> None:
        seen = _SIGNATURE.get()
        if seen is not None and seen.get("forged"):
            request_metrics.workload = 0.0  # computed from an unsigned payload
        reject(request_metrics)

    def workload_of(route: str, data: dict[str, Any]) -> float:
        # The route's own count (its payload's), 0 for a payload it cannot read.
        handler = handlers.get(route)
        try:
            _, payload, _ = handler.parse(data)
            return float(payload.count_workload())
        except Exception:  # noqa: BLE001 (an unusable payload is no load)
            return 0.0

    async def signed_envelope(request: Any) -> dict[str, Any] | None:
        """The request's envelope when it is signed for this worker, else None (nothing to trust)."""
        if platform.pubkey() is None and not platform.unsecured:
            return None  # no key yet: no signature can be checked
        try:
            body = await rules.within(request.read(), REFUSAL_READ_SECONDS)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 (too slow, too large, cut: an unread body names no request)
            return None
        # Signed first: the payload is parsed (for its workload) only once the signature holds.
        found = signed_first.read(body, request.charset)
        if found.auth is None or not found.checkable or not verify(found.auth):
            return None
        data, error = await rules.read_json(request)
        return data if error is None and isinstance(data, dict) else {"auth_data": found.auth}

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
                    reject(told.new(auth["request_idx"], auth["reqnum"], workload_of(request.path, data)))
            return response
        finally:
            _SIGNATURE.reset(token)

    ctx.check_signature = request_path.layer("outcomes_mark", check_signature, check)
    told.reject = request_reject
    ctx.middlewares.append(request_path.middleware("outcomes", outcomes))


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
            platform: Any, check_signature: Callable[[Any], bool],
            call_engine: Callable[..., Awaitable[Any]], outcomes: Any = None, active: tuple[str, ...] | None = None,
            handlers: Mapping[str, Any] | None = None, sdk: Any = None) -> Context:
    """Install the guards named in `active` (default ACTIVE) around the SDK Worker `worker`.

    Call after the Worker is made (it owns the Backend) and before worker.run(). `platform` holds the
    platform's key and UNSECURED (signature.Trust); `check_signature` and
    `call_engine` are the innermost layers of the request path's two chains (ctx holds them wrapped);
    `outcomes` is where outcomes are reported (default: the SDK's Metrics). `handlers` maps each
    served route to its own_handler.Route (the outcomes guard counts a refused request's workload with
    it; without it a refusal counts no load); `sdk` the worker's ControlPlane (made here if not given).
    Raises GuardError for an unknown name or a missing SDK hook.
    """
    names = ACTIVE if active is None else active
    unknown = [name for name in names if name not in INSTALLERS]
    if unknown:
        raise GuardError(f"unknown guard(s) {', '.join(unknown)} in ACTIVE; known: {', '.join(INSTALLERS)}")
    real_web = sdk_seam.real_web("install")
    plane = sdk_seam.ControlPlane(worker.backend) if sdk is None else sdk
    ctx = Context(sdk=plane, limits=limits, routes=tuple(routes), http_port=http_port,
                  report_addr=report_addr, platform=platform,
                  outcomes=plane.outcomes() if outcomes is None else outcomes,
                  check_signature=check_signature, call_engine=call_engine, handlers=dict(handlers or {}))
    for name in names:
        INSTALLERS[name](ctx, real_web)
    sdk_seam.install_web(real_web, ctx)
    return ctx
