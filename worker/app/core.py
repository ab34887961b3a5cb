"""The worker's start: resolve the configuration, claim the port, make the SDK's Worker, install
bakery's parts on it in their order (install_parts, install_front, install_fronts), run it."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from app import event_loop, serving
from app.output import (
    EXIT_CONFIG,
    EXIT_PORT_BUSY,
    EXIT_SDK,
    LaunchFailureExit,
    fail,
    line_out,
    quiet_access_log_class,
    quiet_requests,
    say,
    warn,
    watch_log_file,
)
from app.ports import PortBusy, claim_ports
from app.sdk_config import (
    SDK_HANDLER_FACTORY,
    WORDS_FILE,
    build_worker_config,
    endpoint_handlers,
    import_sdk,
    load_words,
)
from app.worker_config import (
    FRONT_VAR,
    LOG_REQUESTS_VAR,
    ConfigError,
    EngineDefaults,
    Settings,
    WorkerConfig,
    banner,
    describe,
    load_config,
)
from config import routes, table
from control import own_handler, queue_wait, sdk_seam
from engine import engine_warm, forward, native_relay
from front import processes
from logs import late_errors, stages
from policy import admission, drain, guards, references, signature, signature_memo


def remembered(platform: signature.Trust, verify: Any) -> Any:
    """The signature check's layer over `verify`: the signature memo (it has `knows(url, signature)`)."""
    return signature_memo.memo(verify, platform.pubkey, platform.unsecured)


def install_parts(worker: Any, cfg: WorkerConfig, handlers: dict[str, Any] | None,
                  signature_layer: Any = remembered, outcomes: Any = None) -> Any:
    """Build the request path's two chains (the signature check, the engine call) and add to the SDK's
    `worker` everything bakery adds, in its order; the guards' Context. Raises guards.GuardError when an
    SDK hook is gone. `signature_layer(platform, verify)` is the layer over the signature's verification
    and has `knows(url, signature)` (a front process's: the primary's pairs); `outcomes` where outcomes
    are reported (default: the SDK's Metrics)."""
    settings, limits = cfg.settings, cfg.limits
    platform = signature.Trust(settings.unsecured)
    plane = sdk_seam.ControlPlane(worker.backend)
    pool, call_engine = forward.install(plane.engine_url(), plane.engine_session,
                                        sdk_seam.backend_logger(), limits.engine_connect_timeout,
                                        limits.engine_idle_timeout, guards.ENGINE_KEEPALIVE, settings.engine_keep_warm)
    check = signature_layer(platform, signature.verify(platform))
    ctx = guards.install(worker, limits, routes=settings.routes.routes, http_port=settings.worker_http_port,
                         report_addr=cfg.report_addr, handlers=handlers, platform=platform, check_signature=check,
                         call_engine=call_engine, outcomes=outcomes, sdk=plane)
    ctx.signature_known = check.knows
    ctx.drain = serving.install(ctx, cfg.drain_seconds, limits.retry_after,  # stream release, prompt report, drain,
                    settings.error_lines, cfg.late_errors, cfg.run_dir,  # late error lines, ready mark
                    stages.Stages(cfg.stage_lines, say))  # the time to ready's stages
    references.install(ctx, cfg.reference_policy)  # last: the outermost wrapper of the engine call
    # The SDK's own callers (its readiness benchmark, its handler of a session's requests) reach bakery's
    # chains; bakery's route handler calls them directly (control/own_handler.py).
    ctx.sdk.give_chains(ctx.check_signature, ctx.call_engine)
    ctx.pool = pool
    if pool is not None:
        share = processes.ready_share(settings.engine_ready_connections, settings.front_processes)
        engine_warm.install(ctx, pool, share)
        if ctx.admission is not None and settings.engine_ready_connections > limits.max_connections:
            # admission raised the open-files limit for one engine connection per admitted request
            warning = admission.raise_fd_limit(limits.max_connections, settings.engine_ready_connections)
            if warning:
                warn(warning)
    return ctx


def serve_routes(worker: Any, ctx: Any, handlers: dict[str, Any]) -> Any:
    """Make bakery's route handler (control/own_handler.py) the handler of every route of the SDK's
    `worker`; returns its `serve` (the steps after the parse, for the wire front). Call after install_parts."""
    serve, handle = own_handler.install(ctx)
    worker.routes = own_handler.routes(handlers, handle)  # Worker.routes: what its server adds to the app
    return serve


def install_front(settings: Settings, ctx: Any, handlers: dict[str, Any] | None,
                  serve: Any, header_timeout: float) -> tuple[str, Any]:
    """Put wire.py's front on WORKER_PORT's connections (BAKERY_FRONT=wire, the default); (the startup
    line saying who reads them, the wire.Front or None). Call after the access logger class is chosen
    (wire logs through it)."""
    if settings.front != "wire":
        return f"bakery-worker: front: aiohttp.web reads every request ({FRONT_VAR}=aiohttp)", None
    from front import wire  # msgspec (signed_first): the worker venv's
    served = {route: handlers[route] for route in settings.routes.routes if handlers and route in handlers}
    made = None
    if served and ctx.signature_known is not None:
        made = wire.install(ctx, served, serve, ctx.signature_known, header_timeout, ctx.outcomes.loaded)
    if made is None:
        return (f"bakery-worker: front: aiohttp.web reads every request (the wire front needs the limits "
                f"guard, the drain and the SDK's route handlers; {FRONT_VAR}=wire asked for it)"), None
    return (f"bakery-worker: front: wire.py serves plain signed requests to {', '.join(served)} below "
            f"aiohttp.web (bodies up to {wire.BODY_MAX} bytes); everything else is aiohttp.web's ({FRONT_VAR})"), made


def install_fronts(defaults: EngineDefaults, settings: Settings, ctx: Any, made: Any) -> str | None:
    """Start BAKERY_FRONT_PROCESSES front processes with the server (processes.py); the startup line, or
    None when there are none."""
    count = settings.front_processes
    if count <= 0:
        return None
    if made is None or ctx.signature_known is None or ctx.admission is None:
        warn(f"{processes.PROCESSES_VAR}={count}: front processes need the wire front ({FRONT_VAR}=wire, "
              "the SDK's route handlers, the limits guard); the worker serves alone")
        return None
    slots = processes.Slots(count + 1)
    ctx.admission[0].share(slots, 0)  # the body budget: every process's bytes
    fleet = processes.Fleet(count, defaults, ctx.platform, ctx.outcomes, ctx.drain, ctx.signature_known,
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
    say(banner(settings))
    for warning in cfg.warnings:
        warn(warning)
    if settings.model_id is None:
        warn(f"no model id ({', '.join(cfg.model_id_vars)} all unset): benchmark requests omit 'model'")
    words = load_words()
    if not words:
        fail(f"the benchmark word list {WORDS_FILE} is empty", EXIT_CONFIG)
    sdk = import_sdk()
    sdk_config, note = build_worker_config(settings, sdk, words, limits.max_sessions)
    say(describe(settings))
    for line in routes.startup_lines(settings.routes):
        say(line)
    say(f"bakery-worker: {note}")
    try:
        lock_fd = claim_ports(settings)
    except PortBusy as exc:
        fail(f"{exc}: stop the other listener or set WORKER_PORT", EXIT_PORT_BUSY)
    # The SDK reads UNSECURED itself (distutils' strtobool: a blank or " true" crashes it, "on" or "t"
    # passes): it gets the worker's strict reading, and is checked to hold it.
    table.export("UNSECURED", "true" if settings.unsecured else "false")
    worker = sdk.Worker(sdk_config)
    if getattr(worker.backend, "unsecured", None) is not settings.unsecured:
        fail(f"the SDK did not take UNSECURED={settings.unsecured} (vastai changed how it reads it)", EXIT_SDK)
    gone = sdk_seam.missing(worker)
    if gone:  # every hook checked before any is used: a changed SDK stops the worker, naming what is gone
        fail(sdk_seam.describe_missing(gone), EXIT_SDK)
    handlers = endpoint_handlers(sdk_config)
    if handlers is None:
        fail(f"{'.'.join(SDK_HANDLER_FACTORY)} not found (vastai changed): bakery's route handler needs each "
             f"route's EndpointHandler: update the hook 'handler_factory' in {sdk_seam.SEAM_FILE}", EXIT_SDK)
    try:
        ctx = install_parts(worker, cfg, handlers)
        serve = serve_routes(worker, ctx, handlers)
    except guards.GuardError as exc:
        fail(str(exc), EXIT_SDK)
    if not queue_wait.install(ctx.sdk):
        warn(f"{sdk_seam.hook('wait_time').where} or {sdk_seam.hook('requests_working').where} not found (a "
              "changed SDK): the queue estimate is summed on every request, as the SDK does")
    say(guards.describe(guards.ACTIVE, limits))
    say(drain.describe(cfg.drain_seconds))
    say(references.describe(cfg.reference_policy))
    say(late_errors.describe(cfg.late_errors))
    for line in cfg.limit_notes:
        say(f"bakery-worker: {line}")
    if settings.unsecured:
        say("bakery-worker: UNSECURED=true: requests are served without a signature (offline use only)")
    watch_log_file(settings.model_log)
    # Added after Worker() so the SDK still installs its own log handler on the root logger.
    logging.getLogger().addHandler(LaunchFailureExit())
    if not settings.log_requests:
        ctx.runner_kwargs["access_log_class"] = quiet_access_log_class()
        missing = quiet_requests()
        if missing:
            warn(f"the SDK's per-request lines cannot be dropped (no logger in {', '.join(missing)}); "
                  f"they are logged as with {LOG_REQUESTS_VAR}=true")
    front_line, made = install_front(settings, ctx, handlers, serve, limits.header_timeout)
    say(front_line)
    fronts_line = install_fronts(defaults, settings, ctx, made)
    if fronts_line:
        say(fronts_line)
    loop_name, loop_warning = event_loop.install(settings.loop_choice)
    if loop_warning:
        warn(loop_warning)
    say(f"bakery-worker: event loop: {loop_name}; {event_loop.tune_collector()}")
    relay_name, relay_warning = native_relay.install(settings.relay, settings.relay_program, limits.send_timeout)
    if relay_warning:
        warn(relay_warning)
    say(f"bakery-worker: streamed bodies after their head: {relay_name}")
    share = processes.ready_share(settings.engine_ready_connections, settings.front_processes)
    say(f"bakery-worker: {engine_warm.describe(settings.engine_keep_warm, settings.engine_ready_connections, share)}")
    if native_relay.ACTIVE is not None and ctx.drain is not None:
        ctx.drain.notes.append(native_relay.ACTIVE.describe)  # said when the drain begins
    try:
        worker.run()
    finally:
        os.close(lock_fd)
