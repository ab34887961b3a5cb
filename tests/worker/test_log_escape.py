"""Nothing a caller sends is written into the worker's log raw (logs/log_escape.py).

The rule on the host (escapes, bounds, the SDK's wordings, tracebacks), then the real SDK: one
secured worker, every per-request line kept (BAKERY_LOG_REQUESTS=true) and sessions on, gets
requests whose path, headers, auth_data.url, payload, session callback and engine log line carry a
newline, a carriage return, `ESC [2J`, U+2028, a bidi override and a 100 KB value; no line of its
output holds any of them raw, none starts a line of its own, and every line is bounded.
"""

from __future__ import annotations

import logging
import socket
import sys
import time
from pathlib import Path

import pytest

from logs import log_escape
from tests.worker.helpers import HERE, SDK_READY, Harness, SigningKey, make_signing_key, secured, send

# What a caller puts in every value: each would start a forged line, clear a terminal, or reorder text.
HOSTILE = "\nFORGED-LINE \r\x1b[2J\u2028\u2029\u202eFORGED-BIDI\x85\x07"
RAW = ("\r", "\x1b", "\u2028", "\u2029", "\u202e", "\x85", "\x07")
HUGE = "H" * 100_000
# A line of the worker's output: the SDK's prefix ("2026-01-01 00:00:00[DEBUG] "), one message.
LINE_BOUND = log_escape.MESSAGE_LIMIT + 200


# --------------------------------------------------------------------------- the rule


def _record(msg: str, *args: object, name: str = "bakery.test", **extra: object) -> logging.LogRecord:
    record = logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args or None, None)
    record.__dict__.update(extra)
    return record


def _cut(value: str) -> str:
    """How a long value is shown: its first VALUE_LIMIT characters escaped, and its length."""
    return log_escape.escape(value[:log_escape.VALUE_LIMIT]) + f"...[{len(value)} characters, cut]"


def _shown(record: logging.LogRecord) -> str:
    log_escape.Escaper().filter(record)
    return logging.Formatter("%(message)s").format(record)


def test_control_characters_are_escaped() -> None:
    shown = _shown(_record("got " + HOSTILE))
    assert shown == ("got \\nFORGED-LINE \\r\\x1b[2J\\u2028\\u2029\\u202eFORGED-BIDI\\x85\\x07")
    assert "\n" not in shown and not any(c in shown for c in RAW)
    assert _shown(_record("a\\nb C:\\path")) == "a\\nb C:\\path"  # backslashes are text, left alone
    assert _shown(_record("\ud800 lone surrogate")) == "\\ud800 lone surrogate"


def test_arguments_are_escaped_and_cut_the_format_is_kept() -> None:
    shown = _shown(_record("refused %d (last: %s; this worker is %r)", 3, HOSTILE + HUGE, "http://w"))
    assert shown == f"refused 3 (last: {_cut(HOSTILE + HUGE)}; this worker is 'http://w')"
    assert shown.startswith("refused 3 (last: \\nFORGED-LINE \\r\\x1b[2J") and "\n" not in shown


def test_a_record_is_escaped_once() -> None:
    record = _record("x %s", "\x1b")
    escaper = log_escape.Escaper()
    escaper.filter(record)
    escaper.filter(record)
    assert record.getMessage() == "x \\x1b"


def test_every_message_is_bounded() -> None:
    shown = _shown(_record("no known wording " + HUGE))
    assert len(shown) <= log_escape.MESSAGE_LIMIT + 40 and shown.endswith("characters, cut]")


def test_the_sdks_blocks_keep_their_newlines_and_only_theirs() -> None:
    block = "\n" + "#" * 20 + " Worker Status " + "#" * 20 + '\n{\n  "url": "http://w\\u2028"\n}\n' + "#" * 55
    sdk = "/opt/bakery/venv/lib/python3.11/site-packages/vastai/serverless/server/lib/metrics.py"
    assert _shown(_record(block, name=sdk)) == block
    assert "\n" not in _shown(_record(block, name="bakery.test"))  # the same text from elsewhere is one line
    assert "\n" not in _shown(_record(block + HOSTILE, name="aiohttp.access"))


@pytest.mark.parametrize("message", [
    "on_close POST failed: route={v} status=404 body={v}",
    "on_close POST exception: route={v} error={v}",
    "posting to endpoint: '/v1/completions', payload keys: {v}",
    "posting multipart to endpoint: '{v}', fields: {v}",
    "Request 7 errored: {v}",
    "Request 3 in Session 17 errored: {v}",
    "Info from model logs: {v}",
    "Got log line indicating error: {v}",
    "Signature error: signature verification failed, sig:{v}, message: {v}",
    "Exception in main handler loop {v}",
])
def test_each_value_of_the_sdks_lines_is_cut_and_the_rest_kept(message: str) -> None:
    """The SDK formats these lines itself (f-strings): each value is found by its wording and cut, so
    one huge value does not push the rest of the line (a status, the error) out of the bound."""
    shown = _shown(_record(message.format(v=HOSTILE + HUGE)))
    assert shown == message.format(v=_cut(HOSTILE + HUGE)), shown[-300:]


def test_an_access_line_cuts_each_value_and_keeps_the_status() -> None:
    line = f'127.0.0.1 [t] "POST /v1/{HUGE} HTTP/1.1" 404 14 "{HOSTILE}" "{HUGE}"'
    shown = _shown(_record(line, name="aiohttp.access", first_request_line=f"POST /v1/{HUGE} HTTP/1.1",
                           request_header={"Referer": HOSTILE, "User-Agent": HUGE}, response_status=404))
    request_line, referer = _cut("POST /v1/" + HUGE + " HTTP/1.1"), log_escape.escape(HOSTILE)
    expected = f'127.0.0.1 [t] "{request_line}" 404 14 "{referer}" "{_cut(HUGE)}"'
    assert shown == expected, shown[-300:]


def test_an_exceptions_message_is_one_bounded_line() -> None:
    try:
        try:
            raise KeyError(HOSTILE)
        except KeyError as inner:
            raise ValueError("bad value " + HOSTILE + HUGE) from inner
    except ValueError:
        record = logging.LogRecord("aiohttp.web", logging.ERROR, __file__, 1, "Error handling request", None,
                                   sys.exc_info())
    shown = _shown(record)
    lines = shown.splitlines()
    assert lines[0] == "Error handling request" and lines[1] == "Traceback (most recent call last):"
    assert not [line for line in lines if line.startswith("FORGED")], lines
    assert not any(c in shown for c in RAW) and max(map(len, lines)) < log_escape.VALUE_LIMIT + 100
    assert any(line.startswith("ValueError: bad value \\nFORGED-LINE") for line in lines), lines[-3:]


# --------------------------------------------------------------------------- the real SDK


@pytest.fixture(scope="module")
def platform_key(worker_python: Path) -> SigningKey:
    return make_signing_key(worker_python)


def _raw(port: int, data: bytes) -> bytes:
    """Send `data` as it is (no client library would send these bytes) and read the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        try:
            while len(chunks) < 1000:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except TimeoutError:
            pass
        return b"".join(chunks)


@pytest.mark.slow
def test_no_caller_text_reaches_the_log_raw(harness: Harness, platform_key: SigningKey) -> None:
    reports = harness.report_server(platform_key.pem)
    slot = harness.slot("engine")
    engine = harness.engine([sys.executable, str(HERE / "guard_engine.py"), "--port", str(slot.port),
                             "--log", str(slot.log)], slot, output=harness.tmp / "engine.out")
    # The engine's lines that name a served request are logged by the SDK as information: a prompt
    # reaches the worker's log through the engine's log too.
    served = secured(harness, engine, reports, BAKERY_LOG_REQUESTS="true", BAKERY_SESSIONS="true",
                     MODEL_INFO_LOG_MSGS="served /v1/completions")
    worker, port = served.worker, served.port
    worker.wait_for(SDK_READY, timeout=60)
    own = served.url
    signed = {"cost": 5, "endpoint": "t", "reqnum": 1, "request_idx": 1, "signature": platform_key.sign(own),
              "url": own}
    # Header values as aiohttp takes them (it refuses control characters: 400, tried raw below)
    headers = {"User-Agent": "agent\u2028FORGED-LINE\u2029\u202eFORGED-BIDI\x85" + "U" * 7000,
               "Referer": "\u2028\u202e\x85" + "R" * 7000}
    # 1. a signed request whose payload keys and prompt are hostile and huge (per-request lines, the
    # engine's log line), with hostile headers
    payload = {"prompt": "\x1b[2J\u2028\u202eFORGED-BIDI" + HOSTILE + "x" * 1000, HOSTILE: 1, HUGE: 2}
    status, body, _ = send(port, "/v1/completions", {"auth_data": {**signed, "request_idx": 11}, "payload": payload},
                           headers={k: v.encode("utf-8").decode("latin-1") for k, v in headers.items()})
    assert status == 200, body
    # 2. auth_data.url hostile and long (signed for it: refused as another worker's URL, and logged
    # bounded). Beyond signed_first's 16 KiB a URL is not read at all (401 as unsigned, never logged).
    url = own + "/" + HOSTILE + HUGE[:8000]
    status, _, _ = send(port, "/v1/completions", {"auth_data": {**signed, "url": url,
                                                                "signature": platform_key.sign(url)},
                                                  "payload": {"prompt": "x"}})
    assert status == 401
    # 3. a path and query, percent-encoded and raw (bytes no client sends); a huge path
    for target in (b"/v1/%0AFORGED-LINE%0D%1B%5B2J%E2%80%A8%E2%80%AE", b"/v1/\xe2\x80\xa8\xe2\x80\xaeFORGED-BIDI",
                   b"/v1/x\x1b[2J", b"/v1/completions?q=\n", b"/v1/" + b"P" * 7000 + b"%0A",
                   b"/v1/" + b"P" * 100_000):
        _raw(port, b"POST " + target + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
    for header in (b"User-Agent: a\xe2\x80\xa8\x1b[2Jb", b"Referer: \xc2\x85\x07", b"X-Big: " + b"B" * 100_000,
                   b"User-Agent: \xe2\x80\xa8\xe2\x80\xaeFORGED-BIDI\xc2\x85" + b"U" * 7000):
        _raw(port, b"GET /v1/x HTTP/1.1\r\nHost: x\r\n" + header + b"\r\nConnection: close\r\n\r\n")
    # 4. a session whose close callback URL is hostile and huge: the SDK logs the route it failed to call
    route = f"{reports.url}/closed/{HOSTILE}{HUGE}"
    status, body, _ = send(port, "/session/create", {"auth_data": signed, "payload": {"lifetime": 5,
                                                                                     "on_close_route": route}})
    assert status == 201, body
    status, body, _ = send(port, "/session/end", {"session_id": body["session_id"], "session_auth": signed})
    assert status == 200, body
    worker.wait_for("on_close POST", timeout=15)
    worker.wait_for("Info from model logs: served /v1/completions", timeout=15)
    time.sleep(1.5)  # the access lines of the last answers, and a status report
    out = worker.output.read_bytes().decode("utf-8", "surrogateescape")
    lines = out.split("\n")
    forged = [line[:120] for line in lines if line.startswith(("FORGED", "\rFORGED"))]
    raw = {repr(c): sum(line.count(c) for line in lines) for c in RAW if c in out}
    long = [(len(line), line[:160]) for line in lines if len(line) > LINE_BOUND]
    assert not forged and not raw and not long, (forged, raw, long)
    assert "FORGED-LINE" in out and "\\x1b[2J" in out  # the values are there, escaped
    for kept in ('"POST /v1/completions HTTP/1.1" 200', "Worker Status", "signed for another worker's URL",
                 '"POST /session/end HTTP/1.1" 200'):
        assert kept in out, kept
