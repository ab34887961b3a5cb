"""Run inside an engine container (any python3, standard library only): start the engine, watch its
/health while it starts, send one battery of requests once it answers, and print what the worker and
the gate rely on as JSON lines. tests/bases/test_vllm_differential.py runs it in the vLLM stand-in and
in the real vLLM and compares the two.

usage: python3 engine_probe.py CASES_JSON ENGINE_ARGV...

Printed (one JSON object per line, prefixed with PROBE so they stand out of the engine's output):
  {"health": STATE, "t": seconds}   each change of /health: "refused", or "<status> <content type> <body>"
                                    (the content type "-" when the answer has none)
  {"exit": code, "t": seconds}      the engine exited before it answered (a load failure)
  {"case": name, ...}               one request's result: status, content type, JSON shape or SSE chunk
                                    shapes; an error's type, param and code; a stream's last chunks
  {"battery_done": true}            the battery ran; the engine keeps running
  {"stopped": code, "t": seconds}   SIGTERM (docker stop) was passed on to the engine, which exited
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

BASE = "http://127.0.0.1:18000"
START_BOUND = 600.0  # seconds: a real vLLM loads in ~60 s here, several times that on a busy machine
POLL = 0.05


def say(record: dict[str, Any]) -> None:
    print("PROBE " + json.dumps(record, sort_keys=True), flush=True)


def shape(value: Any) -> Any:
    """The JSON's structure without its values: objects keep their keys, lists the union of their
    items' shapes, scalars their type name (a null is "null": a field that is sometimes null shows)."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in sorted(value.items())}
    if isinstance(value, list):
        seen: list[Any] = []
        for item in value:
            if shape(item) not in seen:
                seen.append(shape(item))
        return seen
    if value is None:
        return "null"
    return type(value).__name__ if not isinstance(value, bool) else "bool"


def request(method: str, path: str, body: Any = None, raw: str | None = None) -> tuple[int, str, bytes]:
    data = raw.encode() if raw is not None else (json.dumps(body).encode() if body is not None else None)
    headers = {"content-type": "application/json"} if data is not None else {}
    req = urllib.request.Request(BASE + path, data=data, method=method, headers=headers)  # noqa: S310 - loopback
    try:
        with urllib.request.urlopen(req, timeout=120) as answer:  # noqa: S310 - loopback
            return answer.status, answer.headers.get("content-type", ""), answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read()


def health() -> str:
    try:
        status, ctype, body = request("GET", "/health")
    except OSError:
        return "refused"
    return f"{status} {ctype or '-'} {body.decode(errors='replace')[:200]}"


def _chunk_text(chunk: dict[str, Any]) -> str:
    return "".join(str(choice.get("delta", {}).get("content") or choice.get("text") or "")
                   for choice in chunk.get("choices", []))


def stream_end(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """How a stream ends, which the chunk shapes' union cannot show: the last chunk's shape, and the
    last chunk that carries choices (the one a client reads finish_reason from): its shape, its
    finish_reason values and whether it carries text of its own."""
    with_choices = [c for c in chunks if c.get("choices")]
    last = with_choices[-1] if with_choices else {}
    return {"last_chunk": shape(chunks[-1]) if chunks else None,
            "finish_chunk": {"shape": shape(last),
                             "finish_reason": [choice.get("finish_reason") for choice in last.get("choices", [])],
                             "carries_text": bool(_chunk_text(last))}}


def error_fields(parsed: Any) -> dict[str, Any] | None:
    """An error answer's fields other than its wording: type, param and code, with their values."""
    if not isinstance(parsed, dict):
        return None
    inner = parsed.get("error", parsed)
    if not isinstance(inner, dict):
        return None
    return {key: inner.get(key, "<absent>") for key in ("type", "param", "code")}


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    status, ctype, body = request(case.get("method", "POST"), case["path"], case.get("body"), case.get("raw"))
    result: dict[str, Any] = {"case": case["name"], "status": status, "type": ctype.split(";")[0].strip()}
    text = body.decode(errors="replace")
    if result["type"] == "text/event-stream":
        chunks, done = [], False
        for line in text.splitlines():
            if line.startswith("data: "):
                payload = line[len("data: "):]
                if payload == "[DONE]":
                    done = True
                else:
                    chunks.append(json.loads(payload))
        result["chunks"] = [shape(chunk) for chunk in chunks]
        result["done"] = done
        result["usage"] = next((c["usage"] for c in chunks if c.get("usage")), None)
        result["text"] = "".join(_chunk_text(c) for c in chunks)
        result.update(stream_end(chunks))
    else:
        try:
            parsed = json.loads(text)
        except ValueError:
            result["body"] = text[:300]
        else:
            result["shape"] = shape(parsed)
            result["usage"] = parsed.get("usage") if isinstance(parsed, dict) else None
            if status >= 400:  # compared: the error's fields; for a reader of a difference: what it said
                result["error"] = error_fields(parsed)
                result["excerpt"] = text[:400]
    return result


def main(cases_json: str, argv: list[str]) -> int:
    cases = json.loads(cases_json)
    started = time.monotonic()
    engine = subprocess.Popen(argv)
    stopping: list[float] = []

    def stop(_signum: int, _frame: Any) -> None:
        # As PID 1 this process would ignore SIGTERM: pass it on, as the image's entry point does.
        stopping.append(time.monotonic())
        engine.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    state = None
    while time.monotonic() - started < START_BOUND:
        code = engine.poll()
        now = health()
        if now != state:
            state = now
            say({"health": now, "t": round(time.monotonic() - started, 2)})
        if code is not None:
            say({"exit": code, "t": round(time.monotonic() - started, 2)})
            return 0
        if now.startswith("200"):
            break
        time.sleep(POLL)
    else:
        say({"timeout": START_BOUND})
        return 1
    for case in cases:
        say(run_case(case))
    say({"health_after": health()})
    say({"battery_done": True})
    code = engine.wait()
    if stopping:
        say({"stopped": code, "t": round(time.monotonic() - stopping[0], 2)})
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
