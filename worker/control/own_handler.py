"""bakery's route handler: every route request at :3000 is parsed and handled here, none by the SDK's handler.

The steps, their order, the outcome reports and the answers (422 bodies included) are those of vastai 1.9.1's
handler and envelope parse, in the request's own task: parse, signature, queue check, engine call, answer. The
route's parser, workload and answer are bakery's, called directly (`Route`); the signature check and the engine
call are bakery's chains (policy/guards.py Context). A request bound to a session goes to the SDK, whose
sessions are. tests/worker/test_own_handler.py holds the two handlers to the same answers and reports.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from control import sdk_seam

Serve = Callable[..., Awaitable[Any]]
AUTH_FIELDS = ("cost", "endpoint", "reqnum", "request_idx", "signature", "url")  # the platform's auth object
DEFAULT_WORKLOAD = 100.0  # the SDK's, for a route without a workload or one that failed

log = logging.getLogger("bakery.own_handler")


@dataclass
class AuthData:
    """The platform's auth object of a request: what the signature check and the outcome reports read."""

    cost: Any
    endpoint: Any
    reqnum: Any
    request_idx: Any
    signature: Any
    url: Any


@dataclass
class JsonPayload:
    """A JSON route's payload: the parsed body, and its workload as the autoscaler counts it."""

    input: Any
    workload: Callable[[Any], float] | None
    route: str = ""

    def generate_payload_json(self) -> Any:
        return self.input

    def generate_payload_multipart(self) -> None:
        return None

    def count_workload(self) -> float:
        """The route's workload of the body; DEFAULT_WORKLOAD when there is none, or it raised or was not
        a finite number >= 0 (a bad count never 500s a request nor poisons the autoscaler's sums)."""
        if self.workload is None:
            return DEFAULT_WORKLOAD
        try:
            workload = float(self.workload(self.input))
        except Exception:
            log.warning("the workload of %s raised; counted %g", self.route, DEFAULT_WORKLOAD, exc_info=True)
            return DEFAULT_WORKLOAD
        if not math.isfinite(workload) or workload < 0:
            log.warning("the workload of %s was %r; counted %g", self.route, workload, DEFAULT_WORKLOAD)
            return DEFAULT_WORKLOAD
        return workload


@dataclass(frozen=True)
class Route:
    """A served route as bakery's handler takes it. `sdk` is the SDK's EndpointHandler of the route (its
    session handler takes it); `payload(body)` makes the payload or raises `refusal` (a 422)."""

    path: str
    sdk: Any
    payload: Callable[[Any], Any]
    respond: Callable[[Any, Any], Awaitable[Any]]
    refusal: type
    max_queue_time: float | None

    @property
    def endpoint(self) -> str:
        """The engine's path the request is posted to (the route's own)."""
        return self.path

    def parse(self, data: Any) -> tuple[AuthData, Any, Any]:
        """(auth, payload, session id) of an envelope; `refusal` naming each bad part (its 422 body)."""
        errors: dict[str, Any] = {}
        auth = payload = None
        if "auth_data" in data:
            try:
                auth = auth_data(data["auth_data"], self.refusal)
            except self.refusal as exc:
                errors["auth_data"] = exc.message  # type: ignore[attr-defined]
        else:
            errors["auth_data"] = "field missing"
        if "payload" in data:
            try:
                payload = self.payload(data["payload"])
            except self.refusal as exc:
                errors["payload"] = exc.message  # type: ignore[attr-defined]
        else:
            errors["payload"] = "field missing"
        if errors:
            raise self.refusal(errors)
        return auth, payload, data.get("session_id")  # type: ignore[return-value]


def auth_data(msg: Any, refusal: type) -> AuthData:
    """The auth object: every field present (else `refusal` naming the missing ones), other keys dropped."""
    missing = {name: "missing parameter" for name in AUTH_FIELDS if name not in msg}
    if missing:
        raise refusal(missing)
    return AuthData(**{key: value for key, value in msg.items() if key in AUTH_FIELDS})


def json_payload(route: str, parse: Callable[[Any], Any] | None, workload: Callable[[Any], float] | None,
                 refusal: type) -> Callable[[Any], JsonPayload]:
    """A JSON route's payload maker: an object only, through the route's parser (a `refusal` it raises is
    a 422; any other failure a 500, as the SDK's)."""
    def make(body: Any) -> JsonPayload:
        if not isinstance(body, dict):
            raise refusal({"data": "payload must be a dictionary"})
        if parse is not None:
            try:
                body = parse(body)
            except refusal:
                raise
            except Exception as exc:
                raise Exception(f"Error in user response handler: {exc}") from exc
        return JsonPayload(body, workload, route)

    return make


def install(ctx: Any) -> tuple[Serve, Callable[[Route], Any]]:
    """(serve, handle): `serve` runs the steps after the parse (the wire front calls it too); `handle(route)`
    is the aiohttp handler of a route. Call after install_parts: the chains of `ctx` are final."""
    from aiohttp import web

    session_request = ctx.sdk.session_handler()
    log_sdk = sdk_seam.backend_logger()
    outcomes, check_signature, call_engine = ctx.outcomes, ctx.check_signature, ctx.call_engine
    reject, start, success, errored, canceled, end = (outcomes.reject, outcomes.start, outcomes.success,
                                                       outcomes.errored, outcomes.canceled, outcomes.end)

    async def serve(route: Route, auth_data: Any, payload: Any, respond: Callable[[Any], Awaitable[Any]],
                    bare: Callable[[int], Any]) -> Any:
        """The steps after the parse: record, signature, queue check, engine call, answer, outcome."""
        record = outcomes.new(auth_data.request_idx, auth_data.reqnum, payload.count_workload())
        if check_signature(auth_data) is False:
            reject(record)
            return bare(401)
        if route.max_queue_time is not None and outcomes.wait_time() > route.max_queue_time:
            reject(record)
            return bare(429)
        start(record)
        try:
            record.work_started_at = time.time()
            try:
                answer = await call_engine(handler=route, payload=payload)
                response = await respond(answer)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 (as the SDK's handler: any failure is a 500)
                errored(record, str(exc))
                return bare(500)
            success(record)
            return response
        except asyncio.CancelledError:  # the client went away (aiohttp's handler cancellation)
            log_sdk.debug(f"Request {record.reqnum} cancelled (client disconnect)")
            canceled(record)
            return bare(499)
        finally:
            end(record)

    def bare(status: int) -> Any:
        return web.Response(status=status)

    def handle(route: Route) -> Callable[[Any], Awaitable[Any]]:
        async def handle_request(request: Any) -> Any:
            try:
                data = await request.json()
                auth_data, payload, session_id = route.parse(data)
            except route.refusal as exc:
                return web.json_response(data=exc.message, status=422)  # type: ignore[attr-defined]
            except json.JSONDecodeError:
                return web.json_response({"error": "invalid JSON"}, status=422)
            if session_id is not None:  # sessions are the SDK's
                return await session_request(handler=route.sdk, request=request)
            async def respond(answer: Any) -> Any:
                try:
                    return await route.respond(request, answer)
                except Exception as exc:  # as the SDK says it, in the errored report's line
                    raise Exception(f"Error in user response generator: {exc}") from exc

            return await serve(route, auth_data, payload, respond, bare)

        return handle_request

    return serve, handle


def routes(served: dict[str, Route], handle: Callable[[Route], Any]) -> list[Any]:
    """aiohttp route definitions: each route's request to bakery's handler (the SDK Worker's `routes`)."""
    from aiohttp import web

    return [web.post(path, handle(route)) for path, route in served.items()]
