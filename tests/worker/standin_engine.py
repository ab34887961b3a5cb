"""A minimal vLLM / SGLang stand-in for the worker's host tests (stdlib only, no model, no GPU).

    python3 standin_engine.py vllm|sglang --port P [--model M] [--load-seconds S] [--fail]

It prints the real engine's log lines (REFERENCE.md §3) to stdout and mimics its /health:
- vllm: `Starting vLLM server on ...`, the port opens only when ready (connections refused before),
  then uvicorn's `INFO:     Application startup complete.`; /health 200.
- sglang: `Uvicorn running on ...` while warming up (/health 503), then
  `The server is fired up and ready to roll!`; /health 200.
- `--fail` prints the engine's fatal start-up lines and exits 1 instead.
`/v1/completions` and `/v1/chat/completions` answer OpenAI-shaped JSON (or SSE with "stream": true)
whose text names the engine. bases/standin/ holds the full stand-in used in images.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

READY = {"vllm": "INFO:     Application startup complete.", "sglang": "The server is fired up and ready to roll!"}
FATAL = {
    "vllm": ["ERROR [core.py:700] EngineCore failed to start.",
             "Traceback (most recent call last):",
             "RuntimeError: Engine core initialization failed. See root cause above."],
    "sglang": ["Scheduler hit an exception: Traceback (most recent call last):",
               "RuntimeError: Initialization failed. warmup error: out of memory"],
}


def log(line: str) -> None:
    """Print one whole log line and flush (the worker tails the file this goes to)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Engine(BaseHTTPRequestHandler):
    """The OpenAI-compatible surface and /health."""

    engine = "vllm"
    model = "standin-model"
    ready = threading.Event()
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        log(f"INFO:     127.0.0.1 - \"{self.command} {self.path}\" {args[1] if len(args) > 1 else ''}")

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        """/health: 503 while warming up, 200 when ready; /v1/models lists the model."""
        if self.path == "/health":
            self._send(200 if self.ready.is_set() else 503, b"" if self.ready.is_set() else b'{"status":"starting"}')
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": self.model, "object": "model"}]}).encode())
        else:
            self._send(404, b'{"error":"not found"}')

    def do_POST(self) -> None:
        """Answer a completion or a chat completion, streaming when asked."""
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        chat = self.path == "/v1/chat/completions"
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self._send(404, b'{"error":"not found"}')
            return
        if not self.ready.is_set():
            self._send(503, b'{"error":"starting"}')
            return
        tokens = int(body.get("max_tokens") or 8)
        text = f"{self.engine} stand-in answer ({tokens} tokens)"
        kind = "chat.completion" if chat else "text_completion"
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for word in text.split():
                piece = {"delta": {"content": word + " "}} if chat else {"text": word + " "}
                chunk = {"object": f"{kind}.chunk", "model": self.model, "choices": [{"index": 0, **piece}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True
            return
        choice = {"index": 0, "finish_reason": "length"}
        choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
        answer = {"id": "cmpl-standin", "object": kind, "model": body.get("model", self.model), "choices": [choice],
                  "usage": {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1}}
        self._send(200, json.dumps(answer).encode())


def main() -> int:
    """Run the stand-in until killed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("engine", choices=sorted(READY))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="standin-model")
    parser.add_argument("--load-seconds", type=float, default=0.3)
    parser.add_argument("--fail", action="store_true")
    args = parser.parse_args()
    Engine.engine, Engine.model = args.engine, args.model
    url = f"http://127.0.0.1:{args.port}"
    if args.engine == "vllm":
        log(f"INFO 01-01 00:00:00 [api_server.py:1] Starting vLLM server on {url} (stand-in)")
    time.sleep(args.load_seconds)
    if args.fail:
        for line in FATAL[args.engine]:
            log(line)
        return 1
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    if args.engine == "sglang":
        log(f"INFO:     Uvicorn running on {url} (Press CTRL+C to quit)")
        time.sleep(args.load_seconds)  # warm-up: /health answers 503
    Engine.ready.set()
    log(READY[args.engine])
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
