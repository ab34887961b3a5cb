"""A route request's handling in its own task: vastai 1.9.1's Backend.__handle_request, step for step.

The same steps, order, Metrics outcome calls and answers as the SDK's handler, without the task, Event,
closures and queue-lock round it adds per request (each one more loop turn in a burst). Routes served one at a
time, remote dispatch and sessions stay with the SDK's handler. Stdlib only at import time; docs/serving.md.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from control import sdk_seam

WHO = "own_handler.py"
# The hooks this module needs, all optional: with one gone, every request keeps the SDK's handler.
HOOK_KEYS = ("handle_request", "metrics", "model_metrics", "request_start", "request_success",
             "request_errored", "request_canceled", "request_end", "request_reject")


def install(backend: Any) -> Any:
    """Serve the backend's route requests with `handle_request` below; returns its `serve` (the steps
    after the parse, for the wire front), or None (nothing changed) when a hook it needs is gone."""
    try:
        original = sdk_seam.find(backend, "handle_request", WHO)
        metrics = sdk_seam.find(backend, "metrics", WHO)
        for key in HOOK_KEYS[2:]:
            sdk_seam.find(metrics, key, WHO)
        _, refusal = sdk_seam.module_hook("json_data_exception", WHO)
        _, request_metrics = sdk_seam.module_hook("request_metrics", WHO)
    except sdk_seam.GuardError:
        return None
    from aiohttp import web

    log = sdk_seam.backend_logger()
    model_metrics = sdk_seam.get(metrics, "model_metrics")
    start = sdk_seam.get(metrics, "request_start")
    success = sdk_seam.get(metrics, "request_success")
    errored = sdk_seam.get(metrics, "request_errored")
    canceled = sdk_seam.get(metrics, "request_canceled")
    end = sdk_seam.get(metrics, "request_end")

    async def serve(handler: Any, auth_data: Any, payload: Any, respond: Callable[[Any], Awaitable[Any]],
                    bare: Callable[[int], Any]) -> Any:
        """The steps after the parse: outcome, signature, queue check, engine call, answer."""
        metrics_of = request_metrics(request_idx=auth_data.request_idx, reqnum=auth_data.reqnum,
                                     workload=payload.count_workload(), status="Created",
                                     entered_queue_at=time.time())
        # Looked up per request: the guards' layers of both are installed after this module.
        if sdk_seam.check_signature(backend, auth_data) is False:
            sdk_seam.get(metrics, "request_reject")(metrics_of)
            return bare(401)
        if handler.max_queue_time is not None and model_metrics.wait_time > handler.max_queue_time:
            sdk_seam.get(metrics, "request_reject")(metrics_of)
            return bare(429)
        start(metrics_of)
        try:
            metrics_of.work_started_at = time.time()
            try:
                answer = await sdk_seam.get(backend, "call_backend")(handler=handler, payload=payload)
                response = await respond(answer)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 (the SDK's make_request: any failure is a 500)
                errored(metrics_of, str(exc))
                return bare(500)
            success(metrics_of)
            return response
        except asyncio.CancelledError:  # the client went away (aiohttp's handler cancellation)
            log.debug(f"Request {metrics_of.reqnum} cancelled (client disconnect)")
            canceled(metrics_of)
            return bare(499)
        finally:
            end(metrics_of)

    def bare(status: int) -> Any:
        return web.Response(status=status)

    async def handle_request(handler: Any, request: Any) -> Any:
        if not handler.allow_parallel_requests or handler.remote_function:
            return await original(handler=handler, request=request)
        try:
            data = await request.json()
            auth_data, payload, session_id = handler.get_data_from_request(data)
        except refusal as exc:
            return web.json_response(data=exc.message, status=422)
        except json.JSONDecodeError:
            return web.json_response({"error": "invalid JSON"}, status=422)
        if session_id is not None:
            return await original(handler=handler, request=request)
        return await serve(handler, auth_data, payload,
                           lambda answer: handler.generate_client_response(request, answer), bare)

    sdk_seam.put(backend, "handle_request", handle_request)
    return serve
