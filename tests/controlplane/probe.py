"""The control-plane stand-in's client side: sign envelopes as the platform does and send them.

A probe case is a small JSON object, so a gate check can send many requests with one `docker exec`:

    {"route": "/v1/completions",          # path on the worker
     "payload": {...},                     # the OpenAI body (default: a short completion)
     "signature": "valid",                 # valid | empty | other-key | flipped | none (no auth_data)
     "sign_url": null,                     # the URL signed and put into auth_data.url (null: the worker's own)
     "request_idx": 7, "reqnum": 7,        # auth_data numbers (reqnum defaults to request_idx)
     "auth": {"reqnum": [1]},              # auth_data fields replaced after signing
     "envelope": {"auth_data": null},      # top-level fields replaced after building
     "raw_b64": "...",                     # send exactly these bytes instead of an envelope
     "pad_to": 17000000,                   # grow the prompt until the body has at least this many bytes
     "headers": {"Authorization": ""}}     # extra request headers

The result of each case: {"status", "headers" (Content-Type, Retry-After), "body", "json", "error",
"sent_at", "answered_at" (wall clock), "signed" (a valid signature on an untouched envelope)}.
"""

from __future__ import annotations

import base64
import http.client
import json
import select
import time
import urllib.parse
from typing import Any

from . import signing
from .server import State

DEFAULT_PAYLOAD = {"prompt": "The three primary colours are", "max_tokens": 8, "temperature": 0}
CHUNK = 1 << 16


def worker_url(state: State) -> str:
    """The worker's own URL, as it reports it to the control plane (the latest /worker_status/)."""
    for entry in reversed(state.records()):
        if entry.get("path") == "/worker_status/" and isinstance(entry.get("body"), dict):
            url = entry["body"].get("url")
            if url:
                return str(url)
    raise LookupError("no /worker_status/ report holds the worker's url yet")


def signature_for(state: State, mode: str, url: str) -> str:
    """auth_data.signature for `url` in one of the probe modes."""
    if mode == "valid":
        return signing.sign(state.key(), url)
    if mode == "empty":
        return ""
    if mode == "other-key":
        return signing.sign(state.other_key(), url)
    if mode == "flipped":
        return signing.flip_bit(signing.sign(state.key(), url), bit=1000)
    raise ValueError(f"unknown signature mode {mode!r} (valid, empty, other-key, flipped, none)")


def envelope(state: State, case: dict[str, Any]) -> dict[str, Any]:
    """The request body of `case`: auth_data signed as the platform signs it, and the payload."""
    payload = dict(case.get("payload") or DEFAULT_PAYLOAD)
    body: dict[str, Any] = {"payload": payload}
    mode = case.get("signature", "valid")
    if mode != "none":
        url = case.get("sign_url") or worker_url(state)
        idx = case.get("request_idx", 1)
        body["auth_data"] = {
            "cost": str(payload.get("max_tokens", 0)), "endpoint": "bakery-gate", "reqnum": case.get("reqnum", idx),
            "request_idx": idx, "signature": signature_for(state, mode, url), "url": url,
        }
        body["auth_data"].update(case.get("auth") or {})
    body.update(case.get("envelope") or {})
    return body


def body_bytes(state: State, case: dict[str, Any]) -> bytes:
    """The exact bytes `case` sends."""
    if "raw_b64" in case:
        return base64.b64decode(case["raw_b64"])
    body = envelope(state, case)
    data = json.dumps(body).encode()
    pad_to = int(case.get("pad_to") or 0)
    if len(data) < pad_to:  # a long prompt, so the envelope stays a valid request, just too big
        body["payload"]["prompt"] = str(body["payload"].get("prompt", "")) + " word" * ((pad_to - len(data)) // 5 + 1)
        data = json.dumps(body).encode()
    return data


def send(base: str, route: str, data: bytes, headers: dict[str, str], timeout: float) -> dict[str, Any]:
    """POST `data` to base+route. A server that answers before reading a large body (413) is
    heard: sending stops as soon as the answer arrives, so the answer is read, not a reset."""
    parts = urllib.parse.urlsplit(base)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"the worker URL must be http://host:port, got {base!r}")
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    result: dict[str, Any] = {"status": None, "headers": {}, "body": "", "json": None, "error": None}
    try:
        conn.putrequest("POST", route, skip_accept_encoding=True)
        merged = {"Content-Type": "application/json", "Content-Length": str(len(data)), **headers}
        for name, value in merged.items():
            conn.putheader(name, value)
        conn.endheaders()
        assert conn.sock is not None
        for start in range(0, len(data), CHUNK):
            if select.select([conn.sock], [], [], 0)[0]:
                break  # the worker answered early (e.g. 413): read it
            try:
                conn.sock.sendall(data[start:start + CHUNK])
            except OSError:
                break
        response = conn.getresponse()
        text = response.read().decode("utf-8", "replace")
        result.update(status=response.status, body=text[:4000],
                      headers={k: v for k, v in response.getheaders() if k.lower() in ("content-type", "retry-after")})
        try:
            result["json"] = json.loads(text)
        except ValueError:
            result["json"] = None
    except (OSError, http.client.HTTPException) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    return result


def run_case(state: State, base: str, case: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
    """Build and send one case; the result carries the case's name and the bytes sent."""
    try:
        data = body_bytes(state, case)
    except LookupError as exc:
        return {"name": case.get("name"), "status": None, "error": str(exc)}
    sent_at = time.time()
    result = send(base, case.get("route", "/v1/completions"), data, dict(case.get("headers") or {}), timeout)
    result["name"] = case.get("name")
    result["sent_bytes"] = len(data)
    # Wall-clock times inside the container (the host's clock): the gate's time-to-ready split takes
    # its first signed answer from them (tests/image/stages.py).
    result["sent_at"], result["answered_at"] = sent_at, time.time()
    result["signed"] = case.get("signature", "valid") == "valid" and "raw_b64" not in case \
        and not case.get("auth") and not case.get("envelope") and not case.get("sign_url")
    return result
