"""The vastai SDK behind one adapter: the table of every SDK point the worker uses (HOOKS), and the named
interface the other modules use instead (ControlPlane, Outcomes, the web shim, the log tail's open_file).

The only worker module that names a private SDK attribute or reaches a hook by its key (tests/worker/
test_sdk_seam.py checks the others' source). `missing(worker)` checks every row at start: core.run() exits 4
rather than run unguarded. See docs/architecture.md.
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
    Hook("request_metrics", DATA_TYPES_MODULE, "RequestMetrics", "call", ("outcomes",),
         "a request's record, as the control plane's report counts it (Outcomes.new)"),
    Hook("handler_factory", WORKER_MODULE, "EndpointHandlerFactory", "call", ("own_handler", "outcomes"),
         "the SDK's EndpointHandler of each route (made from bakery's HandlerConfig): bakery's route handler "
         "parses and answers with it; the outcomes guard counts a refused request's workload with it"),
    Hook("request_loggers", METRICS_MODULE, "log", "read", ("core", "forward", "outcomes"),
         "the module logger of the per-request lines (and BACKEND_MODULE's): their debug returns at once",
         required=False),
    Hook("json_data_exception", DATA_TYPES_MODULE, "JsonDataException", "read", ("own_handler", "uploads"),
         "the refusal a route's parser raises (a 422 naming each bad part): the SDK's parse of a session's "
         "request and bakery's route handler answer it alike"),
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
    # The control plane's record of a request: Outcomes moves these public counters as the SDK's Metrics does.
    *(Hook(f"outcome_{name}", "Metrics", attr, "set", ("outcomes",), why) for name, attr, why in (
        ("counts", "model_metrics.workload_pending", "the workload counters a status report is built from "
                                                     "(pending, received, served, errored, cancelled, rejected)"),
        ("received", "model_metrics.requests_recieved", "the request numbers received (the SDK's spelling)"),
        ("deleting", "model_metrics.requests_deleting", "the ended requests the SDK sends the platform"),
        ("last_served", "last_request_served", "when a request last ended"))),
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


def _find(obj: Any, key: str, who: str) -> Any:
    """The hook `key` on `obj` (a Backend or its Metrics), or GuardError naming `who` and the hook."""
    hook_ = BY_KEY[key]
    try:
        return _lookup(obj, hook_.attr)
    except AttributeError:
        raise _gone(hook_, who) from None


def _get(obj: Any, key: str) -> Any:
    """The hook's current value on `obj`, unchecked (missing() checked every hook at start)."""
    return _lookup(obj, BY_KEY[key].attr)


def _put(obj: Any, key: str, value: Any) -> None:
    """Set the hook on the instance `obj` (its own attribute: the class is not touched; a dotted
    hook is set on the instance its path leads to)."""
    *path, last = BY_KEY[key].attr.split(".")
    for part in path:
        obj = getattr(obj, part)
    setattr(obj, last, value)


def _module_hook(key: str, who: str) -> tuple[Any, Any]:
    """(the SDK module, the hook's value in it), or GuardError naming `who`."""
    hook_ = BY_KEY[key]
    module = sys.modules.get(hook_.owner)
    if module is None:
        raise _gone(hook_, who, " (its module is not loaded)")
    try:
        return module, _lookup(module, hook_.attr)
    except AttributeError:
        raise _gone(hook_, who) from None


def _replace_in_module(key: str, who: str, value: Any) -> Any:
    """Set the module hook `key` to `value` (a dotted hook: on the class its path leads to); returns
    what it replaced."""
    module, old = _module_hook(key, who)
    _put(module, key, value)
    return old


# --------------------------------------------------------------------------- named uses


class Outcomes:
    """The control plane's record of the requests, the one interface bakery's request path reports through:
    a record made (`new`), its outcome (start, success, errored, canceled, end, reject), the queue estimate a
    request is checked against, and `send_queued()` (the drain sends what is queued before the worker
    exits). Each outcome moves the Metrics' public counters exactly as vastai 1.9.1's `Metrics._request_*`
    does, with the same log lines (tests/worker/test_outcomes.py holds the two to the same state), so no
    private SDK point is on a request's path. A front process has its own (app/front_process.py)."""

    def __init__(self, backend: Any, who: str = "outcomes") -> None:
        self._metrics = metrics = _find(backend, "metrics", who)
        _, self._made = _module_hook("request_metrics", who)
        self.model_metrics = metrics.model_metrics
        self.send_queued = _find(metrics, "send_outcomes", who)  # async: the queued outcomes sent now
        self._system = metrics.system_metrics
        self._log = metrics_logger()

    def new(self, request_idx: Any, reqnum: Any, workload: float, entered: float | None = None) -> Any:
        """A request's record, as the SDK's handler makes it when the request comes in."""
        return self._made(request_idx=request_idx, reqnum=reqnum, workload=workload, status="Created",
                          entered_queue_at=time.time() if entered is None else entered)

    @staticmethod
    def _id(request: Any) -> str:
        if request.is_session:
            return f"Session {request.request_idx}"
        if request.session:
            return f"Request {request.session_reqnum} in Session {request.session.request_idx}"
        return f"Request {request.request_idx}"

    def start(self, request: Any) -> None:
        """Forwarded to the engine: in flight, its workload pending and received."""
        self._log.debug(f"Starting {self._id(request)}")
        request.status = "Started"
        counts = self.model_metrics
        counts.workload_pending += request.workload
        counts.workload_received += request.workload
        if not request.session:
            counts.requests_recieved.add(request.reqnum)
            counts.requests_working[request.reqnum] = request
        self._metrics.update_pending = True

    def end(self, request: Any) -> None:
        """Its handling ended, however it ended."""
        self._log.debug(f"Ending {self._id(request)}")
        counts = self.model_metrics
        counts.workload_pending -= request.workload
        if not request.session:
            counts.requests_working.pop(request.reqnum, None)
            counts.requests_deleting.append(request)
        self._metrics.last_request_served = time.time()

    def success(self, request: Any) -> None:
        """Answered."""
        self._log.debug(f"{self._id(request)} succeeded")
        request.work_completed_at = time.time()
        self.model_metrics.workload_served += request.workload
        request.status, request.success = "Success", True
        self._metrics.update_pending = True

    def errored(self, request: Any, message: str) -> None:
        """The engine call or the answer failed: a 500."""
        self._log.error(f"{self._id(request)} errored: {message}")
        request.work_completed_at = time.time()
        self.model_metrics.workload_errored += request.workload
        request.status, request.success = "Error", False
        self._metrics.update_pending = True

    def canceled(self, request: Any) -> None:
        """The client went away: a 499."""
        self._log.debug(f"Canceling {self._id(request)}")
        self.model_metrics.workload_cancelled += request.workload
        request.success, request.status = True, "Cancelled"

    def reject(self, request: Any) -> None:
        """Refused: 401, 429, or a guard's refusal."""
        self._log.debug(f"Rejecting {self._id(request)}")
        counts = self.model_metrics
        counts.workload_rejected += request.workload
        if not request.session:
            counts.requests_recieved.add(request.reqnum)
            counts.requests_deleting.append(request)
        request.success, request.status = False, "Rejected"
        self._metrics.update_pending = True

    def wait_time(self) -> float:
        """The queue estimate (control/queue_wait.py keeps it)."""
        return float(self.model_metrics.wait_time)

    def loaded(self) -> bool:
        """Whether the readiness benchmark ran (the SDK's loaded mark)."""
        return bool(self._system.model_is_loaded)


class ControlPlane:
    """The SDK's control plane, by name: the one way bakery's modules reach the SDK's Backend and Metrics
    (the worker's readiness and errors, status reports, the public key's fetch, the engine session and
    health URL, the queue estimate, the log tail, sessions). Every hook here was checked at start
    (`missing`); a method that replaces an SDK point returns what it replaced."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self._metrics = backend.metrics

    # readiness and errors
    def loaded(self) -> bool:
        """Whether the readiness benchmark ran (the SDK also marks an errored worker loaded)."""
        return bool(self._metrics.system_metrics.model_is_loaded)

    def error(self) -> str | None:
        """Why the worker is errored for good, or None."""
        return self._metrics.model_metrics.error_msg

    def ready(self) -> bool:
        """Loaded and not errored."""
        return self.loaded() and not self.error()

    def own_url(self) -> str:
        """The URL the worker reports to the autoscaler: requests must be signed for it."""
        return str(self._metrics.url)

    def replace_errored(self, errored: Callable[[str], None]) -> Callable[[str], None]:
        """Make `errored(msg)` what the SDK calls on each error line (its own marks the worker errored)."""
        return _swap(self._backend, "backend_errored", errored)

    # status reports
    async def send_report(self) -> None:
        """Send a status report now, through whatever wraps the SDK's send."""
        await _get(self._metrics, "send_report")()

    def last_report(self) -> float:
        """When a status report last went through."""
        return float(self._metrics.last_metric_update)

    def ask_report(self) -> None:
        """Ask the SDK's loop for a status report at its next tick."""
        self._metrics.update_pending = True

    def counters(self) -> Any:
        """The counters a status report is built from (the SDK's ModelMetrics)."""
        return self._metrics.model_metrics

    def wrap_report(self, make: Callable[[Any], Any]) -> None:
        """Make `make(the current send)` the SDK's status-report send."""
        _put(self._metrics, "send_report", make(_get(self._metrics, "send_report")))

    def replace_counters_reset(self, reset: Callable[[], None]) -> Callable[[], None]:
        """Make `reset` what zeroes the counters after a report went through."""
        return _swap(self._metrics, "model_metrics_reset", reset)

    # the platform's public key (bakery keeps the key; the SDK's readiness waits on its fetch)
    def replace_key_fetch(self, fetch: Callable[[], Any]) -> None:
        """Make `fetch` the SDK's key fetch (its task runs it once, at start)."""
        _swap(self._backend, "fetch_pubkey", fetch)

    def key_fetch_done(self) -> None:
        """Set the event the SDK's readiness waits 60 s on before erroring the worker."""
        _get(self._backend, "pubkey_fetched").set()

    def replace_loaded_mark(self, mark: Callable[..., None]) -> Callable[..., None]:
        """Make `mark(max_throughput=...)` what the readiness benchmark calls when it is done."""
        return _swap(self._metrics, "model_loaded", mark)

    # the engine
    def engine_url(self) -> str:
        """The engine's base URL (MODEL_SERVER_URL, resolved)."""
        return str(self._backend.model_server_url)

    def health_url(self) -> str:
        """The engine's health URL (MODEL_HEALTH_ENDPOINT, resolved; empty: none)."""
        return str(self._backend.healthcheck_url or "")

    def engine_session(self) -> Any:
        """The engine session (the limits guard's, once the server started)."""
        return self._backend.session

    def has_engine_session(self) -> bool:
        return "session" in self._backend.__dict__

    def set_engine_session(self, session: Any) -> None:
        """Make `session` the one the SDK's cached_property returns (before the SDK's first use)."""
        self._backend.__dict__["session"] = session

    # the SDK's own callers of the request path, and sessions
    def give_chains(self, check_signature: Callable[[Any], bool], call_engine: Callable[..., Any]) -> None:
        """Make bakery's two chains what the SDK's readiness benchmark and session handler call."""
        _put(self._backend, "check_signature", check_signature)
        _put(self._backend, "call_backend", call_engine)

    def session_handler(self) -> Callable[..., Any]:
        """The SDK's handling of a route request bound to a session (sessions are the SDK's)."""
        return _get(self._backend, "handle_request")

    def keep_queue_estimate(self, working: Callable[[Any], Any], estimate: Callable[[Any], Any]) -> bool:
        """Give the Metrics `working(its in-flight dict)` in its place and ModelMetrics a `wait_time` property
        with the getter `estimate(the SDK's getter)` (control/queue_wait.py). False, touching nothing, when
        either point is not as it was (a changed SDK: its own sum is used)."""
        try:
            prop = _module_hook("wait_time", "queue_wait")[1]
            current = _find(self._metrics, "requests_working", "queue_wait")
        except GuardError:
            return False
        if not isinstance(prop, property) or prop.fget is None or not isinstance(current, dict):
            return False
        if not getattr(prop.fget, "bakery_kept", False):
            _replace_in_module("wait_time", "queue_wait", property(estimate(prop.fget)))
        made = working(current)
        if made is not current:
            _put(self._metrics, "requests_working", made)
        return True

    def outcomes(self) -> Outcomes:
        """The control plane's record of requests (the SDK's Metrics)."""
        return Outcomes(self._backend)


def _swap(obj: Any, key: str, value: Any) -> Any:
    old = _get(obj, key)
    _put(obj, key, value)
    return old


def replace_open_file(open_file: Callable[..., Any]) -> None:
    """Make `open_file` what the SDK's log tail opens MODEL_LOG with (anyio's open_file's signature)."""
    _, current = _module_hook("open_file", "log_tail.py")
    if not callable(current):
        raise GuardError(f"log_tail.py: the SDK module {BACKEND_MODULE}'s open_file is not callable "
                         f"(vastai changed): update the hook 'open_file' in {SEAM_FILE}")
    _replace_in_module("open_file", "log_tail.py", open_file)


def json_data_exception() -> type:
    """What the SDK's envelope parse raises for missing fields (answered 422)."""
    return _module_hook("json_data_exception", "own_handler.py")[1]






def metrics_logger() -> logging.Logger:
    """The logger of the SDK's outcome lines in its metrics module (hook "request_loggers"), or one of the
    same name's kind when the SDK changed."""
    logger = getattr(sys.modules.get(METRICS_MODULE), BY_KEY["request_loggers"].attr, None)
    return logger if isinstance(logger, logging.Logger) else logging.getLogger(METRICS_MODULE)


def backend_logger() -> logging.Logger:
    """The logger of the SDK's per-request lines in its backend module (hook "request_loggers"), or
    one of the same name's kind when the SDK changed (its lines are then always printed)."""
    logger = getattr(sys.modules.get(BACKEND_MODULE), BY_KEY["request_loggers"].attr, None)
    return logger if isinstance(logger, logging.Logger) else logging.getLogger(BACKEND_MODULE)








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
    _replace_in_module("web", "install", WebShim(real, parts))


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
