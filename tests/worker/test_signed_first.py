"""Signed first, on the real SDK: an envelope not signed for this worker is refused before anything
parses its payload, decodes an upload or builds a multipart body (worker/policy/signed_first.py).

One secured worker serves the completion routes and /v1/images/edits in front of the recording vLLM
stand-in; REPORT_ADDR is a local report server holding the platform's public key. The order shows
from outside: the SDK judges an edit's uploads (422 naming the field) before it checks the signature,
so an unsigned edit whose last upload is not base64 got that 422; signed first, it gets 401, and the
same body signed gets the 422. The cost shows in the worker's own memory: the high-water mark of its
RSS (/proc/PID/status VmHWM, reset through /proc/PID/clear_refs) around one unsigned request.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.worker.helpers import SDK_READY, Harness, Served, SigningKey, make_signing_key

pytestmark = pytest.mark.slow
ROUTES = "/v1/completions,/v1/chat/completions,/v1/images/edits"
MIB = 1024 * 1024
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + os.urandom(64 * 1024)).decode()


@dataclass
class Worker:
    """The secured worker, its keys, and the stand-in's record of what reached the engine."""

    served: Served
    key: SigningKey  # the platform's
    stranger: SigningKey  # a key the worker does not know
    record: Path

    def auth(self, key: SigningKey | None = None, idx: int = 1) -> dict[str, Any]:
        url = self.served.url
        return {"cost": "8", "endpoint": "test", "reqnum": idx, "request_idx": idx, "url": url,
                "signature": (key or self.key).sign(url)}


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory, worker_python: Path) -> Iterator[Worker]:
    key, stranger = make_signing_key(worker_python), make_signing_key(worker_python)
    tmp = tmp_path_factory.mktemp("signed-first")
    record = tmp / "record.jsonl"
    with Harness(tmp, worker_python, key.pem) as harness:
        engine = harness.standin("vllm", STANDIN_RECORD=str(record))
        served = harness.worker("vllm", engine, UNSECURED=None, OPENAI_ROUTES=ROUTES, BAKERY_SESSIONS="true")
        served.worker.wait_for(SDK_READY, timeout=90)
        harness.reports.wait_loaded()
        yield Worker(served, key, stranger, record)


def post(port: int, route: str, body: bytes) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", route, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        return response.status, json.loads(data) if data.startswith(b"{") else data
    finally:
        conn.close()


def edit(auth: dict[str, Any], images: list[str]) -> bytes:
    return json.dumps({"auth_data": auth, "payload": {
        "prompt": "p", "image": images, "filename": [f"{i}.png" for i in range(len(images))]}}).encode()


def engine_saw(record: Path, marker: str) -> bool:
    return record.exists() and marker in record.read_text()


def test_an_unsigned_edit_is_refused_before_its_uploads_are_judged(worker: Worker) -> None:
    """15 uploads, the last one not base64: unsigned -> 401 (nothing of the payload was read), signed
    by the platform -> 422 naming the upload (the same body is judged once it is signed)."""
    images = [PNG] * 14 + ["not base64 at all!"]
    port = worker.served.port
    for key in (worker.stranger, None):
        status, body = post(port, "/v1/images/edits", edit(worker.auth(key=key), images))
        if key is worker.stranger:
            assert status == 401 and "not signed" in body["error"], (status, body)
        else:
            assert status == 422 and "image" in json.dumps(body), (status, body)
    # A forged edit that would be served never reaches the engine either.
    status, body = post(port, "/v1/images/edits", edit(worker.auth(key=worker.stranger), [PNG]))
    assert status == 401, (status, body)
    assert not engine_saw(worker.record, "/v1/images/edits")


def peak_added(pid: int, send: Any) -> int:
    """Bytes the worker's resident set grew to above where it was, over `send()`."""
    status = Path(f"/proc/{pid}/status")

    def read(field: str) -> int:
        line = next(line for line in status.read_text().splitlines() if line.startswith(field + ":"))
        return int(line.split()[1]) * 1024

    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = read("VmRSS")
    send()
    return read("VmHWM") - before


def test_an_unsigned_request_costs_at_most_three_times_its_size(worker: Worker) -> None:
    """Peak memory an unsigned 16 MiB body of `{}` items adds to the worker stays within 3x the body
    (aiohttp's buffer included); parsed, as the SDK and the envelope guard both did, it was ~50x.
    (Upload bodies are measured by bench/unsigned_bench.py: unsigned, they were within 4x already.)"""
    auth = worker.auth(key=worker.stranger, idx=5)
    body = (b'{"auth_data": ' + json.dumps(auth).encode() + b', "payload": {"prompt": "x", "items": ['
            + b",".join([b"{}"] * (16 * MIB // 3)) + b"]}}")
    statuses: list[int] = []
    added = peak_added(worker.served.worker.popen.pid,
                       lambda: statuses.append(post(worker.served.port, "/v1/completions", body)[0]))
    assert statuses == [401]
    assert added <= 3 * len(body), f"{added / MIB:.0f} MiB added for a {len(body) / MIB:.0f} MiB body"


def test_an_unsigned_session_call_costs_at_most_three_times_its_size(worker: Worker) -> None:
    """With BAKERY_SESSIONS=true, /session/* calls are signed first too: an unsigned 16 MiB create
    and end (items of `{}` in the payload) are refused with 401 for at most 3x their size (parsed
    whole before the check, as they were: 443 MiB for the create, ~27x), and a signed create is judged after its check
    (a lifetime over the cap: 422 signed, 401 unsigned)."""
    items = b",".join([b"{}"] * (16 * MIB // 3))
    statuses: list[int] = []
    for route, key in (("/session/create", "auth_data"), ("/session/end", "session_auth")):
        auth = json.dumps({**worker.auth(key=worker.stranger, idx=7), "cost": 8}).encode()  # a session's cost
        body = (b'{"' + key.encode() + b'": ' + auth + b', "session_id": "s", "payload": {"lifetime": 5, "items": ['
                + items + b"]}}")
        added = peak_added(worker.served.worker.popen.pid,
                           lambda body=body, route=route: statuses.append(post(worker.served.port, route, body)[0]))
        assert statuses[-1] == 401, route
        assert added <= 3 * len(body), f"{route}: {added / MIB:.0f} MiB added for a {len(body) / MIB:.0f} MiB body"
    for key, status in ((worker.stranger, 401), (None, 422)):
        auth = {**worker.auth(key=key, idx=8), "cost": 8}
        code, answer = post(worker.served.port, "/session/create",
                            json.dumps({"auth_data": auth, "payload": {"lifetime": 10**6}}).encode())
        assert code == status, (code, answer)


def test_signed_json_that_python_reads_differently_is_422_not_500(worker: Worker) -> None:
    """What the SDK's one parse would choke on is refused once the envelope is signed: an integer
    beyond int()'s digits (ValueError, a 500 in the SDK), and NaN, which is not JSON (RFC 8259).
    (Before signed first these were 422 "not valid JSON" and 200: this pins that the new path, which
    no longer parses the body itself, still never lets them reach the SDK as a 500.)"""
    port = worker.served.port
    prefix = b'{"auth_data": ' + json.dumps(worker.auth(idx=6)).encode() + b', "payload": {"prompt": "x", "x_number": '
    for number, says in ((b"1" * 5000, "digits"), (b"NaN", "not valid JSON"), (b"1" * 5000 + b".5", None)):
        status, body = post(port, "/v1/completions", prefix + number + b"}}")
        if says is None:  # a long float is read by json at any length: served
            assert status == 200, (status, body)
        else:
            assert status == 422 and says in body["error"], (status, body)
    assert "Traceback" not in worker.served.worker.text
