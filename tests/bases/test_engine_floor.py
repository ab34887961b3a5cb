"""bench/engine_floor.c, the benches' engine in C, held to the vLLM stand-in it replaces in the scale loads.

The scale benches (`relay_floor.py --engine c`, `serving_bench.py --scale-engine c`,
`scale_image.py --c-engine`) swap the Python stand-in for this engine so that the worker, not the
engine, has the host's cores. Their figures compare only if it answers what the stand-in answers:
the same head, the same number of events with the same keys in the same bytes' shape, the same
finish, `[DONE]`, the same non-streamed answer, kept-alive connections and the ready line the
worker waits for. No timing is asserted.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from typing import Any

import pytest

from bakery.paths import REPO_ROOT
from tests.bases.conftest import StandinProc, free_port, wait_for
from tests.host_tools import require_tool

sys.path.insert(0, str(REPO_ROOT / "bench"))  # the benches' own helpers (bench/ is not a package)
from c_parts import build_c

TOKENS = 5
MODEL = "org/model-7b"


def shape(value: Any) -> Any:
    """The keys and value types of a JSON value, recursively (lists: the shape of each item)."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(item) for item in value]
    return type(value).__name__


Request = tuple[str, str, dict[str, Any] | None]


def exchange(port: int, requests: list[Request]) -> list[tuple[int, dict[str, str], str]]:
    """Send `requests` (method, path, JSON body) one after the other on ONE connection; each
    answer's status, headers (lower-case names) and body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    answers = []
    try:
        for method, path, body in requests:
            conn.request(method, path, body=json.dumps(body) if body is not None else None,
                         headers={"content-type": "application/json"})
            resp = conn.getresponse()
            answers.append((resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode()))
    finally:
        conn.close()
    return answers


def events(body: str) -> list[str]:
    return [part[len("data: "):] for part in body.split("\n\n") if part.startswith("data: ")]


@pytest.fixture(scope="module")
def floor(tmp_path_factory: pytest.TempPathFactory) -> Any:
    require_tool("gcc")
    tmp = tmp_path_factory.mktemp("engine-floor")
    binary = build_c(tmp, "engine_floor")
    port, log = free_port(), tmp / "engine.log"
    # 5 tokens, 2 ms apart; it stops by itself 30 s after its last connection, or at teardown.
    proc = subprocess.Popen([str(binary), str(port), str(log), MODEL, str(TOKENS), "2", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        assert "listening on 127.0.0.1" in proc.stdout.readline()
        yield port, log
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture()
def vllm(standin: Any) -> StandinProc:
    sp = standin(["vllm", "serve", MODEL, "--host", "127.0.0.1", "--port", "{port}"],
                 {"STANDIN_REPLY_TOKENS": str(TOKENS), "STANDIN_TOKEN_DELAY": "0.002"})
    sp.wait_line("Application startup complete.")
    wait_for(lambda: exchange(sp.port, [("GET", "/health", None)])[0][0] == 200, 10, "the stand-in's /health")
    return sp


STREAM = {"model": MODEL, "prompt": "scale", "stream": True}
SINGLE = {"model": MODEL, "prompt": "scale", "stream": False, "max_tokens": 1}


def test_streamed_answer_has_the_stand_ins_shape(floor: Any, vllm: StandinProc) -> None:
    ours, theirs = (exchange(port, [("POST", "/v1/completions", STREAM)])[0] for port in (floor[0], vllm.port))
    assert ours[0] == theirs[0] == 200
    for header in ("content-type", "transfer-encoding"):
        assert ours[1].get(header) == theirs[1].get(header), header
    mine, stand_in = events(ours[2]), events(theirs[2])
    assert len(mine) == len(stand_in) == TOKENS + 2  # the tokens, the finish event, [DONE]
    assert mine[-1] == stand_in[-1] == "[DONE]"
    for a, b in zip(mine[:-1], stand_in[:-1], strict=True):
        assert shape(json.loads(a)) == shape(json.loads(b))
        assert list(json.loads(a)) == list(json.loads(b))  # the same keys in the same order
    finishes = [[c["finish_reason"] for c in json.loads(e)["choices"]] for e in mine[:-1]]
    assert finishes == [[c["finish_reason"] for c in json.loads(e)["choices"]] for e in stand_in[:-1]]
    # An event is about as many bytes as the stand-in's (its id and tokens differ in length only).
    sizes = [len(e) for e in mine[:-1]], [len(e) for e in stand_in[:-1]]
    assert all(abs(a - b) <= 12 for a, b in zip(*sizes, strict=True)), sizes


def test_non_streamed_answer_has_the_stand_ins_shape(floor: Any, vllm: StandinProc) -> None:
    ours, theirs = (exchange(port, [("POST", "/v1/completions", SINGLE)])[0] for port in (floor[0], vllm.port))
    assert ours[0] == theirs[0] == 200
    assert ours[1]["content-type"] == theirs[1]["content-type"] == "application/json"
    mine, stand_in = json.loads(ours[2]), json.loads(theirs[2])
    assert shape(mine) == shape(stand_in)
    assert mine["choices"][0]["finish_reason"] == stand_in["choices"][0]["finish_reason"] == "length"
    assert mine["usage"]["completion_tokens"] == stand_in["usage"]["completion_tokens"] == 1


def test_health_and_kept_alive_connections(floor: Any, vllm: StandinProc) -> None:
    sequence = [("GET", "/health", None), ("POST", "/v1/completions", STREAM), ("POST", "/v1/completions", SINGLE),
                ("GET", "/health", None)]
    ours, theirs = exchange(floor[0], sequence), exchange(vllm.port, sequence)
    assert [a[0] for a in ours] == [a[0] for a in theirs] == [200, 200, 200, 200]
    assert ours[0][2] == theirs[0][2] == ""
    assert len(events(ours[1][2])) == len(events(theirs[1][2])) == TOKENS + 2


def test_writes_the_ready_line_the_worker_waits_for(floor: Any, vllm: StandinProc) -> None:
    log = floor[1]
    line = log.read_text().strip()
    theirs = next(x for x in vllm.text.splitlines() if x.endswith("Application startup complete."))
    # "(APIServer pid=N) INFO:     Application startup complete.": the same words after the pid.
    assert line.split(")", 1)[1] == theirs.split(")", 1)[1]
    assert line.startswith("(APIServer pid=") and theirs.startswith("(APIServer pid=")
