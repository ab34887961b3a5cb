"""The worker's guards on the real SDK, as the platform uses it: signed requests, on loopback.

One worker (module scope) runs secured in front of tests/worker/guard_engine.py with small limits;
REPORT_ADDR is a local report server that serves a real public key and records every report, and the
tests sign envelopes as the platform does (helpers.SigningKey). Workers of their own cover what needs
another environment: a key served late, sessions turned on, bad variables, the real llama.cpp.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.worker.helpers import (
    SDK_READY,
    Harness,
    Proc,
    ReportServer,
    SigningKey,
    json_error,
    make_signing_key,
    request,
    secured,
    send,
    start_engine,
)

pytestmark = pytest.mark.slow
SMALL_LIMITS = {"BAKERY_MAX_BODY_BYTES": "65536", "BAKERY_BODY_TIMEOUT": "2", "BAKERY_HEADER_TIMEOUT": "2",
                "BAKERY_ENGINE_IDLE_TIMEOUT": "2", "BAKERY_ENGINE_CONNECT_TIMEOUT": "2"}
ENGINE_LOAD_SECONDS = 3.0


@pytest.fixture(scope="session")
def key(worker_python: Path) -> SigningKey:
    """The platform's key pair (the report server serves its public half)."""
    return make_signing_key(worker_python)


@pytest.fixture(scope="session")
def other_key(worker_python: Path) -> SigningKey:
    """A key the worker does not know."""
    return make_signing_key(worker_python)


@dataclass
class Running:
    """A secured worker in front of the guard engine, and what the tests need to talk to it."""

    port: int
    url: str  # the worker's own URL, as it reports it
    worker: Proc
    engine_log: Path
    reports: ReportServer
    key: SigningKey
    early: tuple[int, bytes, dict[str, str]]  # a signed request sent before the model was loaded

    def auth(self, url: str | None = None, key: SigningKey | None = None, idx: int = 1, **extra: Any) -> dict:
        """auth_data signed for `url` (default: this worker) with `key` (default: the platform's)."""
        target = url or self.url
        return {"cost": "8", "endpoint": "test", "reqnum": idx, "request_idx": idx,
                "signature": (key or self.key).sign(target), "url": target, **extra}


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory, worker_python: Path, key: SigningKey) -> Iterator[Running]:
    """The shared secured worker; its first request is sent while the engine still loads."""
    with Harness(tmp_path_factory.mktemp("guards"), worker_python, key.pem) as harness:
        engine = start_engine(harness, ENGINE_LOAD_SECONDS)
        served = secured(harness, engine, **SMALL_LIMITS)
        worker, port, log, reports = served.worker, served.port, engine.log, harness.reports
        worker.wait_for("HTTP servers started", timeout=60)
        # The probe must find the key loaded (the engine is still loading): a 503 sent before the key is
        # here has no checkable signature and is, by design, not reported.
        worker.wait_for("public key loaded from", timeout=60)
        url = f"http://127.0.0.1:{port}"
        probe = Running(port, url, worker, log, reports, key, (0, b"", {}))
        status, body, headers = send(port, "/v1/completions", {"auth_data": probe.auth(idx=7001),
                                                               "payload": {"prompt": "early-probe"}})
        probe.early = (status, body, headers)
        worker.wait_for(SDK_READY, timeout=60)
        reports.wait_loaded()
        yield probe


# --------------------------------------------------------------------------- served as before


def test_signed_completion_and_chat_are_served(running: Running) -> None:
    """Upstream-facing behaviour is unchanged: the engine's answer, as it sent it."""
    status, body, headers = send(running.port, "/v1/completions",
                                 {"auth_data": running.auth(idx=11), "payload": {"prompt": "hello", "max_tokens": 4}})
    assert status == 200 and body["choices"][0]["text"] == "echo:hello", body
    assert headers["content-type"].startswith("application/json")
    status, body, _ = send(running.port, "/v1/chat/completions", {
        "auth_data": running.auth(idx=12),
        "payload": {"messages": [{"role": "user", "content": "chat hi"}], "max_tokens": 4}})
    assert status == 200 and body["choices"][0]["text"] == "echo:chat hi", body


def test_the_startup_line_names_the_guards(running: Running) -> None:
    out = running.worker.text
    assert "bakery-worker: guards=own_url,sessions,self_update,limits,not_ready,envelope,pubkey_retry," \
           "log_hygiene,http_listener,outcomes max_body=65536B body_timeout=2s header_timeout=2s" in out


def test_not_ready_503_before_the_model_is_loaded(running: Running) -> None:
    """Sent while the engine loaded: 503 + Retry-After, and the engine never saw it; the SDK's
    benchmark (which calls the engine directly) still ran and the worker became ready."""
    assert "not loaded" in json_error(running.early, 503)
    assert running.early[2].get("retry-after") == "10"
    engine_log = running.engine_log.read_text()
    assert "early-probe" not in engine_log
    assert "served /v1/completions" in engine_log  # the benchmark's requests


# --------------------------------------------------------------------------- outcomes


def test_a_signed_request_refused_before_loading_is_reported(running: Running) -> None:
    """The 503 never reached the SDK, which reports only what it handled: the outcomes guard tells the
    autoscaler, as for the SDK's own refusals, so it stops counting the request as in flight."""
    assert running.early[0] == 503
    outcome = running.reports.wait_outcomes({7001})[7001]
    assert outcome["status"] == "Rejected" and outcome["success"] is False, outcome


def test_only_signed_malformed_envelopes_are_reported(running: Running) -> None:
    """A 422 for an envelope signed for this worker is reported; one that is not signed (or signed for
    another worker) names a request_idx nobody vouches for, and is not."""
    unsigned = {**running.auth(idx=7102), "signature": ""}
    foreign = running.auth(url=f"http://127.0.0.1:{running.port + 9}", idx=7103)
    for auth in (unsigned, foreign):
        json_error(send(running.port, "/v1/completions", {"auth_data": auth, "payload": None}), 422)
    json_error(send(running.port, "/v1/completions", {"auth_data": running.auth(idx=7101), "payload": None}), 422)
    # Outcomes are posted in the order they were queued: once 7101's is in, the others would be too.
    seen = running.reports.wait_outcomes({7101})
    assert seen[7101]["status"] == "Rejected" and seen[7101]["success"] is False, seen[7101]
    assert not {7102, 7103} & set(seen), {i: seen[i] for i in {7102, 7103} & set(seen)}


def test_a_forged_request_adds_no_load(running: Running, other_key: SigningKey) -> None:
    """The SDK counts a 401's workload (from a payload nobody signed) in the rejected load it reports:
    anyone reaching :3000 could inflate the demand the autoscaler scales on. Forged requests are
    still reported as refused, with no load."""
    start = len(running.reports.statuses())
    huge = {"prompt": "x", "max_tokens": 10**9}  # the SDK's count: 8 units each (the clamp)
    for idx in (7201, 7202, 7203):
        json_error(send(running.port, "/v1/completions", {"auth_data": running.auth(key=other_key, idx=idx),
                                                          "payload": huge}), 401)
    seen = running.reports.wait_outcomes({7201, 7202, 7203})
    assert {seen[i]["status"] for i in (7201, 7202, 7203)} == {"Rejected"}
    # A rejection flags a status report for the SDK's next 1 s tick; the load counted since the last
    # report goes into it. One more report after the outcomes arrived covers every rejection.
    after = len(running.reports.statuses())
    running.reports.wait_status(lambda _s: len(running.reports.statuses()) > after)
    loads = [s.get("rej_load") for s in running.reports.statuses()[start:]]
    assert all(load == 0 for load in loads), f"forged requests counted as rejected load: {loads}"


# --------------------------------------------------------------------------- signatures


def test_a_signature_for_another_worker_is_refused(running: Running) -> None:
    """Validly signed, but for another worker's URL: 401 JSON, reported to the autoscaler as rejected."""
    other = f"http://127.0.0.1:{running.port + 7}"
    result = send(running.port, "/v1/completions", {"auth_data": running.auth(url=other, idx=9001),
                                                    "payload": {"prompt": "x"}})
    json_error(result, 401)
    assert running.reports.wait_outcomes({9001})[9001]["status"] == "Rejected"
    # Logged before the 401, but only at the 1st, 10th, 100th... refusal: in this module the line may
    # name an earlier test's request (the malformed-envelope test's foreign URL); this request's own
    # refusal is the outcome of 9001 above.
    assert "signed for another worker's URL" in running.worker.text


@pytest.mark.parametrize("case", ["empty", "flipped", "other key"])
def test_bad_signatures_are_refused(case: str, running: Running, other_key: SigningKey) -> None:
    auth = running.auth(key=other_key if case == "other key" else None)
    if case == "empty":
        auth["signature"] = ""
    elif case == "flipped":
        raw = bytearray(__import__("base64").b64decode(auth["signature"]))
        raw[10] ^= 0x01
        auth["signature"] = __import__("base64").b64encode(bytes(raw)).decode()
    json_error(send(running.port, "/v1/completions", {"auth_data": auth, "payload": {"prompt": "x"}}), 401)


@pytest.mark.parametrize("case", ["newline and ANSI", "not canonical", "whitespace", "short", "long"])
def test_a_signature_that_is_not_one_is_refused_before_the_sdk_logs_it(case: str, running: Running) -> None:
    """The SDK logs a failed signature as it came (`Signature error ... sig:<it>`): one that is not
    canonical base64 of the key's size is refused before it, so nothing a caller wrote is logged."""
    auth = running.auth(idx=4100)
    good = auth["signature"]
    auth["signature"] = {
        "newline and ANSI": good[:-4] + "\n\x1b[31mINJECTED\x1b[0m",
        "not canonical": good[:-2] + ("B=" if good[-2:] != "B=" else "C="),  # other unused bits
        "whitespace": good[:40] + " " + good[41:],
        "short": good[:-8],
        "long": good + "AAAA",
    }[case]
    json_error(send(running.port, "/v1/completions", {"auth_data": auth, "payload": {"prompt": "x"}}), 401)
    assert "INJECTED" not in running.worker.text
    assert "sig:" + auth["signature"] not in running.worker.text


def test_numbers_the_autoscaler_gets_must_fit_64_bits(running: Running) -> None:
    for field, value in (("reqnum", 2**63), ("request_idx", -(2**63) - 1), ("request_idx", 10**30)):
        auth = running.auth(idx=4200) | {field: value}
        message = json_error(send(running.port, "/v1/completions", {"auth_data": auth, "payload": {}}), 422)
        assert field in message and "64-bit" in message, message
    auth = running.auth(idx=2**63 - 1)  # the largest that fits is served
    status, body, _ = send(running.port, "/v1/completions", {"auth_data": auth, "payload": {"prompt": "x"}})
    assert status == 200, body


def deep_envelope(auth: dict, nested: str) -> bytes:
    """An envelope whose payload holds `nested` (JSON text; json.dumps itself recurses on deep values)."""
    return ('{"auth_data": ' + json.dumps(auth) + ', "payload": {"prompt": "x", "deep": ' + nested + "}}").encode()


def test_json_nested_deeper_than_64_is_refused_before_any_parse(running: Running) -> None:
    """A depth of ~1000 passed the guard and the SDK's own parse raised RecursionError (500)."""
    for depth in (65, 900, 1500):
        payload = "[" * depth + "]" * depth
        body = deep_envelope(running.auth(idx=4300), payload)
        result = request(running.port, "/v1/completions", body)
        message = json_error((result[0], json.loads(result[1]), result[2]), 422)
        assert "64 levels" in message, message
    # 64 levels (the envelope's own object and payload count) are served
    inner = "[" * 62 + "]" * 62
    body = deep_envelope(running.auth(idx=4301), inner)
    result = request(running.port, "/v1/completions", body)
    assert result[0] == 200, result
    assert "RecursionError" not in running.worker.text and "Traceback" not in running.worker.text


def test_the_sdk_accepts_a_captured_envelope_with_another_payload(running: Running) -> None:
    """What the worker cannot fix (docs/security.md): only the URL is signed, so one captured auth_data
    serves any payload, any number of times. If this starts failing, the SDK signs more: update the
    threat model."""
    captured = running.auth(idx=31)
    for prompt in ("first", "replayed with another payload", "and again"):
        status, body, _ = send(running.port, "/v1/completions", {"auth_data": captured, "payload": {"prompt": prompt}})
        assert status == 200 and body["choices"][0]["text"] == f"echo:{prompt}", body


# --------------------------------------------------------------------------- envelopes


def _signed_with(running: Running, **fields: Any) -> bytes:
    return json.dumps({"auth_data": {**running.auth(), **fields}, "payload": {"prompt": "x"}}).encode()


def test_malformed_envelopes_are_422_json(running: Running) -> None:
    """Every shape that gives the SDK a 500 with a traceback (docs/sdk.md and more) -> 422 JSON."""
    bodies = {
        "auth_data null": b'{"auth_data": null, "payload": {}}',
        "bare number": b"5",
        "null": b"null",
        "true": b"true",
        "invalid utf-8": b'{"auth_data": {"url": "\xff\xfe"}, "payload": {}}',
        "reqnum [1] (signed)": _signed_with(running, reqnum=[1]),
        "request_idx object (signed)": _signed_with(running, request_idx={"a": 1}),
        "reqnum string (signed)": _signed_with(running, reqnum="5"),
        "auth_data magic string": b'{"auth_data": "costendpointreqnumrequest_idxsignatureurl", "payload": {}}',
        "auth_data number": b'{"auth_data": 7, "payload": {}}',
        "session_id list": json.dumps({"auth_data": running.auth(), "payload": {}, "session_id": [1]}).encode(),
        "deep nesting": b"[" * 30000 + b"]" * 30000,
        "not json": b"{not json",
        "empty": b"",
    }
    for name, body in bodies.items():
        result = request(running.port, "/v1/completions", body)
        decoded = (result[0], json.loads(result[1]) if result[1].startswith(b"{") else result[1], result[2])
        try:
            json_error(decoded, 422)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None
    result = request(running.port, "/v1/completions", _signed_with(running),
                     headers={"Content-Type": "application/json; charset=no-such-charset"})
    json_error((result[0], json.loads(result[1]), result[2]), 422)
    # UTF-16, declared, is JSON too: decoded, and its envelope judged (unsigned here: 401)
    result = request(running.port, "/v1/completions", json.dumps({"auth_data": running.auth()}).encode("utf-16"),
                     headers={"Content-Type": "application/json; charset=utf-16"})
    assert result[0] == 422 and b"charset" not in result[1], result
    out = running.worker.text
    assert "Traceback" not in out and "Error handling request" not in out


CHARSETS_REFUSED = ("punycode", "idna", "utf-7", "latin-1", "cp500", "rot13", "hex")


def test_a_body_in_a_charset_json_is_not_written_in_is_refused_before_decoding(harness: Harness) -> None:
    """120 KB declared punycode took 4-9 s of the event loop to decode (quadratic; this 600 KB one would
    take minutes): each charset JSON is not written in is refused unread, with the default body limit."""
    served = secured(harness, start_engine(harness))
    served.worker.wait_for(SDK_READY, timeout=60)  # before it, not_ready answers 503 unread
    body = b"a" * 600_000 + b"-" + b"b" * 10
    for charset in CHARSETS_REFUSED:
        started = time.monotonic()
        result = request(served.port, "/v1/completions", body,
                         headers={"Content-Type": f"application/json; charset={charset}"})
        elapsed = time.monotonic() - started
        message = json_error((result[0], json.loads(result[1]), result[2]), 422)
        assert "charset" in message and "UTF-8" in message, (charset, message)
        assert elapsed < 30.0, f"{charset}: {elapsed:.2f} s"


# --------------------------------------------------------------------------- routes


def test_self_update_is_refused(running: Running) -> None:
    """vastai lets an empty MASTER_TOKEN in and writes /.force_update: the worker answers 403."""
    marker = Path("/.force_update")
    before = marker.stat().st_mtime_ns if marker.exists() else None
    for headers in ({}, {"Authorization": "Bearer "}, {"Authorization": ""}):
        json_error(send(running.port, "/pyworker/update", {}, headers=headers), 403)
    assert (marker.stat().st_mtime_ns if marker.exists() else None) == before
    # aiohttp writes an access line after the answer is sent: wait for it (only this test posts there
    # without a query string).
    running.worker.wait_for('"POST /pyworker/update HTTP/1.1" 403', timeout=10)


class Listener:
    """A loopback HTTP server that records every request it gets (a caller-chosen callback target)."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                outer.hits.append(self.path)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_sessions_are_off_by_default(running: Running) -> None:
    """No /session/* route works, on either listener, and no callback is ever made."""
    target = Listener()
    try:
        create = {"auth_data": {**running.auth(), "cost": 5}, "payload": {
            "lifetime": 5, "on_close_route": f"http://127.0.0.1:{target.port}/ssrf"}}
        json_error(send(running.port, "/session/create", create), 404)
        for path in ("/session/end", "/session/get", "/session/health"):
            json_error(send(running.port, path, {"session_id": "x", "session_auth": running.auth()}), 404)
        json_error(send(running.port + 1, "/session/end", {"session_id": "x", "session_auth": running.auth()}), 404)
        time.sleep(1)
        assert target.hits == []
    finally:
        target.close()
    running.worker.wait_for('"POST /session/create HTTP/1.1" 404', timeout=10)  # written after the answer


def _listening(port: int) -> set[str]:
    """The local addresses a TCP listener on `port` is bound to (from /proc/net/tcp{,6})."""
    found = set()
    for name, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                raw = bytes.fromhex(address)
                if width == 8:
                    found.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
                else:
                    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                    found.add(socket.inet_ntop(socket.AF_INET6, words))
    return found


def test_what_listens_where(running: Running) -> None:
    """WORKER_PORT on every interface (the platform maps it); the SDK's second listener on loopback."""
    everywhere = {"0.0.0.0", "::"}  # noqa: S104 (what the SDK binds, read back)
    assert _listening(running.port) <= everywhere and "0.0.0.0" in _listening(running.port)  # noqa: S104
    assert _listening(running.port + 1) == {"127.0.0.1"}


# --------------------------------------------------------------------------- limits


def test_a_body_over_the_limit_is_413(running: Running) -> None:
    big = json.dumps({"auth_data": running.auth(), "payload": {"prompt": "x" * 70000}}).encode()
    json_error((lambda r: (r[0], json.loads(r[1]), r[2]))(request(running.port, "/v1/completions", big)), 413)
    # without a Content-Length (chunked): aiohttp's own limit, answered as JSON too
    conn = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30)
    try:
        conn.request("POST", "/v1/completions", body=iter([big[:40000], big[40000:]]),
                     headers={"Content-Type": "application/json"}, encode_chunked=True)
        response = conn.getresponse()
        json_error((response.status, json.loads(response.read()), {k.lower(): v for k, v in response.getheaders()}),
                   413)
    finally:
        conn.close()
    fits = {"auth_data": running.auth(idx=41), "payload": {"prompt": "y" * 60000}}
    assert send(running.port, "/v1/completions", fits)[0] == 200


def test_a_slow_body_is_408(running: Running) -> None:
    with socket.create_connection(("127.0.0.1", running.port), timeout=15) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"auth")
        started = time.monotonic()
        answer = sock.recv(4096)
        elapsed = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b'"error"' in answer and 1.5 < elapsed < 10


@pytest.mark.parametrize("sent", [b"", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"])
def test_slow_or_incomplete_headers_time_out(sent: bytes, running: Running) -> None:
    with socket.create_connection(("127.0.0.1", running.port), timeout=15) as sock:
        sock.sendall(sent)
        started = time.monotonic()
        assert sock.recv(4096) == b""  # closed by the worker
        elapsed = time.monotonic() - started
    assert 1.0 < elapsed < 10


def test_an_engine_that_never_answers_is_504(running: Running) -> None:
    started = time.monotonic()
    result = send(running.port, "/v1/completions", {"auth_data": running.auth(idx=51), "payload": {"prompt": "hang"}})
    assert "did not answer in time" in json_error(result, 504)
    assert time.monotonic() - started < 15


def test_an_engine_that_goes_silent_mid_answer_is_504(running: Running) -> None:
    result = send(running.port, "/v1/completions", {"auth_data": running.auth(idx=52),
                                                    "payload": {"prompt": "slowbody 5"}})
    json_error(result, 504)


def test_a_long_stream_that_keeps_sending_is_never_cut(running: Running) -> None:
    """5 chunks 0.8 s apart: 4 s in all, twice the idle timeout, but never 2 s of silence."""
    status, body, headers = request(running.port, "/v1/completions", json.dumps(
        {"auth_data": running.auth(idx=53), "payload": {"prompt": "trickle 5 0.8", "stream": True}}).encode())
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert all(f"part{i}".encode() in body for i in range(5)), body


# --------------------------------------------------------------------------- logs


def test_query_strings_never_reach_the_log(running: Running) -> None:
    secret = "api-key-7f3a9c"  # noqa: S105 (a test value)
    status, _, _ = send(running.port, f"/v1/completions?api_key={secret}",
                        {"auth_data": running.auth(idx=61), "payload": {"prompt": "q"}})
    assert status == 200
    json_error(send(running.port, f"/pyworker/update?token={secret}", {}), 403)
    # Wait for this test's own last line (access lines are written after the answer), then read.
    running.worker.wait_for('"POST /pyworker/update?<redacted> HTTP/1.1" 403', timeout=10)
    out = running.worker.text
    assert secret not in out


# --------------------------------------------------------------------------- workers of their own


def test_a_key_served_late_is_picked_up_without_a_restart(harness: Harness, key: SigningKey) -> None:
    """The control plane's key is unavailable at boot for longer than the SDK's 5 tries: the worker
    keeps asking (bounded backoff), reports itself loaded only once it has the key, then serves."""
    reports = harness.report_server(key.pem, key_available=False)  # withholds the key until told
    served = secured(harness, start_engine(harness), reports, BAKERY_PUBKEY_BACKOFF_MAX="1")
    worker, port = served.worker, served.port
    worker.wait_for(SDK_READY, timeout=60)
    deadline = time.monotonic() + 30
    while reports.pubkey_gets < 8 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert reports.pubkey_gets >= 8  # beyond the SDK's own 5
    assert not [s for s in reports.statuses() if s.get("loadtime", 0) > 0 and s.get("max_perf", 0) > 0]
    assert all(not s.get("error_msg") for s in reports.statuses()), reports.statuses()[-1]
    auth = {"cost": "8", "endpoint": "t", "reqnum": 1, "request_idx": 1,
            "signature": key.sign(f"http://127.0.0.1:{port}"), "url": f"http://127.0.0.1:{port}"}
    early = send(port, "/v1/completions", {"auth_data": auth, "payload": {"prompt": "k"}})
    json_error(early, 503)
    reports.key_available = True
    reports.wait_status(lambda s: s.get("loadtime", 0) > 0 and s.get("max_perf", 0) > 0, timeout=20)
    status, body, _ = send(port, "/v1/completions", {"auth_data": auth, "payload": {"prompt": "k"}})
    assert status == 200 and body["choices"][0]["text"] == "echo:k", body
    out = worker.text
    assert out.count("the public key is not available from") == 1  # once per phase, not per try
    assert out.count("public key loaded from") == 1
    assert "Failed to fetch pubkey" not in out and "pubkey fetch failed" not in out


def test_sessions_when_turned_on(harness: Harness, key: SigningKey) -> None:
    """BAKERY_SESSIONS=true: signed like any request, lifetime capped, the close callback only to
    REPORT_ADDR's host (here 127.0.0.1: `localhost` is another name, refused)."""
    reports = harness.report_server(key.pem)  # serves the module's platform key (not the session's)
    served = secured(harness, start_engine(harness), reports, BAKERY_SESSIONS="true",
                     BAKERY_SESSION_MAX_LIFETIME="30")
    worker, port = served.worker, served.port
    worker.wait_for(SDK_READY, timeout=60)
    own = f"http://127.0.0.1:{port}"
    signed = {"cost": 5, "endpoint": "t", "reqnum": 1, "request_idx": 1, "signature": key.sign(own), "url": own}
    callback = f"{reports.url}/session-closed"

    def create(auth: dict, **payload: Any) -> tuple[int, Any, dict[str, str]]:
        return send(port, "/session/create", {"auth_data": auth, "payload": payload})

    json_error(create({**signed, "signature": ""}, lifetime=5), 401)
    json_error(create({**signed, "url": "http://127.0.0.1:1", "signature": key.sign("http://127.0.0.1:1")},
                      lifetime=5), 401)
    json_error(create(signed, lifetime=31), 422)
    json_error(create(signed, lifetime=5, on_close_route=f"http://localhost:{reports.url.rsplit(':', 1)[1]}/x"),
               422)
    json_error(create(signed, lifetime=5, on_close_route="http://169.254.169.254/latest"), 422)
    json_error(create({**signed, "cost": "5"}, lifetime=5), 422)
    status, body, _ = create(signed, lifetime=5, on_close_route=callback, on_close_payload={"k": 1})
    assert status == 201, body
    session = body["session_id"]
    json_error(send(port, "/session/end", {"session_id": session, "session_auth": {**signed, "signature": ""}}),
               401)
    status, body, _ = send(port, "/session/end", {"session_id": session, "session_auth": signed})
    assert status == 200 and body["ended"] is True, body
    deadline = time.monotonic() + 10
    while not [p for p, _ in reports.reports if p == "/session-closed"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [d for p, d in reports.reports if p == "/session-closed"] == [{"k": 1, "session_id": session}]
    worker.wait_for('"POST /session/create HTTP/1.1" 201', timeout=10)  # 2xx session lines are kept


@pytest.mark.parametrize(("name", "raw"), [("UNSECURED", "ture"), ("UNSECURED", "on"),
                                           ("BAKERY_MAX_BODY_BYTES", "16MiB"), ("BAKERY_SESSIONS", "maybe"),
                                           ("BAKERY_ALLOW_PRIVATE_REFERENCES", "10.0.0.0/8,http://minio:9000"),
                                           ("BAKERY_REFERENCE_RESOLVE_TIMEOUT", "soon"),
                                           ("BAKERY_MAX_REFERENCES", "0")])
def test_a_bad_variable_stops_the_worker_with_exit_2(name: str, raw: str, harness: Harness) -> None:
    worker = harness.worker("llama", reports="http://127.0.0.1:9", MODEL_LOG=str(harness.tmp / "x.log"),
                            **{name: raw}).worker
    assert worker.wait_exit(30) == 2
    lines = [line for line in worker.text.splitlines() if line.startswith("bakery-worker: error:")]
    assert len(lines) == 1 and lines[0].startswith(f"bakery-worker: error: {name}={raw!r} is "), worker.text
    assert "Traceback" not in worker.text


def test_real_llama_signed_chat(harness: Harness, llama_python: Path, smollm2: Path, key: SigningKey) -> None:
    """The real llama.cpp behind the guarded worker, secured: a signed chat gets the model's answer."""
    reports = harness.report_server(key.pem)  # serves the module's platform key (not the session's)
    engine = harness.llama(llama_python, smollm2)
    served, log = secured(harness, engine, reports), engine.log
    worker, port = served.worker, served.port
    worker.wait_for(SDK_READY, timeout=180)
    own = f"http://127.0.0.1:{port}"
    auth = {"cost": "8", "endpoint": "t", "reqnum": 1, "request_idx": 1, "signature": key.sign(own), "url": own}
    status, body, _ = send(port, "/v1/chat/completions", {"auth_data": auth, "payload": {
        "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}}, timeout=120)
    assert status == 200, body
    assert body["choices"][0]["message"]["content"].strip(), body
    assert os.path.exists(log)


def test_no_part_of_the_master_token_is_logged(harness: Harness) -> None:
    """The SDK's status block prints MASTER_TOKEN's first 7 characters as `mtoken`: redacted."""
    token = "mtk-" + "7Q2x9Lw4Vb8Nc1Ze"
    served = secured(harness, start_engine(harness), MASTER_TOKEN=token)
    served.worker.wait_for("Worker Status", timeout=60)
    served.worker.wait_for('"mtoken": "<redacted>"', timeout=30)
    out = served.worker.text
    assert token[:5] not in out, [line for line in out.splitlines() if "mtoken" in line]
