"""bakery's route handler: every route request at :3000 is handled here, none by the SDK's handler.

The steps, their order, the outcome reports and the answers are those of vastai 1.9.1's handler, in the
request's own task: parse, signature, queue check, engine call, answer. The signature check and the engine call
are bakery's chains (policy/guards.py Context); a request bound to a session goes to the SDK, whose sessions are.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from control import sdk_seam

WHO = "own_handler.py"
Serve = Callable[..., Awaitable[Any]]


def install(ctx: Any, backend: Any) -> tuple[Serve, Callable[[Any], Any]]:
    """(serve, handle): `serve` runs the steps after the parse (the wire front calls it too); `handle(handler)`
    is the aiohttp handler of a route whose SDK EndpointHandler is `handler`. Call after install_parts:
    the chains of `ctx` are final. Raises GuardError when an SDK point it needs is gone."""
    from aiohttp import web

    session_request = sdk_seam.find(backend, "handle_request", WHO)
    _, refusal = sdk_seam.module_hook("json_data_exception", WHO)
    log = sdk_seam.backend_logger()
    outcomes, check_signature, call_engine = ctx.outcomes, ctx.check_signature, ctx.call_engine
    reject, start, success, errored, canceled, end = (outcomes.reject, outcomes.start, outcomes.success,
                                                       outcomes.errored, outcomes.canceled, outcomes.end)

    async def serve(handler: Any, auth_data: Any, payload: Any, respond: Callable[[Any], Awaitable[Any]],
                    bare: Callable[[int], Any]) -> Any:
        """The steps after the parse: record, signature, queue check, engine call, answer, outcome."""
        record = outcomes.new(auth_data.request_idx, auth_data.reqnum, payload.count_workload())
        if check_signature(auth_data) is False:
            reject(record)
            return bare(401)
        if handler.max_queue_time is not None and outcomes.wait_time() > handler.max_queue_time:
            reject(record)
            return bare(429)
        start(record)
        try:
            record.work_started_at = time.time()
            try:
                answer = await call_engine(handler=handler, payload=payload)
                response = await respond(answer)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 (as the SDK's handler: any failure is a 500)
                errored(record, str(exc))
                return bare(500)
            success(record)
            return response
        except asyncio.CancelledError:  # the client went away (aiohttp's handler cancellation)
            log.debug(f"Request {record.reqnum} cancelled (client disconnect)")
            canceled(record)
            return bare(499)
        finally:
            end(record)

    def bare(status: int) -> Any:
        return web.Response(status=status)

    def handle(handler: Any) -> Callable[[Any], Awaitable[Any]]:
        async def handle_request(request: Any) -> Any:
            try:
                data = await request.json()
                auth_data, payload, session_id = handler.get_data_from_request(data)
            except refusal as exc:
                return web.json_response(data=exc.message, status=422)
            except json.JSONDecodeError:
                return web.json_response({"error": "invalid JSON"}, status=422)
            if session_id is not None:  # sessions are the SDK's
                return await session_request(handler=handler, request=request)
            return await serve(handler, auth_data, payload,
                               lambda answer: handler.generate_client_response(request, answer), bare)

        return handle_request

    return serve, handle


def routes(handlers: dict[str, Any], handle: Callable[[Any], Any]) -> list[Any]:
    """aiohttp route definitions: each route's request to bakery's handler (the SDK Worker's `routes`)."""
    from aiohttp import web

    return [web.post(route, handle(handler)) for route, handler in handlers.items()]
