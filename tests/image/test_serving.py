"""Serving checks on the built image (issue 14): a streamed answer in flight at `docker stop` completes,
a request sent after the signal gets 503, and the stop ends inside Docker's default grace with exit 0.

An offline launch (UNSECURED=true, the README's offline mode: unsigned envelopes are served); the
client talks to the test container's own address on Docker's bridge, from the host. The long answer:
the stand-ins stream with a per-token delay (STANDIN_TOKEN_DELAY), the real llama.cpp generates 64
tokens ignoring EOS.
"""

from __future__ import annotations

import http.client
import json
import threading
import time

from tests.image.conftest import Containers, ImageUnderTest
from tests.image.launch import Launched, offline_env

DOCKER_GRACE = 10  # `docker stop`'s default
READY_TIMEOUT = 300
ROUTE = "/v1/chat/completions"
LLAMA_TOKENS = 64


def _address(launched: Launched) -> str:
    launched.container.reload()
    return launched.container.attrs["NetworkSettings"]["IPAddress"]


def _envelope(payload: dict, idx: int) -> bytes:
    auth = {"cost": "8", "endpoint": "gate", "reqnum": idx, "request_idx": idx, "signature": "", "url": "x"}
    return json.dumps({"auth_data": auth, "payload": payload}).encode()


def _long_answer(engine: str) -> tuple[dict, dict[str, str]]:
    """The request that stays in flight for seconds, and the launch variables that make it long."""
    payload = {"messages": [{"role": "user", "content": "Tell a long story."}], "stream": True,
               "stream_options": {"include_usage": True}}
    if engine == "llama":
        # Long enough to be in flight at the stop, short enough to end inside the 8 s drain on a busy CPU.
        return {**payload, "max_tokens": LLAMA_TOKENS, "ignore_eos": True}, {}
    return payload, {"STANDIN_TOKEN_DELAY": "0.1", "STANDIN_REPLY_TOKENS": "50"}


def test_docker_stop_drains_the_request_in_flight(image: ImageUnderTest, containers: Containers) -> None:
    payload, extra = _long_answer(image.engine)
    launched = containers.launch(image, offline_env(image.spec, **extra), "drain", controlplane=False)
    assert launched.ready(READY_TIMEOUT), f"the worker never became ready:\n{launched.logs()[-3000:]}"
    host = _address(launched)
    # Offline, readiness is the benchmark file, written a moment before the worker marks itself
    # loaded: until then it answers 503 (bounded retries).
    for _attempt in range(60):
        conn = http.client.HTTPConnection(host, 3000, timeout=60)
        conn.request("POST", ROUTE, body=_envelope(payload, 1), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 503:
            break
        response.read()
        conn.close()
        time.sleep(0.5)
    assert response.status == 200, response.read()[:500]
    first = response.readline()
    assert first.startswith(b"data: "), first

    stop: dict[str, float] = {}

    def docker_stop() -> None:
        started = time.monotonic()
        launched.container.stop(timeout=DOCKER_GRACE)
        stop["seconds"] = time.monotonic() - started

    stopper = threading.Thread(target=docker_stop)
    stopper.start()
    assert launched.wait_for(lambda: "draining, 1 request(s) in flight" in launched.logs(), 5, 0.05), \
        launched.logs()[-3000:]
    late = http.client.HTTPConnection(host, 3000, timeout=10)
    late.request("POST", ROUTE, body=_envelope({"messages": [{"role": "user", "content": "late"}]}, 2),
                 headers={"Content-Type": "application/json"})
    refused = late.getresponse()
    assert refused.status == 503 and refused.getheader("Retry-After"), (refused.status, refused.read())
    late.close()

    rest = response.read()
    conn.close()
    stopper.join(DOCKER_GRACE + 20)
    events = [e for e in (first + rest).split(b"\n\n") if e.strip()]
    assert events[-1].strip() == b"data: [DONE]", events[-3:]
    usage = json.loads(events[-2].strip()[len(b"data: "):])
    assert usage["usage"]["completion_tokens"] == (LLAMA_TOKENS if image.engine == "llama" else 50), usage
    assert launched.exit_code() == 0, launched.logs()[-3000:]
    assert stop["seconds"] < DOCKER_GRACE, stop  # no SIGKILL: the drain and the engine's stop fit the grace
    logs = launched.logs()
    # supervisord stopped the worker (drained) before the engine, whose program is named after it.
    assert "drained in" in logs and logs.index("stopped: worker (exit status 0)") < \
        logs.index(f"stopped: {image.engine}"), logs[-3000:]
