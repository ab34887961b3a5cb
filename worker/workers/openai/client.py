#!/usr/bin/env python3
"""Demo client for every bakery worker (vllm, sglang, llama, openai): stdlib only.

    python3 worker/workers/openai/client.py http://127.0.0.1:3000 [--model ID] [--max-tokens N] [--stream]

Sends one completion and one chat request through the worker, each wrapped in the SDK's envelope
(`{"auth_data": {...}, "payload": <OpenAI body>}`), and prints the answers. Exits 1 if a request
fails. The worker must run with UNSECURED=true (a local container): the auth_data here is unsigned.
The model id defaults to the first non-empty of MODEL_NAME, VLLM_MODEL, SGLANG_MODEL, LLAMA_MODEL;
without one the field is left out (llama.cpp ignores it; vLLM and SGLang use their served model).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

MODEL_ID_VARS = ("MODEL_NAME", "VLLM_MODEL", "SGLANG_MODEL", "LLAMA_MODEL")


def envelope(payload: dict[str, Any], route: str, reqnum: int) -> dict[str, Any]:
    """Wrap an OpenAI body the way the serverless router delivers it to a worker."""
    auth = {"cost": str(payload.get("max_tokens", 0)), "endpoint": "bakery-demo", "reqnum": reqnum,
            "request_idx": reqnum, "signature": "", "url": route}
    return {"auth_data": auth, "payload": payload}


def post(base: str, route: str, payload: dict[str, Any], reqnum: int, timeout: float) -> tuple[int, bytes]:
    """POST the enveloped payload to the worker; return (status, body). Raises OSError offline."""
    data = json.dumps(envelope(payload, route, reqnum)).encode()
    request = urllib.request.Request(  # noqa: S310 (main() accepts http(s) URLs only)
        base.rstrip("/") + route, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (http(s) only)
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def answer_text(route: str, body: bytes) -> str:
    """The generated text of a completion or chat answer, plain JSON or a server-sent-event stream."""
    text = body.decode("utf-8", "replace")
    if text.lstrip().startswith("data:"):
        pieces = []
        for line in text.splitlines():
            chunk = line.removeprefix("data:").strip()
            if not line.startswith("data:") or chunk == "[DONE]" or not chunk:
                continue
            choice = (json.loads(chunk).get("choices") or [{}])[0]
            pieces.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
        return "".join(pieces)
    choice = (json.loads(text).get("choices") or [{}])[0]
    if route.endswith("/chat/completions"):
        return (choice.get("message") or {}).get("content") or ""
    return choice.get("text") or ""


def main(argv: list[str] | None = None) -> int:
    """Send the two demo requests; 0 when both answer 200."""
    parser = argparse.ArgumentParser(description="Send a completion and a chat request through a bakery worker.")
    parser.add_argument("url", help="the worker's URL, e.g. http://127.0.0.1:3000")
    parser.add_argument("--model", default=next((v for n in MODEL_ID_VARS if (v := os.environ.get(n))), None))
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--stream", action="store_true", help="ask for streamed answers")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    if not args.url.startswith(("http://", "https://")):
        parser.error(f"the worker URL must start with http:// or https://, got {args.url!r}")

    common: dict[str, Any] = {"max_tokens": args.max_tokens, "temperature": 0.7, "stream": args.stream}
    if args.model:
        common["model"] = args.model
    requests = [
        ("/v1/completions", {**common, "prompt": "The three primary colours are"}),
        ("/v1/chat/completions", {**common, "messages": [{"role": "user", "content": "Say hello in one line."}]}),
    ]
    failed = 0
    for reqnum, (route, payload) in enumerate(requests, start=1):
        try:
            status, body = post(args.url, route, payload, reqnum, args.timeout)
        except OSError as err:
            print(f"{route}: request failed: {err}", file=sys.stderr)
            failed += 1
            continue
        if status != 200:
            print(f"{route}: HTTP {status}: {body[:500].decode('utf-8', 'replace')}", file=sys.stderr)
            failed += 1
            continue
        try:
            text = answer_text(route, body)
        except (ValueError, AttributeError, IndexError) as err:
            print(f"{route}: unreadable answer ({err}): {body[:500]!r}", file=sys.stderr)
            failed += 1
            continue
        print(f"{route}: {text.strip()}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
