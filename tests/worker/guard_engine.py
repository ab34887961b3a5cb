"""A tiny OpenAI-style engine for the guard tests (stdlib only, loopback only).

    python guard_engine.py --port P --log FILE [--load-seconds S]

Serves /health (503 until loaded, then 200), /v1/completions and /v1/chat/completions. Writes
`model loaded` to FILE after S seconds (the llama.cpp load line the worker waits for). What a request
gets depends on its prompt (or last message):
- `hang`: the engine accepts the request and never answers (held 120 s at most);
- `trickle N D [S]`: a streamed answer of N chunks, one every D seconds (S seconds before the second);
- `slowbody D`: the answer's headers at once, then D seconds of silence before its body;
- `cut`: a streamed answer's headers, then the connection closed before any of its body;
- `health N`: from then on /health answers status N (the engine still serves requests);
- `big N`: at once, a completion whose text is N bytes;
- `flood N`: at once, a streamed answer of N events of 4 KiB each;
- anything else: at once, a completion whose text is `echo:<prompt>`.
Every request is counted in FILE as `served <route> <prompt>` so tests can see what reached it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HOLD_LIMIT = 120.0


def main() -> None:
    """Parse the arguments and serve until killed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--load-seconds", type=float, default=0.0)
    args = parser.parse_args()
    loaded = threading.Event()
    lock = threading.Lock()
    health: dict[str, int] = {}  # the status /health answers once loaded (`health N`), 200 unless set

    def note(line: str) -> None:
        with lock, args.log.open("a") as out:
            out.write(line + "\n")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *a: object) -> None:
            pass

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                status = health.get("status", 200) if loaded.is_set() else 503
                self._send(status, {"status": "ok" if status == 200 else "unwell" if loaded.is_set() else "loading"})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            prompt = body.get("prompt") or (body.get("messages") or [{}])[-1].get("content", "")
            note(f"served {self.path} {str(prompt)[:60]}")
            words = str(prompt).split()
            if words[:1] == ["health"]:
                health["status"] = int(words[1])
            if words[:1] == ["hang"]:
                time.sleep(HOLD_LIMIT)
                return
            if words[:1] == ["cut"]:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                self.close_connection = True
                return
            if words[:1] == ["flood"]:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                event = b"data: " + b"f" * 4088 + b"\n\n"
                with contextlib.suppress(OSError):  # a client that reads nothing is cut by the worker
                    for _ in range(int(words[1])):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                    self.wfile.write(b"0\r\n\r\n")
                return
            if words[:1] == ["trickle"]:
                count, delay = int(words[1]), float(words[2])
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                # S, once after the first part; a word that is no number is padding (test_admission's BIG prompts)
                stall = float(words[3]) if len(words) > 3 and words[3].replace(".", "", 1).isdigit() else 0.0
                for i in range(count):
                    time.sleep(delay if i != 1 else stall or delay)
                    chunk = f"data: {json.dumps({'choices': [{'text': f'part{i} '}]})}\n\n".encode()
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                return
            text = "x" * int(words[1]) if words[:1] == ["big"] else f"echo:{prompt}"
            answer = json.dumps({"object": "text_completion", "model": "guard-engine",
                                 "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
                                 "usage": {"completion_tokens": 1}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            if words[:1] == ["slowbody"]:
                self.wfile.flush()
                time.sleep(float(words[1]))
            self.wfile.write(answer)

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True

    def load() -> None:
        time.sleep(args.load_seconds)
        loaded.set()
        note("main: model loaded")

    threading.Thread(target=load, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
