"""The one place the worker touches the vastai SDK's internals: a table of hooks, and how they are used.

It is the only worker module that names a private SDK attribute (tests/worker/test_sdk_seam.py checks the
others' source); they call `find`, `wrap`, `put`, `get` and the helpers here. `missing(worker)` checks every
HOOKS row at start: core.run() exits 4 rather than run unguarded. See docs/architecture.md.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SDK_VERSION = "1.9.1"  # the vastai release every hook was checked against (worker/requirements.txt)
SERVER_MODULE = "vastai.serverless.server.lib.server"
BACKEND_MODULE = "vastai.serverless.server.lib.backend"
METRICS_MODULE = "vastai.serverless.server.lib.metrics"
DATA_TYPES_MODULE = "vastai.serverless.server.lib.data_types"
WORKER_MODULE = "vastai.serverless.server.worker"
SEAM_FILE = "worker/control/sdk_seam.py"


class GuardError(Exception):
    """A guard (or a serving part) cannot be installed: an unknown name, or an SDK hook that is gone."""


@dataclass(frozen=True)
class Hook:
    """One SDK point the worker relies on.

    `owner` is "Backend" or "Metrics" (an attribute of the Worker's instance, `attr` may be dotted)
    or a module's dotted name; `use` what the worker does with it (wrap: replaces it with a function
    that calls it; replace: sets its own; call / read / set); `users` the guards and modules that need
    it; `required` False when a missing hook only costs a speed-up or a count (a warning at start).
    """

    key: str
    owner: str
    attr: str
    use: str
    users: tuple[str, ...]
    why: str
    required: bool = True
    checked: str = SDK_VERSION

    @property
    def where(self) -> str:
        return f"{self.owner}.{self.attr}"


HOOKS: tuple[Hook, ...] = (
    # The request path's two chains, bakery's (app/core.py install_parts), given to the SDK's own callers:
    # its handler of a request bound to a session (sessions are the SDK's) and its readiness benchmark.
    *(Hook(key, "Backend", f"_Backend__{key}", "replace", users, f"the SDK's {what}: replaced by bakery's ({ours})")
      for key, users, what, ours in (
          ("check_signature", ("sessions",), "signature check", "policy/signature.py and its layers"),
          ("call_backend", ("benchmark", "sessions"), "engine call", "engine/forward.py and its layers"))),
    Hook("engine_session", "Backend", "session", "set", ("limits", "late_errors"),
         "a functools.cached_property: the limits guard puts its own session (timeouts, keep-alive) in "
         "the instance's __dict__ before the SDK's first use; late_errors probes the engine's health on it"),
    Hook("healthcheck_url", "Backend", "healthcheck_url", "read", ("late_errors",),
         "the engine's health URL (MODEL_HEALTH_ENDPOINT, resolved): probed when a late error line comes"),
    Hook("fetch_pubkey", "Backend", "_fetch_pubkey", "replace", ("pubkey_retry",),
         "the SDK's 5-try key fetch, replaced by one with backoff that does not give up, then re-fetches "
         "the key for the worker's lifetime (key_rotation.py)"),
    Hook("pubkey_fetched", "Backend", "_Backend__pubkey_fetch_complete", "call", ("pubkey_retry",),
         "the event the SDK's readiness waits 60 s on before erroring the worker: set at once"),
    Hook("unsecured", "Backend", "unsecured", "read", ("core",),
         "the SDK's reading of UNSECURED, checked to be the worker's"),
    Hook("metrics", "Backend", "metrics", "read", ("not_ready", "own_url", "pubkey_retry", "outcomes",
                                                   "late_errors", "ready_mark"),
         "the Backend's Metrics (status reports, request outcomes)"),
    Hook("own_url", "Metrics", "url", "read", ("own_url",), "the URL the worker reports: the one it serves"),
    Hook("model_is_loaded", "Metrics", "system_metrics.model_is_loaded", "read",
         ("not_ready", "report_soon", "late_errors", "ready_mark"),
         "set once the benchmark ran: 503 before it, the loaded report right after it, the ready mark"),
    Hook("error_msg", "Metrics", "model_metrics.error_msg", "read", ("late_errors", "ready_mark"),
         "set once the worker is errored (never cleared): an errored worker is not 'loaded'"),
    Hook("model_loaded", "Metrics", "_model_loaded", "wrap", ("pubkey_retry",),
         "marks the model loaded: held back until the public key is there"),
    Hook("send_outcomes", "Metrics", "_Metrics__send_delete_requests_and_reset", "call", ("outcomes",),
         "sends the queued request outcomes (once a second in the SDK): the drain sends the last ones"),
    Hook("send_report", "Metrics", "_Metrics__send_metrics_and_reset", "wrap", ("report_keep", "report_soon"),
         "sends a status report: the loaded one goes at once, not at the SDK's next 10 s tick "
         "(report_soon); what a request adds while it is on its way is kept (report_keep)"),
    Hook("model_metrics", "Metrics", "model_metrics", "read", ("report_keep",),
         "the counters a status report is built from"),
    Hook("model_metrics_reset", "Metrics", "model_metrics.reset", "wrap", ("report_keep",),
         "zeroes the counters after a report went through, wiping what arrived during its POST: "
         "report_keep keeps that part"),
    Hook("update_pending", "Metrics", "update_pending", "set", ("report_soon", "late_errors"),
         "asks the SDK's loop for a report at its next tick (when the immediate one did not go; when an "
         "error line counted)"),
    Hook("backend_errored", "Backend", "backend_errored", "wrap", ("late_errors",),
         "marks the worker errored for good (error_msg), called for each error log line at any time: "
         "after load a line counts only if the engine's health fails too (late_errors)"),
    Hook("last_metric_update", "Metrics", "last_metric_update", "read", ("report_soon",),
         "stamped by a report that went through"),
    Hook("web", SERVER_MODULE, "web", "replace", ("own_url", "sessions", "self_update", "limits", "not_ready",
                                                  "envelope", "http_listener", "outcomes", "drain"),
         "the aiohttp.web the SDK builds its apps with: a shim adds bakery's middlewares, body limit, header "
         "timeout, startup hooks and the second listener's host"),
    Hook("open_file", BACKEND_MODULE, "open_file", "replace", ("log_tail",),
         "anyio's open_file, one thread hand-off per log line: replaced by an in-place read"),
    Hook("auth_data", DATA_TYPES_MODULE, "AuthData", "call", ("sessions", "outcomes", "envelope"),
         "the envelope type the signature check takes"),
    Hook("request_metrics", DATA_TYPES_MODULE, "RequestMetrics", "call", ("outcomes",),
         "a request's record, as the control plane's report counts it (Outcomes.new)"),
    Hook("handler_factory", WORKER_MODULE, "EndpointHandlerFactory", "call", ("own_handler", "outcomes"),
         "the SDK's EndpointHandler of each route (made from bakery's HandlerConfig): bakery's route handler "
         "parses and answers with it; the outcomes guard counts a refused request's workload with it"),
    Hook("request_loggers", METRICS_MODULE, "log", "read", ("core", "forward"),
         "the module logger of the per-request lines (and BACKEND_MODULE's): their debug returns at once",
         required=False),
    Hook("auth_signature", DATA_TYPES_MODULE, "AuthData", "set", ("core",),
         "its from_json_msg computes inspect.signature 7 times per request: given a __signature__ and a "
         "from_json_msg with the same rules that asks for it once",
         required=False),
    Hook("json_data_exception", DATA_TYPES_MODULE, "JsonDataException", "read", ("core", "own_handler"),
         "what AuthData.from_json_msg raises for missing fields (the SDK answers it with a 422)",
         required=False),
    Hook("requests_working", "Metrics", "model_metrics.requests_working", "set", ("queue_wait",),
         "the requests in flight by reqnum (the SDK's request start sets, its end pops): given at start a "
         "dict of the same items that keeps the sum of their workloads", required=False),
    Hook("wait_time", DATA_TYPES_MODULE, "ModelMetrics.wait_time", "set", ("queue_wait",),
         "the queue estimate every request is checked against (max_queue_time), a sum over every request "
         "in flight (O(N^2) per burst): replaced by a property that reads queue_wait's kept sum",
         required=False),
    Hook("handle_request", "Backend", "_Backend__handle_request", "call", ("sessions",),
         "the SDK's handling of a route request bound to a session (sessions are the SDK's): bakery's route "
         "handler (control/own_handler.py) hands it such a request, and serves every other itself"),
    # The control plane's record of a request: Outcomes calls each where the SDK's own handler did.
    *(Hook(f"request_{step}", "Metrics", f"_request_{step}", "call", ("outcomes",), f"a request's outcome: {why}")
      for step, why in (("start", "in flight, its workload pending"), ("success", "served"),
                        ("errored", "the engine call failed: 500"), ("canceled", "the client went away: 499"),
                        ("end", "however it ended"), ("reject", "refused: 401, 429, or a guard's refusal"))),
    # admission.py's points of the aiohttp under the SDK's server (3.14.5, locked with it)
    *(Hook(key, f"aiohttp.{module}", attr, use, ("admission",), why) for key, module, attr, use, why in (
        ("site_factory", "web_runner", "BaseRunner.server", "read",
         "TCPSite.start hands its runner's `server` to loop.create_server as the protocol factory: the "
         "shim gives WORKER_PORT's site a runner (FactoryRunner) whose `server` is admission's factory, "
         "which answers a connection over the cap before aiohttp makes a protocol for it"),
        ("server_connections", "web_server", "Server.connections", "read",
         "the open connections of a listener (until each one's handler ends): the connection cap's count"),
        ("request_read", "web_request", "BaseRequest.read", "replace",
         "a chunked body's read, replaced on the request by one that reserves each chunk against the "
         "byte bound before keeping it (aiohttp's text() and json(), which the SDK calls, read through it)"),
    )),
)
BY_KEY: dict[str, Hook] = {hook.key: hook for hook in HOOKS}
INSTANCE_OWNERS = ("Backend", "Metrics")


def hook(key: str) -> Hook:
    return BY_KEY[key]


def _gone(hook_: Hook, who: str, detail: str = "") -> GuardError:
    return GuardError(f"{who}: the SDK has no {hook_.where} any more{detail} (vastai changed; checked against "
                      f"vastai {hook_.checked}): update the hook {hook_.key!r} in {SEAM_FILE}")


def _lookup(obj: Any, attr: str) -> Any:
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def find(obj: Any, key: str, who: str) -> Any:
    """The hook `key` on `obj` (a Backend or its Metrics), or GuardError naming `who` and the hook."""
    hook_ = BY_KEY[key]
    try:
        return _lookup(obj, hook_.attr)
    except AttributeError:
        raise _gone(hook_, who) from None


def get(obj: Any, key: str) -> Any:
    """The hook's current value on `obj`, unchecked (per request: check it once with find())."""
    return getattr(obj, BY_KEY[key].attr)


def put(obj: Any, key: str, value: Any) -> None:
    """Set the hook on the instance `obj` (its own attribute: the class is not touched; a dotted
    hook is set on the instance its path leads to)."""
    *path, last = BY_KEY[key].attr.split(".")
    for part in path:
        obj = getattr(obj, part)
    setattr(obj, last, value)


def wrap(obj: Any, key: str, who: str, make: Callable[[Any], Any]) -> Any:
    """Replace the hook on `obj` by `make(current)`; returns what it replaced."""
    inner = find(obj, key, who)
    put(obj, key, make(inner))
    return inner




def module_hook(key: str, who: str) -> tuple[Any, Any]:
    """(the SDK module, the hook's value in it), or GuardError naming `who`."""
    hook_ = BY_KEY[key]
    module = sys.modules.get(hook_.owner)
    if module is None:
        raise _gone(hook_, who, " (its module is not loaded)")
    try:
        return module, _lookup(module, hook_.attr)
    except AttributeError:
        raise _gone(hook_, who) from None


def replace_in_module(key: str, who: str, value: Any) -> Any:
    """Set the module hook `key` to `value` (a dotted hook: on the class its path leads to); returns
    what it replaced."""
    module, old = module_hook(key, who)
    put(module, key, value)
    return old




# --------------------------------------------------------------------------- named uses


class Outcomes:
    """The control plane's record of the requests, the one interface bakery's request path reports through:
    a record made (`new`), its outcome (start, success, errored, canceled, end, reject: the SDK's Metrics
    counts them for the status report), the queue estimate a request is checked against, and
    `send_queued()` (the drain sends what is queued before the worker exits). A front process
    has its own with the same methods (app/front_process.py)."""

    def __init__(self, backend: Any, who: str = "outcomes") -> None:
        metrics = find(backend, "metrics", who)
        _, self._made = module_hook("request_metrics", who)
        self.model_metrics = find(metrics, "model_metrics", who)
        self.start, self.success, self.errored, self.canceled, self.end, self.reject = (
            find(metrics, key, who) for key in OUTCOME_KEYS)
        self.send_queued = find(metrics, "send_outcomes", who)  # async: the queued outcomes sent now
        self._system = metrics.system_metrics

    def new(self, request_idx: Any, reqnum: Any, workload: float, entered: float | None = None) -> Any:
        """A request's record, as the SDK's handler makes it when the request comes in."""
        return self._made(request_idx=request_idx, reqnum=reqnum, workload=workload, status="Created",
                          entered_queue_at=time.time() if entered is None else entered)

    def wait_time(self) -> float:
        """The queue estimate (control/queue_wait.py keeps it)."""
        return float(self.model_metrics.wait_time)

    def loaded(self) -> bool:
        """Whether the readiness benchmark ran (the SDK's loaded mark)."""
        return bool(self._system.model_is_loaded)


OUTCOME_KEYS = ("request_start", "request_success", "request_errored", "request_canceled", "request_end",
                "request_reject")


def require_session_property(backend: Any, who: str) -> None:
    """GuardError unless the Backend's `session` is still a cached_property (set_engine_session needs it)."""
    if not isinstance(type(backend).__dict__.get("session"), functools.cached_property):
        raise GuardError(f"{who}: the SDK's Backend.session is no longer a cached_property (vastai changed; "
                         f"checked against vastai {SDK_VERSION}): update the hook 'engine_session' in {SEAM_FILE}")


def backend_logger() -> logging.Logger:
    """The logger of the SDK's per-request lines in its backend module (hook "request_loggers"), or
    one of the same name's kind when the SDK changed (its lines are then always printed)."""
    logger = getattr(sys.modules.get(BACKEND_MODULE), BY_KEY["request_loggers"].attr, None)
    return logger if isinstance(logger, logging.Logger) else logging.getLogger(BACKEND_MODULE)


def engine_session(backend: Any) -> Any:
    """The Backend's engine session (the limits guard's, once the server started)."""
    return backend.session


def has_engine_session(backend: Any) -> bool:
    return "session" in backend.__dict__


def set_engine_session(backend: Any, session: Any) -> None:
    """Make `session` the one the Backend's cached_property returns (before the SDK's first use)."""
    backend.__dict__["session"] = session


def real_web(who: str) -> Any:
    """aiohttp.web as the SDK's server module holds it (under the shim, if one is installed)."""
    module = sys.modules.get(SERVER_MODULE)
    web = getattr(module, "web", None)
    if web is None:
        raise GuardError(f"{who}: the SDK module {SERVER_MODULE} (or its `web`) is gone (vastai changed; checked "
                         f"against vastai {SDK_VERSION}): update the hook 'web' in {SEAM_FILE}")
    return web._real if isinstance(web, WebShim) else web


class WebShim:
    """Stands for aiohttp.web in the SDK's server module: the same names, except that Application,
    AppRunner and TCPSite also get what `parts` holds (the guards' Context: middlewares with their
    ranks, app and runner arguments, startup hooks, a listener's host by port, the runner a site
    listens through, the listen backlog)."""

    def __init__(self, real: Any, parts: Any):
        self._real = real
        self._parts = parts

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def Application(self, *args: Any, **kwargs: Any) -> Any:
        parts = self._parts
        kwargs.update(parts.app_kwargs)
        own = [mw for _, mw in sorted(parts.middlewares, key=lambda item: item[0])]
        kwargs["middlewares"] = [*own, *kwargs.get("middlewares", ())]
        app = self._real.Application(*args, **kwargs)
        for startup in parts.on_startup:
            app.on_startup.append(startup)
        return app

    def AppRunner(self, app: Any, **kwargs: Any) -> Any:
        return self._real.AppRunner(app, **{**self._parts.runner_kwargs, **kwargs})

    def TCPSite(self, runner: Any, *args: Any, **kwargs: Any) -> Any:
        host = self._parts.site_hosts.get(kwargs.get("port"))  # type: ignore[arg-type]
        if host is not None:
            kwargs["host"] = host
        for wrap in getattr(self._parts, "site_runners", ()):  # admission's connection cap
            runner = wrap(runner, kwargs.get("port"))
        backlog = getattr(self._parts, "listen_backlog", 0)
        if backlog and kwargs.get("port") != getattr(self._parts, "http_port", None):
            kwargs.setdefault("backlog", backlog)
        return self._real.TCPSite(runner, *args, **kwargs)


def replace_request_read(request: Any, read: Callable[[], Any]) -> None:
    """Make `read` the request's read() (hook "request_read"): every reader of its body calls it."""
    setattr(request, BY_KEY["request_read"].attr.split(".")[-1], read)


class FactoryRunner:
    """Stands for an aiohttp AppRunner when a site is made on it (hook "site_factory"): the same
    runner, except that its `server`, the protocol factory the site listens with, is
    `factory(server)`. Everything else (the site's registration with its runner) is the runner's."""

    def __init__(self, real: Any, factory: Callable[[Any], Any]) -> None:
        self._real = real
        self._factory = factory
        self._made: tuple[Any, Any] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    @property
    def server(self) -> Any:
        server = self._real.server
        if server is None:
            return None
        if self._made is None or self._made[0] is not server:
            self._made = (server, self._factory(server))
        return self._made[1]


def install_web(real: Any, parts: Any) -> None:
    """Make the SDK's server module build its apps through a WebShim over `real` with `parts`."""
    replace_in_module("web", "install", WebShim(real, parts))


# --------------------------------------------------------------------------- checking at start


def missing(worker: Any, required_only: bool = True) -> list[Hook]:
    """The hooks of HOOKS that `worker` (a real SDK Worker, not yet run) and the loaded SDK modules lack."""
    backend = getattr(worker, "backend", None)
    owners = {"Backend": backend, "Metrics": getattr(backend, "metrics", None)}
    gone = []
    for hook_ in HOOKS:
        if required_only and not hook_.required:
            continue
        if hook_.key == "engine_session":  # looked up on the class: reading it would open a session
            if not isinstance(type(backend).__dict__.get("session"), functools.cached_property):
                gone.append(hook_)
            continue
        obj = owners[hook_.owner] if hook_.owner in INSTANCE_OWNERS else sys.modules.get(hook_.owner)
        try:
            _lookup(obj, hook_.attr)
        except AttributeError:
            gone.append(hook_)
    return gone


def describe_missing(gone: list[Hook]) -> str:
    """One line naming each missing hook and who needs it."""
    items = "; ".join(f"{h.where} (hook {h.key!r}, used by {', '.join(h.users)})" for h in gone)
    return (f"the SDK lacks what the worker hooks into: {items} (vastai changed; checked against vastai "
            f"{SDK_VERSION}): update {SEAM_FILE}")
