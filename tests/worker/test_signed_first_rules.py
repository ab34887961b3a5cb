"""signed_first.read judges an envelope as rules.envelope_error judges the parsed body: the same 422
message, or none, for every shape, without parsing the payload. Run in the worker venv (msgspec)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.worker.helpers import WORKER_DIR

PROBE = r"""
import json, sys
from policy import rules, signed_first
GOOD = {"cost": "8", "endpoint": "e", "reqnum": 1, "request_idx": 2, "signature": "sig", "url": "http://x"}
VALUES = [1, -5, 2**63, -(2**63) - 1, 2**63 - 1, 10**30, 1.0, 1e5, True, False, None, "s", "", [], [1], {}, {"a": 1},
          "x" * 20000]
bodies = []
for field in GOOD:
    bodies += [{"auth_data": {**GOOD, field: v}, "payload": {}} for v in VALUES]
    bodies.append({"auth_data": {k: v for k, v in GOOD.items() if k != field}, "payload": {}})
for v in VALUES:
    bodies += [{"auth_data": GOOD, "payload": v}, {"auth_data": GOOD, "payload": {}, "session_id": v},
               {"auth_data": v, "payload": {}}, {"auth_data": GOOD, "payload": {"deep": [[v]]}, "other": v}]
bodies += [{"payload": {}}, {"auth_data": GOOD}, {}, [], [GOOD], 5, None, "x", True]
diffs = []
for body in bodies:
    found = signed_first.read(json.dumps(body).encode(), None)
    want = rules.envelope_error(body)
    if found.problem != want:
        diffs.append([json.dumps(body)[:200], want, found.problem])
    elif want is None:
        sent = body["auth_data"]
        too_long = any(len(sent[k]) > signed_first.AUTH_TEXT_LIMIT for k in ("signature", "url"))
        auth = {k: found.auth[k] for k in ("reqnum", "request_idx", "signature", "url")}
        if too_long and found.checkable:  # not read, so not signed
            diffs.append([json.dumps(body)[:200], "not checkable", found.auth])
        elif not too_long and (auth != {k: sent[k] for k in auth} or not found.checkable):
            diffs.append([json.dumps(body)[:200], "auth as sent", found.auth])
print(json.dumps({"compared": len(bodies), "diffs": diffs}))
"""


def test_read_judges_every_shape_as_the_parsed_envelope(worker_python: Path) -> None:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(WORKER_DIR), "PYTHONNOUSERSITE": "1"}
    out = subprocess.run([str(worker_python), "-c", PROBE], capture_output=True, text=True, env=env, timeout=120,
                         check=True).stdout
    result = json.loads(out)
    assert result["compared"] > 150
    assert result["diffs"] == []


def test_an_unreadable_or_foreign_text_is_judged_without_a_parse(worker_python: Path) -> None:
    """What only the reader sees: a body that is not JSON as RFC 8259 writes it, invalid UTF-8 inside
    auth_data, a url too long to be this worker's (not signed: checkable is False), UTF-16 declared."""
    code = r"""
import json
from policy import signed_first
GOOD = {"cost": "8", "endpoint": "e", "reqnum": 1, "request_idx": 2, "signature": "sig", "url": "http://x"}
read = signed_first.read
print(json.dumps([
    read(b'{"auth_data": ' + json.dumps(GOOD).encode() + b', "payload": {"t": NaN}}', None).problem,
    read(b'{"auth_data": ' + json.dumps(GOOD).encode() + b', "payload": {"t": "\\ud800"}}', None).problem,
    read(b'{"auth_data": {"url": "\xff"}, "payload": {}}', None).problem,
    read(json.dumps({"auth_data": {**GOOD, "url": "h" * 20000}, "payload": {}}).encode(), None).checkable,
    read(json.dumps({"auth_data": GOOD, "payload": {}}).encode("utf-16"), "utf-16").auth["url"],
    read(b"[" * 100000, None).problem,
    read(b'{"payload": ' + b"[" * 100000 + b"]" * 100000 + b"}", None).problem,
]))
"""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(WORKER_DIR), "PYTHONNOUSERSITE": "1"}
    out = subprocess.run([str(worker_python), "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         check=True).stdout
    nan, surrogate, bad_utf8, long_url, utf16, brackets, deep = json.loads(out)
    assert nan == surrogate == "the request body is not valid JSON"
    assert "UTF-8" in bad_utf8
    assert long_url is False
    assert utf16 == "http://x"
    assert "JSON object" in brackets
    assert "64 levels" in deep


SESSION_PROBE = r"""
import json
from policy import rules, signed_first
GOOD = {"cost": 8, "endpoint": "e", "reqnum": 1, "request_idx": 2, "signature": "sig", "url": "http://x"}
VALUES = [1, -5, 2**63, 1.0, True, None, "s", "", [], {}, {"a": 1}, "x" * 20000]


def parsed_judgement(body, key):
    # What the auth object is refused for, judged on the parsed body (front's rules).
    if not isinstance(body, dict):
        return rules.NOT_AN_OBJECT
    if key not in body:
        return f"{key} is missing"
    if not isinstance(body[key], dict):
        return f"{key} must be a JSON object"
    return rules.auth_error(body[key], key)


diffs, compared = [], 0
for key in ("auth_data", "session_auth"):
    bodies = [{key: GOOD, "payload": {"lifetime": 5}, "session_id": "s"}, {"payload": {}}, [], 5, None]
    for field in GOOD:
        bodies += [{key: {**GOOD, field: v}, "session_id": "s"} for v in VALUES]
        bodies.append({key: {k: v for k, v in GOOD.items() if k != field}})
    bodies += [{key: v, "payload": {"deep": [[v]]}} for v in VALUES]
    for body in bodies:
        compared += 1
        found = signed_first.read_session_auth(json.dumps(body).encode(), None, key)
        want = parsed_judgement(body, key)
        if found.problem != want:
            diffs.append([key, json.dumps(body)[:200], want, found.problem])
        elif want is None and len(body[key]["url"]) < 100 and found.auth["url"] != body[key]["url"]:
            diffs.append([key, json.dumps(body)[:200], "auth as sent", found.auth])
print(json.dumps({"compared": compared, "diffs": diffs}))
"""


def test_a_session_calls_auth_is_judged_as_the_parsed_body(worker_python: Path) -> None:
    """/session/* (BAKERY_SESSIONS=true): the auth object a call carries (auth_data to create,
    session_auth after) is judged from its raw text as front judges the parsed body, so the
    signature can be checked before anything else of the body is parsed."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(WORKER_DIR), "PYTHONNOUSERSITE": "1"}
    out = subprocess.run([str(worker_python), "-c", SESSION_PROBE], capture_output=True, text=True, env=env,
                         timeout=120, check=True).stdout
    result = json.loads(out)
    assert result["compared"] > 100
    assert result["diffs"] == []
