"""own_handler.py: bakery's route handler against the SDK's own Backend.__handle_request.

Differential, in the worker venv: the same request meets the SDK's handler (vastai 1.9.1, the real
method on a Backend, with the SDK's EndpointHandler of the route) and bakery's (its own parse, workload
and answer, own_handler.Route), both made from the vLLM worker's own configuration, each with a real SDK
Metrics for the record. Every scenario the SDK's handler and parse distinguish (served; JSON it cannot
parse; each missing or misshapen part of the envelope; a refused signature; a queue over max_queue_time;
an engine call or a response that fails; a client gone mid-call) must give the same answer (status and
body), the same record (counters, requests received, in flight and ended with their state and workload,
the lines it logged), and the same engine calls. A session request goes to the SDK's handler (sessions
are the SDK's). The whole worker test suite runs on bakery's handler besides.
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
    import asyncio, dataclasses, json, logging, os, sys
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

    from vastai.serverless.server.lib.data_types import ModelMetrics
    from vastai.serverless.server.lib.metrics import Metrics

    class QueueMetrics(ModelMetrics):
        wait_time = 0.0  # set per scenario (the real one sums what is in flight)

    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append([record.levelname, record.getMessage()])

    sdk_seam.metrics_logger().addHandler(Keep())
    sdk_seam.metrics_logger().setLevel(logging.DEBUG)

    def record(metrics):
        # What the control plane holds of the request afterwards: the counters, what was received, what is in
        # flight, what ended (each with its state), and the lines the record logged.
        m = metrics.model_metrics
        return {"counts": [m.workload_pending, m.workload_received, m.workload_served, m.workload_errored,
                           m.workload_cancelled, m.workload_rejected],
                "received": sorted(m.requests_recieved), "working": sorted(m.requests_working),
                "ended": [[r.request_idx, r.reqnum, r.workload, r.status, r.success, r.work_started_at > 0,
                           r.work_completed_at > 0] for r in m.requests_deleting],
                "update_pending": metrics.update_pending, "lines": lines[:]}

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
        b.metrics = Metrics()
        b.metrics.model_metrics = QueueMetrics.empty()
        b.metrics.system_metrics.model_is_loaded = True
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
        lines.clear()
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
            return {"raised": type(exc).__name__, "calls": calls, "record": record(b.metrics)}
        return {"status": response.status, "body": response.text, "calls": calls, "record": record(b.metrics)}

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
    ended = {name: [entry[3] for entry in pair[0]["record"]["ended"]] for name, pair in outcomes.items()}
    assert (names["served"], ended["served"]) == (["signature", "engine"], ["Success"])
    assert (names["unsigned"], ended["unsigned"]) == (["signature"], ["Rejected"])
    assert (names["queue_full"], ended["queue_full"]) == (["signature"], ["Rejected"])
    assert (names["engine_fails"], ended["engine_fails"]) == (["signature", "engine"], ["Error"])
    assert (names["cancelled"], ended["cancelled"]) == (["signature", "engine"], ["Cancelled"])
    assert names["invalid_json"] == names["missing"] == names["session"] == []
    assert ended["invalid_json"] == ended["missing"] == ended["session"] == []
    errored = outcomes["respond_fails"][0]["record"]["lines"]
    assert ["ERROR", "Request 7 errored: Error in user response generator: the answer could not be written"] in errored
    refused = {name: json.loads(outcomes[name][0]["body"]) for name in
               ("missing", "auth_field_missing", "payload_not_object", "nothing")}
    assert refused == {"missing": {"payload": "field missing"},
                       "auth_field_missing": {"auth_data": {"url": "missing parameter"}},
                       "payload_not_object": {"payload": {"data": "payload must be a dictionary"}},
                       "nothing": {"auth_data": "field missing", "payload": "field missing"}}
    served = outcomes["served"][0]["record"]["ended"][0]
    assert served[2] > 0 and served[2] != 100.0  # the route's own workload counted, not the default
