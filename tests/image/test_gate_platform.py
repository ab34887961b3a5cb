"""The gate, as the platform sees the worker: port 3000 serves only what the control plane signed.

Each image is launched as the platform launches it (no UNSECURED; REPORT_ADDR at the control-plane
stand-in of tests/controlplane, running inside the container on 127.0.0.1), and probed from inside
the container: signed requests, forged and malformed ones, and what reaches the control plane.
Each test is one named check; build.py reports the names of the ones that fail.
"""

from __future__ import annotations

import base64
import http.client
import json
import threading
import time
import uuid
from typing import Any

import pytest

from bakery.spec.engine_facts import facts
from tests.image import stages
from tests.image.conftest import READY_TIMEOUT, SDK_PUBKEY_TRIES, ImageUnderTest, SideLaunches
from tests.image.launch import (
    CLIENT,
    CONTROLPLANE_ADDR,
    SEND_TIMEOUT,
    WORKER_PYTHON,
    Launched,
    is_ready_report,
)

COMPLETION = {"prompt": "The three primary colours are", "max_tokens": 8, "temperature": 0}
CHAT = {"messages": [{"role": "user", "content": "Say hello in one line."}], "max_tokens": 8, "temperature": 0}
# A URL the platform would sign for some other worker (TEST-NET-3: a string here, never contacted).
FOREIGN_URL = "http://203.0.113.7:41234"
BODY_LIMIT = 16 * 1024 * 1024  # the worker's default request-body limit
SESSION_CALLBACK = f"{CONTROLPLANE_ADDR}/session-callback/"  # the stand-in records any call made here
REPORT_WAIT = 30  # the SDK sends request outcomes every 1 s, retrying 3 times 2 s apart


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def answer_text(result: dict[str, Any]) -> str:
    """The generated text of a completion or chat answer probed through the worker ('' if none)."""
    body = result.get("json")
    if not isinstance(body, dict):
        return ""
    choice = (body.get("choices") or [{}])[0]
    return str(choice.get("text") or (choice.get("message") or {}).get("content") or "")


def _ready(launched: Launched) -> None:
    assert launched.ready(READY_TIMEOUT), \
        f"the worker never reported ready:\n{launched.reports()[-3:]}\n{launched.logs()[-2000:]}"


def _summary(results: dict[str, dict[str, Any]]) -> str:
    return "\n".join(f"  {name}: {r.get('status')} {r.get('error') or ''} {str(r.get('body'))[:200]!r}"
                     for name, r in results.items())


# ---- the key and the reports (no engine needed) -------------------------------------------------


@pytest.mark.resolution
def test_worker_fetched_public_key(serverless: Launched) -> None:
    # The SDK's one GET /pubkey/ at start; without the key every signed request is refused.
    def fetched() -> bool:
        return any(r.get("status") == 200 for r in serverless.records("/pubkey/"))

    assert serverless.wait_for(fetched, 60, 0.5), \
        f"the worker never fetched the key from the control plane: {serverless.records('/pubkey/')}\n" \
        f"{serverless.logs()[-2000:]}"
    failed = [r.get("error_msg") for r in serverless.reports() if "key" in str(r.get("error_msg") or "").lower()]
    assert not failed, f"the worker reported a key failure although the key was served: {failed}"


@pytest.mark.resolution
def test_only_worker_port_listens_outside(serverless: Launched) -> None:
    # Nothing but :3000 is reachable from outside the container: the engine, the SDK's second
    # listener (WORKER_HTTP_PORT, 3001) and the stand-in listen on loopback only.
    def listeners() -> list[tuple[str, int]]:
        out = []
        for sock in serverless.host.socket.get_listening_sockets():
            if sock.startswith("tcp"):
                address, _, port = sock.split("://", 1)[1].rpartition(":")
                out.append((address.strip("[]"), int(port)))
        return out

    assert serverless.wait_for(lambda: {3000, 3001} <= {port for _, port in listeners()}, 60, 0.5), \
        f"the worker's listeners (3000, 3001) never appeared: {listeners()}\n{serverless.logs()[-2000:]}"
    outside = sorted({(a, p) for a, p in listeners() if not (a.startswith("127.") or a == "::1") and p != 3000})
    assert not outside, f"listening on a non-loopback address besides :3000: {outside}"


# ---- the signed path (local bases: the engine answers) ------------------------------------------


@pytest.mark.serve
def test_signed_completion_and_chat_through_worker(serverless: Launched) -> None:
    _ready(serverless)
    results = serverless.probe([
        {"name": "completion", "route": "/v1/completions", "payload": COMPLETION, "request_idx": 101},
        {"name": "chat", "route": "/v1/chat/completions", "payload": CHAT, "request_idx": 102},
    ])
    for name, result in results.items():
        assert result["status"] == 200, f"signed {name} was not served:\n{_summary(results)}"
        assert answer_text(result).strip(), f"signed {name}: no generated text in {result['body'][:500]!r}"
    assert results["completion"]["json"].get("object") == "text_completion", results["completion"]["body"][:300]
    assert results["chat"]["json"].get("object") == "chat.completion", results["chat"]["body"][:300]


@pytest.mark.serve
def test_time_to_ready_by_stage(image: ImageUnderTest, serverless: Launched) -> None:
    # From `docker run` to the first signed answer, split by what the launch's own logs show
    # (tests/image/stages.py, docs/cold-start.md): every stage is seen, the engine's load stages
    # wherever the spec bakes their lines, and the stages add up to the total.
    _ready(serverless)
    served = serverless.probe([{"name": "stages", "payload": COMPLETION, "request_idx": 901}])["stages"]
    assert served["status"] == 200, f"a signed request after ready was not served: {_summary({'stages': served})}"
    result = stages.split(stages.boundaries(serverless, facts(image.spec).program, is_ready_report),
                          f"{image.engine}-serverless")
    baked = image.expected_env
    expected = {name for name, _ in stages.BOUNDARIES} - {
        stage for stage, var in (("load_begins", "BAKERY_LOAD_BEGIN_LOG_MSGS"),
                                 ("weights_loaded", "BAKERY_WEIGHTS_LOADED_LOG_MSGS")) if var not in baked}
    assert not expected & set(result["missing"]), f"stages not seen: {stages.describe(result)}"
    assert abs(result["sum"] - result["total"]) <= 0.05 * result["total"], stages.describe(result)
    print(stages.describe(result))


@pytest.mark.serve
def test_bad_signatures_refused_401(serverless: Launched) -> None:
    _ready(serverless)
    results = serverless.probe([
        {"name": "control: valid", "payload": COMPLETION, "request_idx": 201},
        {"name": "empty signature", "signature": "empty", "request_idx": 202},
        {"name": "another key", "signature": "other-key", "request_idx": 203},
        {"name": "flipped bit", "signature": "flipped", "request_idx": 204},
        {"name": "another worker's URL", "sign_url": FOREIGN_URL, "request_idx": 205},
        {"name": "chat, another key", "route": "/v1/chat/completions", "payload": CHAT, "signature": "other-key",
         "request_idx": 206},
    ])
    assert results.pop("control: valid")["status"] == 200, "the valid control request was not served"
    wrong = {name: r for name, r in results.items() if r["status"] != 401}
    assert not wrong, f"forged signatures not refused with 401:\n{_summary(wrong)}"


@pytest.mark.serve
def test_malformed_envelopes_refused_422(serverless: Launched) -> None:
    _ready(serverless)
    # The shapes the SDK turns into a 500 with a traceback (docs/sdk.md "The signed path"), plus
    # their kin. The reqnum cases are signed: the SDK reaches reqnum only after a valid signature.
    results = serverless.probe([
        {"name": "auth_data null", "envelope": {"auth_data": None}},
        {"name": "bare number body", "raw_b64": _b64(b"5")},
        {"name": "JSON null body", "raw_b64": _b64(b"null")},
        {"name": "invalid UTF-8", "raw_b64": _b64(b'{"auth_data": "\xff\xfe", "payload": {}}')},
        {"name": "reqnum [1] (signed)", "auth": {"reqnum": [1]}},
        {"name": "reqnum string (signed)", "auth": {"reqnum": "7"}},
        {"name": "payload null (signed)", "envelope": {"payload": None}},
    ])
    wrong = {name: r for name, r in results.items() if r["status"] != 422 or not isinstance(r["json"], dict)}
    assert not wrong, f"malformed envelopes not answered 422 with a JSON error:\n{_summary(wrong)}"


@pytest.mark.serve
def test_request_outcomes_reported(serverless: Launched) -> None:
    # Each request the worker served or refused reaches /delete_requests/ with its outcome, so the
    # autoscaler stops counting it. A body whose auth_data cannot be read names no request: nothing
    # may be reported for it as served.
    _ready(serverless)
    served = {301: "/v1/completions", 302: "/v1/chat/completions"}
    refused = {303: "empty", 304: "other-key", 305: "flipped", 307: "foreign"}
    cases = [{"name": f"served {idx}", "route": route, "payload": COMPLETION if "chat" not in route else CHAT,
              "request_idx": idx} for idx, route in served.items()]
    cases += [{"name": f"refused {idx}", "request_idx": idx,
               **({"sign_url": FOREIGN_URL} if mode == "foreign" else {"signature": mode})}
              for idx, mode in refused.items()]
    cases.append({"name": "unreadable 306", "envelope": {"auth_data": {"request_idx": 306}}})
    # A signed envelope the worker refuses itself (its payload is unusable): reported like the SDK's
    # own refusals. The same unsigned names a request nobody vouches for: not reported.
    cases.append({"name": "malformed signed 308", "request_idx": 308, "envelope": {"payload": None}})
    cases.append({"name": "malformed unsigned 309", "request_idx": 309, "signature": "empty",
                  "envelope": {"payload": None}})
    results = serverless.probe(cases)
    wrong = {n: r for n, r in results.items() if r["status"] != {"served": 200, "refused": 401}.get(n.split()[0], 422)}
    assert not wrong, f"requests not answered as expected (served 200, refused 401, unreadable 422):\n{_summary(wrong)}"
    refused[308] = "malformed"

    def outcomes() -> dict[int, dict[str, Any]]:
        return {r["request_idx"]: r for r in serverless.deleted_requests() if isinstance(r.get("request_idx"), int)}

    wanted = set(served) | set(refused)
    serverless.wait_for(lambda: wanted <= set(outcomes()), REPORT_WAIT, 0.5)
    seen = outcomes()
    missing = sorted(wanted - set(seen))
    assert not missing, f"outcomes never reached /delete_requests/ for request_idx {missing}; got {sorted(seen)}"
    wrong = {i: seen[i] for i in served if seen[i].get("success") is not True}
    wrong |= {i: seen[i] for i in refused if seen[i].get("success") is not False}
    assert not wrong, f"outcomes reported wrongly (served must be success, refused not): {wrong}"
    assert seen.get(306, {}).get("success") is not True, f"an unreadable envelope was reported as served: {seen[306]}"
    assert 309 not in seen, f"an unsigned envelope's request_idx was reported: {seen[309]}"


@pytest.mark.serve
def test_forged_requests_add_no_load(serverless: Launched) -> None:
    # The SDK counts a refused request's workload, computed from its (unsigned) payload, in the
    # rejected load it reports: a forged request must add none, or anyone reaching :3000 could inflate
    # the demand the autoscaler scales on. Its outcome is still reported as refused.
    _ready(serverless)
    start = len(serverless.reports())
    huge = {"prompt": "x", "max_tokens": 10**9}  # counted at the workload's upper clamp
    forged = serverless.probe([{"name": f"forged {idx}", "signature": "other-key", "payload": huge, "request_idx": idx}
                               for idx in (311, 312, 313)])
    assert all(r["status"] == 401 for r in forged.values()), _summary(forged)

    def outcomes() -> set[int]:
        return {r.get("request_idx") for r in serverless.deleted_requests()}

    assert serverless.wait_for(lambda: {311, 312, 313} <= outcomes(), REPORT_WAIT, 0.5), \
        f"the forged requests' outcomes never reached /delete_requests/: {sorted(i for i in outcomes() if i)}"
    # A served request flags a status report for the next 1 s tick; every report since the forged
    # ones were sent carries what they added to rej_load.
    after = len(serverless.reports())
    served = serverless.probe([{"name": "served", "payload": COMPLETION, "request_idx": 314}])["served"]
    assert served["status"] == 200, served
    assert serverless.wait_for(lambda: len(serverless.reports()) > after, REPORT_WAIT, 0.5), "no status report came"
    loads = [r.get("rej_load") for r in serverless.reports()[start:]]
    assert all(load == 0 for load in loads), f"forged requests counted as rejected load: {loads}"


@pytest.mark.serve
def test_unsigned_sessions_refused(serverless: Launched) -> None:
    # /session/* checks no signature in the SDK, and a session's close callback makes the worker
    # POST to any URL the caller names (here: the stand-in, which records it). Refused from outside.
    _ready(serverless)
    session = {"lifetime": 5, "on_close_route": SESSION_CALLBACK, "on_close_payload": {"from": "gate"}}
    results = serverless.probe([
        # A numeric cost, as the SDK's session code needs, so an unguarded SDK creates the session (201).
        {"name": "create, empty signature", "route": "/session/create", "signature": "empty",
         "payload": session, "request_idx": 401, "auth": {"cost": 8}},
        {"name": "create, another key", "route": "/session/create", "signature": "other-key",
         "payload": session, "request_idx": 402, "auth": {"cost": 8}},
        {"name": "create, no auth_data", "route": "/session/create", "signature": "none", "payload": session},
        {"name": "end, unknown session", "route": "/session/end",
         "raw_b64": _b64(b'{"session_id": "x", "session_auth": {}}')},
    ])
    wrong = {name: r for name, r in results.items() if not (r["status"] and 400 <= r["status"] < 500)}
    assert not wrong, f"unsigned session requests not refused (4xx):\n{_summary(wrong)}"
    callbacks = serverless.records("/session-callback/")
    assert not callbacks, f"the worker called an address a caller chose: {callbacks}"


@pytest.mark.serve
def test_self_update_refused(serverless: Launched) -> None:
    # vastai lets /pyworker/update in with an empty token when MASTER_TOKEN is unset (the platform's
    # launch here sets none); an image is version-locked, so it is refused whatever the token.
    _ready(serverless)
    results = serverless.probe([
        {"name": "no token", "route": "/pyworker/update", "raw_b64": _b64(b"{}")},
        {"name": "empty bearer", "route": "/pyworker/update", "raw_b64": _b64(b"{}"),
         "headers": {"Authorization": "Bearer "}},
    ])
    wrong = {name: r for name, r in results.items() if not (r["status"] and 400 <= r["status"] < 500)}
    assert not wrong, f"/pyworker/update not refused (4xx):\n{_summary(wrong)}"
    assert not serverless.host.file("/.force_update").exists, "/pyworker/update wrote /.force_update"


@pytest.mark.serve
def test_query_strings_not_logged(serverless: Launched) -> None:
    # The SDK's own client puts its api key into a query string; a kept access line (a refusal's)
    # must not print it.
    _ready(serverless)
    secret = "gate-query-4f1c"  # noqa: S105 - a marker, not a credential
    result = serverless.probe([{"name": "refused with a query", "route": f"/v1/completions?api_key={secret}",
                                "signature": "other-key", "request_idx": 701}])["refused with a query"]
    assert result["status"] == 401, f"the probe was not refused: {result}"
    # Access lines are written in order: once a later request's line (a 404 on a path of its own)
    # is in the log, the probe's line is too.
    marker = f"/bakery-gate-marker-{uuid.uuid4().hex[:8]}"
    serverless.probe([{"name": "marker", "route": marker, "raw_b64": _b64(b"{}")}])
    assert serverless.wait_for(lambda: marker in serverless.logs(), 10, 0.3), \
        f"no access line for {marker}: access lines of refused requests must stay"
    leaked = [line for line in serverless.logs().splitlines() if secret in line]
    assert not leaked, f"a log line prints the query string: {leaked[:3]}"


# Each a check an image can break (issue 21): its worker is the one that must refuse.
# As punycode, seconds of the event loop to decode (quadratic). 90 KB: the probe's case travels as one
# argument of `docker exec`, whose limit is 128 KiB (base64 makes it 120 KB).
CHARSET_BODY = b"a" * 90_000 + b"-" + b"b" * 10
CHARSET_BOUND = 20.0  # seconds for the refusal and a request after it, docker exec included


@pytest.mark.serve
def test_declared_charset_refused_before_decoding(serverless: Launched) -> None:
    # A body declared in a charset JSON is not written in is refused unread, saying why: Python's
    # punycode decoder is quadratic (120 KB held the worker's only event loop 4-9 s).
    _ready(serverless)
    started = time.monotonic()
    results = serverless.probe([
        {"name": "punycode", "raw_b64": _b64(CHARSET_BODY),
         "headers": {"Content-Type": "application/json; charset=punycode"}},
        {"name": "after it", "payload": COMPLETION, "request_idx": 721}])
    elapsed = time.monotonic() - started
    refused, after = results["punycode"], results["after it"]
    assert refused["status"] in (415, 422) and isinstance(refused["json"], dict) and \
        "charset" in json.dumps(refused["json"]), f"a punycode body was not refused as such: {refused}"
    assert after["status"] == 200, f"the request after it was not served: {_summary(results)}"
    assert elapsed < CHARSET_BOUND, f"the refusal and the next request took {elapsed:.1f} s"


@pytest.mark.serve
def test_reference_to_an_internal_address_refused(serverless: Launched) -> None:
    # The default chat route: an image URL at the cloud metadata address never reaches the engine
    # (which would fetch it from inside the instance); 422 names the field.
    _ready(serverless)
    payload = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Describe it."},
        {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/meta-data/"}}]}],
        "max_tokens": 4}
    result = serverless.probe([{"name": "metadata", "route": "/v1/chat/completions", "payload": payload,
                                "request_idx": 722}])["metadata"]
    assert result["status"] == 422, f"a signed reference to 169.254.169.254 was not refused: {result}"
    assert "image_url" in json.dumps(result["json"]), f"the refusal does not name the field: {result}"


@pytest.mark.serve
def test_caller_text_is_escaped_in_the_log(serverless: Launched) -> None:
    # A header value with terminal escape codes, on a refused request (its access line is kept): the
    # log shows it escaped, never raw.
    _ready(serverless)
    marker = f"gate-escape-{uuid.uuid4().hex[:8]}"
    serverless.probe([{"name": "hostile agent", "signature": "other-key", "request_idx": 723,
                       "headers": {"User-Agent": f"{marker}\x1b[2J\x07\x1b]0;title\x07"}}])
    assert serverless.wait_for(lambda: marker in serverless.logs(), 10, 0.3), \
        f"no log line carries the request's User-Agent ({marker}): the access line of a refusal must stay"
    lines = [line for line in serverless.logs().splitlines() if marker in line]
    raw = [line for line in lines if "\x1b" in line or "\x07" in line]
    assert not raw, f"a log line prints a caller's escape codes raw: {[repr(line) for line in raw[:3]]}"
    assert any("\\x1b" in line for line in lines), f"the escape codes are not shown escaped: {lines[:3]}"


@pytest.mark.serve
def test_oversized_body_refused_413(serverless: Launched) -> None:
    _ready(serverless)
    results = serverless.probe([{"name": "17 MiB signed envelope", "pad_to": BODY_LIMIT + (1 << 20),
                                 "request_idx": 501}])
    result = results["17 MiB signed envelope"]
    assert result["status"] == 413 and isinstance(result["json"], dict), \
        f"a body over 16 MiB was not refused with a JSON 413:\n{_summary(results)}"
    again = serverless.probe([{"name": "after", "payload": COMPLETION, "request_idx": 502}])["after"]
    assert again["status"] == 200, f"the worker did not serve after refusing a large body: {again}"


@pytest.mark.serve
def test_a_client_that_reads_nothing_loses_its_slot(serverless: Launched) -> None:
    """Refused requests sent back to back on one connection that never reads: the worker keeps it only
    until the send bound (BAKERY_SEND_TIMEOUT, 5 s in the gate's launch) after the sends blocked, then
    no process holds it (its connection slot is free), and the worker still serves."""
    _ready(serverless)
    slack = 10  # a busy machine's loop turns and the 0.2 s look at /proc
    result = json.loads(serverless.controlplane_cli("stall", "--seconds", str(SEND_TIMEOUT + slack)))
    assert result["found"] and result["requests"] > 100, f"the stalled connection never filled: {result}"
    assert result["released_after"] is not None, (f"the worker still held a connection that read nothing "
                                                  f"{SEND_TIMEOUT + slack} s after its sends blocked: {result}")
    again = serverless.probe([{"name": "after", "payload": COMPLETION, "request_idx": 7002}])["after"]
    assert again["status"] == 200, f"the worker did not serve after dropping a stalled client: {again}"


# ---- an error line after ready (docs/engines.md, "The worker's error policy after load") ---------
# The worker's line (worker/logs/late_errors.py) when a late error line's health check held:
# "... not counted, the worker stays ready; last: <the line>".
LATE_HELD = "not counted, the worker stays ready; last: "
LATE_COUNTED = "an error line after load counts"
# The check's longest run with the defaults (4 probes 1 s apart, 5 s each: 23 s), and the SDK's tail.
LATE_CHECK_BOUND = 60
LATE_IDX = 901


def late_error_text(marker: str, patterns: list[str]) -> str:
    """A traceback an engine handled, as lines of MODEL_LOG that each start with `marker`, plus one line
    for each baked error pattern the traceback does not contain (llama.cpp's grammar has no traceback
    line): every pattern but the exit line occurs once."""
    lines = [f"{marker} Error in one request (handled: the engine serves on).",
             f"{marker} Traceback (most recent call last):",
             f'{marker}   File "/opt/engine/handler.py", line 12, in handle',
             f"{marker}     raise ValueError(message)",
             f"{marker} ValueError: one request's problem"]
    lines += [f"{marker} {pattern} (handled)" for pattern in patterns if not any(pattern in line for line in lines)]
    return "\n".join(lines) + "\n"


def _outcome_time(launched: Launched, request_idx: int) -> float | None:
    """When the control plane got the outcome of `request_idx` (its record's time), or None."""
    for entry in launched.records("/delete_requests/"):
        body = entry.get("body")
        items = body.get("requests") if isinstance(body, dict) else None
        if any(isinstance(i, dict) and i.get("request_idx") == request_idx for i in items or []):
            return float(entry["time"])
    return None


@pytest.mark.serve
def test_handled_traceback_after_ready_keeps_the_worker_ready(image: ImageUnderTest, serverless: Launched) -> None:
    # After ready, engines log tracebacks they handle and serve on: a line matching a baked error
    # pattern while /health answers 200 must not error the worker (the SDK alone errors it for good).
    # The injected lines carry a marker: a check that reads MODEL_LOG for error lines can tell them.
    _ready(serverless)
    exit_line = facts(image.spec).exit_line
    patterns = [p for p in json.loads(image.expected_env["MODEL_ERROR_LOG_MSGS"]) if p != exit_line]
    if not patterns:
        pytest.skip(f"not run: images/{image.engine}.yaml bakes no error line but the exit line")
    before = [r.get("error_msg") for r in serverless.reports() if r.get("error_msg")]
    assert not before, f"the worker was reported errored before this check: {before}"
    marker = f"(bakery gate {uuid.uuid4().hex[:12]}: injected)"
    # One write, appended (O_APPEND) like the engine's own lines; the text and path as arguments.
    result = serverless.container.exec_run(["/bin/sh", "-c", 'printf "%s" "$1" >>"$2"', "sh",
                                            late_error_text(marker, patterns), image.expected_env["MODEL_LOG"]])
    assert result.exit_code == 0, f"could not append to MODEL_LOG: {result.output.decode(errors='replace')}"

    def errored() -> list[Any]:
        return [r.get("error_msg") for r in serverless.reports() if r.get("error_msg")]

    def decided() -> bool:  # the worker's line about the injected lines (it names the last one matched)
        text = serverless.logs()
        return bool(errored()) or LATE_HELD + marker in text or any(
            marker in line for line in text.splitlines() if LATE_COUNTED in line)

    assert serverless.wait_for(decided, LATE_CHECK_BOUND, 0.5), \
        f"the worker said nothing about the injected error lines within {LATE_CHECK_BOUND} s:\n" \
        f"{serverless.logs()[-3000:]}"
    assert not errored() and LATE_HELD + marker in serverless.logs(), \
        f"the injected error lines counted although the engine serves (reports: {errored()}):\n" \
        f"{serverless.logs()[-3000:]}"
    served = serverless.probe([{"name": "after the traceback", "payload": COMPLETION, "request_idx": LATE_IDX}])
    after = served["after the traceback"]
    assert after["status"] == 200 and answer_text(after).strip(), \
        f"a signed request after the injected traceback was not served: {_summary(served)}"
    # A status report made after that request ended: an errored worker's would carry error_msg (the
    # SDK never clears it).
    assert serverless.wait_for(lambda: _outcome_time(serverless, LATE_IDX) is not None, REPORT_WAIT, 0.5), \
        f"no outcome for request {LATE_IDX} reached the control plane"
    anchor = _outcome_time(serverless, LATE_IDX) or 0.0
    assert serverless.wait_for(lambda: any(float(e.get("time", 0)) > anchor
                                           for e in serverless.records("/worker_status/")), REPORT_WAIT, 0.5), \
        "no status report came after the request"
    assert not errored(), f"the worker was reported errored after a handled traceback: {errored()}"


# ---- a control plane that withholds the key at boot (one launch, two checks) --------------------
# conftest's "latekey" side launch: the stand-in answers 503 to the worker's first 5 key fetches
# (the SDK's own tries, ~15 s) and serves the key from the 6th on.


@pytest.mark.serve
def test_requests_get_503_until_ready(side: SideLaunches) -> None:
    # Until the worker is loaded (here: its key is withheld), a request is never proxied: 503 with
    # Retry-After and a JSON error, so the caller knows to come back. Probed as soon as the worker
    # had reported (conftest.probe_before_ready).
    side.get("latekey")
    result = side.early_probe
    assert 200 not in (result.get("key_fetches_before") or []), f"the key was served before the probe: {result}"
    assert result.get("status") == 503 and (result.get("headers") or {}).get("Retry-After") \
        and isinstance(result.get("json"), dict), f"a request before the worker was ready got: {result}"
    # The image's health check says the same at that moment (docs/image.md, "Health check").
    health = result.get("health_before") or {}
    assert health.get("rc") == 1 and "not ready" in str(health.get("output")), \
        f"the health check of a worker not ready yet: {health}"


@pytest.mark.serve
def test_key_served_late_is_picked_up(side: SideLaunches) -> None:
    # The control plane does not give the key at boot and does after the SDK's own 5 tries: the
    # worker must end up serving signed requests without anyone restarting the container (never
    # 401 forever), and report ready.
    launched = side.get("latekey")
    # Read now: the attributes the launch holds may be from before the container started (a fresh run
    # on a loaded machine saw StartedAt 0001-01-01 there, and took the real start for a restart).
    launched.container.reload()
    started = launched.container.attrs["State"]["StartedAt"]
    assert not started.startswith("0001-"), f"the late-key container never started: {launched.container.attrs['State']}"

    def fetches() -> list[int]:
        return [r.get("status") for r in launched.records("/pubkey/")]

    assert launched.wait_for(lambda: 200 in fetches(), READY_TIMEOUT, 1), \
        f"the worker stopped asking for the key after {fetches()} (503 = withheld)\n{launched.logs()[-2000:]}"
    assert fetches()[:SDK_PUBKEY_TRIES] == [503] * SDK_PUBKEY_TRIES, f"the key was not withheld first: {fetches()}"
    deadline = time.monotonic() + READY_TIMEOUT
    last: dict[str, Any] = {}
    while time.monotonic() < deadline and launched.running():
        last = launched.probe([{"name": "late", "payload": COMPLETION, "request_idx": 602}], timeout=30)["late"]
        if last["status"] == 200:
            break
        time.sleep(2)
    assert last.get("status") == 200, \
        f"signed requests still not served after the key was fetched: {last}\nfetches: {fetches()}\n" \
        f"{launched.logs()[-2000:]}"
    # Served means loaded; its report follows within the SDK's 10 s tick.
    assert launched.wait_for(lambda: any(is_ready_report(r) for r in launched.reports()), 30, 0.5), \
        f"no ready report after the key came: {[r.get('error_msg') for r in launched.reports()][-5:]}"
    launched.container.reload()
    attrs = launched.container.attrs
    assert attrs["State"]["StartedAt"] == started and attrs.get("RestartCount", 0) == 0, "the container was restarted"


# ---- stopping: docker stop, as the platform stops an instance --------------------------------------
DOCKER_GRACE = 10  # `docker stop`'s default
DRAIN_ROUTE = "/v1/chat/completions"


def _signed_body(launched: Launched, payload: dict[str, Any], idx: int) -> bytes:
    """A request body signed by the stand-in for the worker's own URL (made inside the container)."""
    return launched.controlplane_cli("envelope", "--payload", json.dumps(payload), "--request-idx", str(idx)).encode()


def _engine_has_unread_request(launched: Launched) -> bool:
    """Whether a connection to the engine's port holds bytes the (frozen) engine has not read: the
    worker has sent it a request. From `ss` in the container (Recv-Q of the engine's side)."""
    result = launched.container.exec_run(["ss", "-Htn", "state", "established", "( sport = :18000 )"])
    rows = [line.split() for line in result.output.decode(errors="replace").splitlines()]
    return result.exit_code == 0 and any(row and row[0].isdigit() and int(row[0]) > 0 for row in rows)


@pytest.mark.serve
def test_docker_stop_drains_on_the_signed_path(side: SideLaunches) -> None:
    # A long streamed answer is in flight when the container is stopped: it arrives whole, a request
    # sent after the signal gets 503 + Retry-After, the stop fits Docker's grace with exit 0, the worker
    # stops before the engine, and both outcomes reach the autoscaler before the worker exits.
    # The engine is frozen (SIGSTOP) before the request is sent and until the drain has begun, so the
    # answer is in flight at the signal whatever the machine's speed (freezing it after its first event
    # raced: on a loaded machine `docker exec kill -STOP` came after all 16 of llama.cpp's tokens); the
    # whole answer must then fit the drain time.
    if facts(side.image.spec).long_answer is None:  # a team's own base: no answer known to take seconds
        pytest.skip(f"not run: images/{side.image.engine}.yaml sets no base.local_long_answer (an answer "
                    "in flight for seconds there)")
    launched = side.get("drain")
    program = facts(side.image.spec).program
    engine = launched.engine_pid(program)
    _ready(launched)
    long_answer = facts(side.image.spec).long_answer
    assert long_answer is not None, f"images/{side.image.engine}.yaml: base.local_long_answer is not set"
    payload = {"messages": [{"role": "user", "content": "Tell a long story."}], "stream": True,
               "stream_options": {"include_usage": True}, **long_answer.payload}
    held, late_body = _signed_body(launched, payload, 901), _signed_body(
        launched, {"messages": [{"role": "user", "content": "late"}], "max_tokens": 4}, 902)
    launched.container.reload()
    host = launched.container.attrs["NetworkSettings"]["IPAddress"]  # this test's own container
    launched.signal_pid(engine, "STOP")
    answer: dict[str, Any] = {}
    # When each step happened, seconds from the engine's freeze: a failure says where the time went
    # (a stop past the grace, an engine slow after SIGCONT, an answer that never began).
    began = time.monotonic()
    timeline: dict[str, float] = {}

    def mark(step: str) -> None:
        timeline[step] = round(time.monotonic() - began, 2)

    def send_held() -> None:
        conn = http.client.HTTPConnection(host, 3000, timeout=60)
        try:
            conn.request("POST", DRAIN_ROUTE, body=held, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            mark("answer head")
            answer["status"] = response.status
            answer["body"] = response.read()
            mark("answer end")
        except (OSError, http.client.HTTPException) as exc:
            mark("answer failed")
            answer["error"] = repr(exc)
        finally:
            conn.close()

    sender = threading.Thread(target=send_held)
    sender.start()
    # In flight: the worker has passed the request to the frozen engine (unread bytes on its port).
    assert launched.wait_for(lambda: _engine_has_unread_request(launched), 30, 0.1), \
        f"the held request never reached the engine:\n{launched.logs()[-3000:]}"
    stop: dict[str, float] = {}

    def docker_stop() -> None:
        started = time.monotonic()
        mark("docker stop")
        launched.container.stop(timeout=DOCKER_GRACE)
        stop["seconds"] = time.monotonic() - started
        mark("stopped")

    stopper = threading.Thread(target=docker_stop)
    stopper.start()
    assert launched.wait_for(lambda: "draining, 1 request(s) in flight" in launched.logs(), 5, 0.05), \
        launched.logs()[-3000:]
    late = http.client.HTTPConnection(host, 3000, timeout=10)
    late.request("POST", DRAIN_ROUTE, body=late_body, headers={"Content-Type": "application/json"})
    refused = late.getresponse()
    assert refused.status == 503 and refused.getheader("Retry-After"), (refused.status, refused.read())
    late.close()
    mark("late request refused")
    launched.signal_pid(engine, "CONT")
    mark("engine continued")
    sender.join(60)
    stopper.join(DOCKER_GRACE + 20)
    # "body" missing: the answer's head came but its end had not when the wait above gave up.
    assert answer.get("status") == 200 and "error" not in answer and "body" in answer, \
        f"the answer in flight did not arrive whole: {answer.get('status')} {answer.get('error')} " \
        f"{answer.get('body', b'')[-300:]!r}\ntimeline (s from the freeze): {timeline}, exit code " \
        f"{launched.exit_code()}\n{launched.logs()[-3000:]}"
    events = [e for e in answer["body"].split(b"\n\n") if e.strip()]
    assert events[-1].strip() == b"data: [DONE]", events[-3:]
    usage = json.loads(events[-2].strip()[len(b"data: "):])
    assert usage["usage"]["completion_tokens"] == long_answer.tokens, usage
    assert launched.exit_code() == 0, launched.logs()[-3000:]
    assert stop["seconds"] < DOCKER_GRACE, (stop, timeline)  # no SIGKILL: the drain and the engine's stop fit the grace
    logs = launched.logs()
    assert "drained in" in logs and logs.index("stopped: worker (exit status 0)") < \
        logs.index(f"stopped: {program}"), logs[-3000:]
    outcomes = {r.get("request_idx"): r for r in launched.deleted_requests()}
    assert outcomes.get(901, {}).get("success") is True, f"the drained answer's outcome was not reported: {outcomes}"
    assert outcomes.get(902, {}).get("status") == "Rejected", f"the 503's outcome was not reported: {outcomes}"


# ---- offline --------------------------------------------------------------------------------------


@pytest.mark.serve
def test_unsecured_offline_serves_unsigned(side: SideLaunches) -> None:
    # UNSECURED=true stays supported for offline use (the README's docker run): no control plane
    # at all, and the demo client's unsigned envelopes are served.
    launched = side.get("unsecured")
    assert launched.ready(READY_TIMEOUT), f"not ready offline:\n{launched.logs()[-2000:]}"

    def demo_client_served() -> bool:
        return launched.host.run(f"{WORKER_PYTHON} {CLIENT} http://127.0.0.1:3000 --timeout 60").rc == 0

    # The benchmark file comes a moment before the worker marks itself loaded (health check).
    assert launched.wait_for(demo_client_served, 30, 2), \
        launched.host.run(f"{WORKER_PYTHON} {CLIENT} http://127.0.0.1:3000").stderr + launched.logs()[-2000:]
