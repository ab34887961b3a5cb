"""own_handler.py: bakery's route handler against the SDK's own Backend.__handle_request.

Differential, in the worker venv: the same request meets the SDK's handler (vastai 1.9.1, the real
method on a Backend, with the SDK's EndpointHandler of the route) and bakery's (its own parse, workload
and answer, own_handler.Route), both made from the vLLM worker's own configuration, each with a recorder
for Metrics. Every scenario the SDK's handler and parse distinguish (served; JSON it cannot parse; each
missing or misshapen part of the envelope; a refused signature; a queue over max_queue_time; an engine
call or a response that fails; a client gone mid-call) must give the same answer (status and body),
the same outcome calls on Metrics in the same order with the same request state and workload, and the
same engine calls. A session request goes to the SDK's handler (sessions are the SDK's). The whole worker
test suite runs on bakery's handler besides (core.run installs it as every route's).
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.worker.helpers import WORKER_DIR, baked_facts

SCRIPT = textwrap.dedent("""
    import asyncio, dataclasses, json, os, sys
    sys.path.insert(0, sys.argv[1])
    import vastai
    from collections import deque
    from vastai.serverless.server.lib.backend import Backend
    from aiohttp import web
    from app import sdk_config, worker_config
    from control import own_handler, sdk_seam
    from types import SimpleNamespace
    from workers.vllm.worker import DEFAULTS

    SCENARIO = [""]
    ROUTE = "/v1/completions"

    class ModelMetrics:
        wait_time = 0.0

    class Recorder:
        def __init__(self, calls):
            self.calls, self.model_metrics = calls, ModelMetrics()
            self.system_metrics = SimpleNamespace(model_is_loaded=True)
        def note(self, name, rm, *rest):
            self.calls.append([name, rm.request_idx, rm.reqnum, rm.workload, rm.status, rm.success,
                               rm.work_started_at > 0, *rest])
        def _request_start(self, rm): self.note("start", rm)
        def _request_end(self, rm): self.note("end", rm)
        def _request_success(self, rm): self.note("success", rm)
        def _request_errored(self, rm, message): self.note("errored", rm, message)
        def _request_canceled(self, rm): self.note("canceled", rm)
        def _request_reject(self, rm): self.note("reject", rm)
        async def _Metrics__send_delete_requests_and_reset(self): pass  # what sdk_seam.Outcomes finds

    async def respond(request, answer):  # each route's response generator, the same for both handlers
        if SCENARIO[0] == "respond_fails":
            raise ValueError("the answer could not be written")
        return web.Response(status=answer["status"], text=answer["text"])

    # bakery's own configuration of the vLLM worker's routes, as core.run() makes it.
    config, _ = sdk_config.build_worker_config(worker_config.load_settings(DEFAULTS, os.environ), vastai, ["word"])
    for hc in config.handlers:
        hc.response_generator = respond
    ROUTES = sdk_config.endpoint_handlers(config)

    class Request:
        def __init__(self, body): self.body = body
        async def json(self): return json.loads(self.body)

    AUTH = {"cost": "1", "endpoint": "e", "reqnum": 11, "request_idx": 7, "signature": "s", "url": "u"}
    GOOD = {"auth_data": AUTH, "payload": {"model": "m", "prompt": "hello there", "max_tokens": 9}}
    BODIES = {"invalid_json": "{not json", "missing": json.dumps({"auth_data": AUTH}),
              "auth_field_missing": json.dumps({**GOOD, "auth_data": {k: v for k, v in AUTH.items() if k != "url"}}),
              "payload_not_object": json.dumps({**GOOD, "payload": ["hello"]}),
              "envelope_not_object": json.dumps(["auth_data", "payload"]),
              "nothing": json.dumps({}),
              "extra_keys": json.dumps({**GOOD, "auth_data": {**AUTH, "more": 1}, "other": 2}),
              "session": json.dumps({**GOOD, "session_id": "s-1"})}

    def backend(scenario, calls):
        b = object.__new__(Backend)
        b.metrics = Recorder(calls)
        b.queue, b._queue_lock = deque(), asyncio.Lock()
        b.sessions, b._sessions_lock = {}, asyncio.Lock()
        b.metrics.model_metrics.wait_time = 601.0 if scenario == "queue_full" else 599.0
        b._Backend__check_signature = lambda auth: (calls.append(["signature", auth.reqnum, auth.url])
                                                     or scenario != "unsigned")
        async def call_backend(handler, payload):
            calls.append(["engine", handler.endpoint, payload.generate_payload_json()])
            if scenario == "engine_fails":
                raise ConnectionError("the engine went away")
            if scenario == "cancelled":
                await asyncio.Event().wait()
            return {"status": 200, "text": "served"}
        b._Backend__call_backend = call_backend
        return b

    async def run(scenario, own):
        calls = []
        SCENARIO[0] = scenario
        b = backend(scenario, calls)
        request = Request(BODIES.get(scenario, json.dumps(GOOD)))
        route = ROUTES[ROUTE]
        if scenario == "no_queue_limit":
            route = dataclasses.replace(route, max_queue_time=None)
            route.sdk.max_queue_time = None
        if own:  # bakery's chains are the ones the SDK's handler calls here: only the handler differs
            ctx = SimpleNamespace(sdk=sdk_seam.ControlPlane(b), outcomes=sdk_seam.Outcomes(b),
                                  check_signature=b._Backend__check_signature, call_engine=b._Backend__call_backend)
            _, handle = own_handler.install(ctx)
            task = asyncio.ensure_future(handle(route)(request))
        else:
            task = asyncio.ensure_future(b._Backend__handle_request(handler=route.sdk, request=request))
        if scenario == "cancelled":
            for _ in range(20):
                await asyncio.sleep(0)
            task.cancel()
        try:
            response = await task
        except Exception as exc:  # an envelope neither parse can read: aiohttp answers 500
            return {"raised": type(exc).__name__, "calls": calls}
        return {"status": response.status, "body": response.text, "calls": calls}

    async def main():
        out = {}
        for scenario in SCENARIOS:
            kept = ROUTES[ROUTE].sdk.max_queue_time
            out[scenario] = [await run(scenario, own=False), await run(scenario, own=True)]
            ROUTES[ROUTE].sdk.max_queue_time = kept
        print(json.dumps(out))

    SCENARIOS = json.loads(sys.argv[2])
    asyncio.run(main())
""")

SCENARIOS = ("served", "no_queue_limit", "invalid_json", "missing", "auth_field_missing", "payload_not_object",
             "envelope_not_object", "nothing", "extra_keys", "unsigned", "queue_full", "engine_fails",
             "respond_fails", "cancelled", "session")


@pytest.fixture(scope="module")
def outcomes(worker_python: Path) -> dict:
    env = {**os.environ, "CONTAINER_ID": "5", "REPORT_ADDR": "http://127.0.0.1:9", "PUBLIC_IPADDR": "203.0.113.7",
           "USE_SSL": "false", "WORKER_PORT": "3000", "VAST_TCP_PORT_3000": "41234",  # what the SDK reads
           **baked_facts("vllm")}  # what the vLLM image bakes: its routes are the ones checked
    done = subprocess.run([str(worker_python), "-c", SCRIPT, str(WORKER_DIR), json.dumps(SCENARIOS)],
                          capture_output=True, text=True,
                          timeout=120, check=False, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_bakerys_handler_answers_and_reports_as_the_sdks(outcomes: dict, scenario: str) -> None:
    sdk, own = outcomes[scenario]
    assert own == sdk


def test_the_scenarios_reach_every_branch(outcomes: dict) -> None:
    """The differential above is worth what the scenarios cover: each one's answer and outcome
    calls, as the SDK gives them."""
    status = {name: pair[0].get("status", pair[0].get("raised")) for name, pair in outcomes.items()}
    assert status == {"served": 200, "no_queue_limit": 200, "invalid_json": 422, "missing": 422,
                      "auth_field_missing": 422, "payload_not_object": 422, "envelope_not_object": "TypeError",
                      "nothing": 422, "extra_keys": 200, "unsigned": 401, "queue_full": 429, "engine_fails": 500,
                      "respond_fails": 500, "cancelled": 499, "session": 410}
    names = {name: [call[0] for call in pair[0]["calls"]] for name, pair in outcomes.items()}
    assert names["served"] == ["signature", "start", "engine", "success", "end"]
    assert names["unsigned"] == ["signature", "reject"]
    assert names["queue_full"] == ["signature", "reject"]
    assert names["engine_fails"] == ["signature", "start", "engine", "errored", "end"]
    assert names["cancelled"] == ["signature", "start", "engine", "canceled", "end"]
    assert names["invalid_json"] == names["missing"] == names["session"] == []
    refused = {name: json.loads(outcomes[name][0]["body"]) for name in
               ("missing", "auth_field_missing", "payload_not_object", "nothing")}
    assert refused == {"missing": {"payload": "field missing"},
                       "auth_field_missing": {"auth_data": {"url": "missing parameter"}},
                       "payload_not_object": {"payload": {"data": "payload must be a dictionary"}},
                       "nothing": {"auth_data": "field missing", "payload": "field missing"}}
    served = outcomes["served"][0]["calls"]
    assert served[1][3] > 0 and served[1][3] != 100.0  # the route's own workload counted, not the default
