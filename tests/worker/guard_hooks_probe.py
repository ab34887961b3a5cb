"""Run inside the worker venv (PYTHONPATH=worker/): report what the guards hook into in the real SDK.

    <venv>/bin/python guard_hooks_probe.py

Prints one JSON object of facts about vastai's serverless server (and aiohttp) that
policy/guards.py relies on, and what each guard changes when installed alone on a real
Worker. tests/worker/test_guard_hooks.py asserts them, so an SDK upgrade that moves a hook (and
would leave a guard dead or broken) fails there, with the fact that changed named.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import functools
import inspect
import json
import logging
import os
import sys
from typing import Any

ENV = {"CONTAINER_ID": "5", "REPORT_ADDR": "http://127.0.0.1:9", "PUBLIC_IPADDR": "203.0.113.7",
       "WORKER_PORT": "3000", "VAST_TCP_PORT_3000": "41234", "USE_SSL": "false", "UNSECURED": "false"}


def code_names(func: Any) -> set[str]:
    """Every name a function's code (and the code nested in it) refers to."""
    names: set[str] = set()
    stack = [func.__code__]
    while stack:
        code = stack.pop()
        names.update(code.co_names)
        stack.extend(c for c in code.co_consts if inspect.iscode(c))
    return names


def make_worker() -> Any:
    """A real Worker for the llama engine, as core.run() builds it."""
    import vastai

    from app import core, worker_config
    from workers.llama.worker import DEFAULTS

    settings = worker_config.load_settings(DEFAULTS, os.environ)
    config, _ = core.build_worker_config(settings, vastai, ["word"])
    return vastai.Worker(config)


def install(worker: Any, limits: Any, active: tuple[str, ...]) -> Any:
    """guards.install on `worker` as core.install_parts calls it, with the bare chains below the guards:
    bakery's verification, and an engine call through the engine session (the limits guard's once its
    startup hook ran)."""
    from control import sdk_seam
    from policy import guards, signature

    backend = worker.backend
    platform = signature.Trust(bool(backend.unsecured))

    plane = sdk_seam.ControlPlane(backend)

    async def call_engine(handler: Any, payload: Any) -> Any:
        return await plane.engine_session().post(url=handler.endpoint, json=payload.generate_payload_json())

    return guards.install(worker, limits, routes=("/v1/completions",), http_port=3001,
                          report_addr=os.environ["REPORT_ADDR"], platform=platform,
                          check_signature=signature.verify(platform), call_engine=call_engine, active=active)


def fingerprint(name: str) -> dict[str, Any]:
    """What installing guard `name` alone changes on a fresh Worker (and the shared state)."""
    from policy import guards

    worker = make_worker()
    backend = worker.backend
    before_backend = set(backend.__dict__)
    before_metrics = set(backend.metrics.__dict__)
    root_filters = {id(f) for h in logging.getLogger().handlers for f in h.filters}
    ctx = install(worker, guards.Limits(), (name,))
    bare = install(make_worker(), guards.Limits(), ())
    changed = sorted(f"backend.{k}" for k in set(backend.__dict__) - before_backend)
    changed += [f"chain.{chain}" for chain in ("check_signature", "call_engine")
                if getattr(ctx, chain).__code__ is not getattr(bare, chain).__code__]
    if not inspect.ismethod(ctx.outcomes.reject):  # a guard's own function in place of the SDK Metrics' method
        changed.append("outcomes.reject")
    changed += sorted(f"metrics.{k}" for k in set(backend.metrics.__dict__) - before_metrics)
    changed += [f"middleware.{mw.__name__}" for _, mw in ctx.middlewares]
    changed += [f"app.{k}" for k in ctx.app_kwargs] + [f"runner.{k}" for k in ctx.runner_kwargs]
    changed += [f"site.{port}={host}" for port, host in ctx.site_hosts.items()]
    changed += [f"startup.{hook.__name__}" for hook in ctx.on_startup]
    if {id(f) for h in logging.getLogger().handlers for f in h.filters} != root_filters:
        changed.append("logging.root_handler_filter")
    return {"changed": changed, "ctx": ctx, "worker": worker}


async def engine_session_timeout() -> dict[str, Any]:
    """The engine session the limits guard gives the SDK: its timeouts, and that the SDK uses it."""
    from policy import guards

    worker = make_worker()
    limits = guards.Limits(engine_connect_timeout=3.5, engine_idle_timeout=7.5)
    ctx = install(worker, limits, ("limits",))
    for hook in ctx.on_startup:
        await hook(None)
    session = worker.backend.session  # the SDK's cached_property: ours, if the hook holds
    timeout = session.timeout
    out = {"sock_connect": timeout.sock_connect, "sock_read": timeout.sock_read, "total": timeout.total,
           "base_url": str(session._base_url)}
    await session.close()
    return out


async def engine_connect_timeout() -> dict[str, Any]:
    """An engine that never accepts (a full listen backlog): the guarded engine call gives up after
    the connect timeout and records it for the 504 (what the SDK alone would wait on for ever)."""
    import socket
    import time

    from policy import guards

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    for _ in range(3):  # fill the accept queue: further connects get no answer at all
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    os.environ["MODEL_SERVER_URL"] = f"http://127.0.0.1:{port}"
    try:
        worker = make_worker()
    finally:
        del os.environ["MODEL_SERVER_URL"]
    backend = worker.backend
    ctx = install(worker, guards.Limits(engine_connect_timeout=1.0), ("limits",))
    for hook in ctx.on_startup:
        await hook(None)
    outcome: dict[str, str] = {}
    guards._OUTCOME.set(outcome)
    handler = backend.benchmark_handler
    started = time.monotonic()
    try:
        call = ctx.call_engine(handler=handler, payload=handler.make_benchmark_payload())
        await asyncio.wait_for(call, 20)
        error = "none"
    except asyncio.TimeoutError as exc:
        error = type(exc).__name__
    elapsed = time.monotonic() - started
    await backend.session.close()
    for sock in [*fillers, server]:
        sock.close()
    return {"error": error, "seconds": round(elapsed, 1), "recorded": outcome.get("timeout")}


def layered_signature_check() -> dict[str, Any]:
    """own_url, pubkey_retry and outcomes all wrap the signature check (outcomes outside): installed
    together, a signature for another worker's URL is still refused, and outcomes still sees each verdict."""
    from Crypto.PublicKey import RSA
    from vastai.serverless.server.lib import data_types

    from policy import guards

    worker = make_worker()
    backend = worker.backend
    ctx = install(worker, guards.Limits(), ("own_url", "pubkey_retry", "outcomes"))
    key = RSA.generate(2048)
    ctx.platform.set_pubkey(key)
    own, other = backend.metrics.url, "http://198.51.100.1:1"

    def verdict(url: str) -> dict[str, Any]:
        from Crypto.Hash import SHA256
        from Crypto.Signature import pkcs1_15

        digest = SHA256.new(json.dumps({"url": url}, indent=4, sort_keys=True).encode())
        signature = base64.b64encode(pkcs1_15.new(key).sign(digest)).decode()
        seen: dict[str, bool] = {}
        token = guards._SIGNATURE.set(seen)
        try:
            valid = ctx.check_signature(data_types.AuthData(
                cost="1", endpoint="e", reqnum=1, request_idx=1, signature=signature, url=url))
        finally:
            guards._SIGNATURE.reset(token)
        return {"valid": valid, "forged": seen.get("forged")}

    return {"own": verdict(own), "other": verdict(other), "middlewares": [mw.__name__ for _, mw in ctx.middlewares]}


def main() -> int:
    """Collect the facts and print them as JSON."""
    os.environ.update(ENV)
    import aiohttp.web
    import aiohttp.web_protocol
    from Crypto.Hash import SHA256
    from Crypto.PublicKey import RSA
    from Crypto.Signature import pkcs1_15
    from vastai.serverless.server.lib import backend as backend_mod
    from vastai.serverless.server.lib import data_types, metrics, server

    from policy import guards

    facts: dict[str, Any] = {}
    Backend = backend_mod.Backend
    facts["server_web_is_aiohttp_web"] = server.web is aiohttp.web
    facts["server_uses"] = sorted(code_names(server.start_server_async) & {"web", "Application", "AppRunner",
                                                                             "TCPSite", "add_post"})
    source = inspect.getsource(server.start_server_async)
    facts["sdk_unlimited_body"] = "client_max_size=0" in source
    facts["sdk_http_site_port_kw"] = "port=http_port" in source
    facts["sdk_session_routes"] = sorted({line.split('"')[1] for line in source.splitlines()
                                          if "add_post(\"/" in line})
    facts["backend_methods"] = {name: callable(getattr(Backend, name, None)) for name in (
        "_Backend__check_signature", "_Backend__call_backend", "_fetch_pubkey", "_Backend__handle_request",
        "_start_tracking", "_Backend__run_benchmark", "pyworker_update_handler", "session_create_handler")}
    facts["handle_request_calls"] = sorted(code_names(Backend._Backend__handle_request)
                                           & {"_Backend__check_signature", "_Backend__call_backend"})
    facts["benchmark_calls"] = sorted(code_names(Backend._Backend__run_benchmark)
                                      & {"_Backend__call_backend", "_Backend__handle_request", "post"})
    facts["start_tracking_calls"] = sorted(code_names(Backend._start_tracking) & {"_fetch_pubkey"})
    facts["read_logs_calls"] = sorted(code_names(Backend._Backend__read_logs)
                                      & {"_model_loaded", "_Backend__pubkey_fetch_complete",
                                         "_Backend__pubkey_failed"})
    facts["session_is_cached_property"] = isinstance(Backend.__dict__.get("session"), functools.cached_property)
    facts["sdk_session_total_timeout"] = "ClientTimeout(total=None)" in inspect.getsource(
        Backend.__dict__["session"].func)
    facts["auth_fields"] = [f.name for f in dataclasses.fields(data_types.AuthData)]

    worker = make_worker()
    backend = worker.backend
    facts["pubkey_event"] = type(backend.__dict__.get("_Backend__pubkey_fetch_complete")).__name__
    facts["metrics_url"] = backend.metrics.url
    facts["metrics_get_url"] = metrics.get_url()
    facts["model_is_loaded_at_start"] = backend.metrics.system_metrics.model_is_loaded
    facts["unsecured_from_env"] = backend.unsecured

    # The SDK's own reading of UNSECURED (distutils strtobool), for words the worker refuses.
    readings = {}
    for word in ("on", "t", "", " true"):
        os.environ["UNSECURED"] = word
        try:
            readings[repr(word)] = Backend(model_server_url="x", model_log_file="x", benchmark_handler=None,
                                           log_actions=[]).unsecured
        except ValueError as exc:
            readings[repr(word)] = f"ValueError: {exc}"
    os.environ["UNSECURED"] = "false"
    facts["sdk_unsecured_readings"] = readings

    # The SDK's signature check: what it covers (only url) and that a url check is not among them.
    key = RSA.generate(2048)
    backend._pubkey = key
    url = backend.metrics.url

    def sign(u: str) -> str:
        digest = SHA256.new(json.dumps({"url": u}, indent=4, sort_keys=True).encode())
        return base64.b64encode(pkcs1_15.new(key).sign(digest)).decode()

    def auth(**kw: Any) -> Any:
        fields = {"cost": "1", "endpoint": "e", "reqnum": 1, "request_idx": 1, "signature": sign(url), "url": url}
        return data_types.AuthData(**{**fields, **kw})

    check = backend._Backend__check_signature
    facts["sdk_check"] = {
        "valid": check(auth()),
        "other_cost_reqnum_idx_endpoint": check(auth(cost="999999", reqnum=77, request_idx=5, endpoint="other")),
        "other_url_signed_for_it": check(auth(url="http://198.51.100.1:1", signature=sign("http://198.51.100.1:1"))),
        "flipped": check(auth(signature=sign(url)[:-4] + ("AAAA" if not sign(url).endswith("AAAA") else "BBBB"))),
        "empty": check(auth(signature="")),
        "parameters": list(inspect.signature(check).parameters),
    }

    # aiohttp: a connection's keep-alive timer is armed at connect and closes a handler still waiting
    # for a request (the header timeout rides on it).
    protocol_source = inspect.getsource(aiohttp.web_protocol.RequestHandler.connection_made)
    facts["aiohttp_keepalive_at_connect"] = "self._keepalive_timeout" in protocol_source
    facts["aiohttp_keepalive_closes_waiting"] = "force_close" in inspect.getsource(
        aiohttp.web_protocol.RequestHandler._process_keepalive)

    # outcomes: what a refusal report is made of, and that the SDK's 401 path rejects after the check.
    facts["request_metrics_fields"] = [f.name for f in dataclasses.fields(data_types.RequestMetrics)]
    reject_source = inspect.getsource(metrics.Metrics._request_reject)
    facts["reject_counts_workload_and_queues"] = ("workload_rejected += request.workload" in reject_source
                                                  and "requests_deleting.append(request)" in reject_source)
    handle_source = inspect.getsource(Backend._Backend__handle_request)
    rejects_401 = "self.metrics._request_reject(request_metrics)\n            return web.Response(status=401)"
    facts["sdk_401_rejects_after_check"] = (
        handle_source.index("self.__check_signature(auth_data) is False") < handle_source.index(rejects_401))
    facts["sdk_422_before_check"] = handle_source.index("status=422") < handle_source.index("__check_signature")
    from vastai.serverless.server import worker as worker_mod
    facts["handler_factory"] = callable(getattr(getattr(worker_mod, "EndpointHandlerFactory", None),
                                                "get_all_handlers", None))
    facts["send_outcomes"] = inspect.iscoroutinefunction(
        getattr(metrics.Metrics, "_Metrics__send_delete_requests_and_reset", None))
    facts["layered_signature_check"] = layered_signature_check()

    facts["fingerprints"] = {name: fingerprint(name)["changed"] for name in guards.ACTIVE}
    facts["engine_session"] = asyncio.run(engine_session_timeout())
    facts["engine_connect"] = asyncio.run(engine_connect_timeout())
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    logging.disable(logging.CRITICAL)
    sys.exit(main())
