"""The control-plane stand-in's HTTP side: /pubkey/ for the SDK, and a record of everything posted.

Stdlib HTTP server. Everything it is asked is appended to `<state>/records.jsonl`, one JSON object
a line: {"time", "method", "path", "status", "body"}; POST bodies are parsed as JSON when they are.
The key is withheld (GET /pubkey/ answers the status in `<state>/withhold`) while that file exists;
`<status> <n>` in it withholds the key from the next n fetches only, and `<status> <n> hold` from at
least those n and then until `lift-hold` (a test that must act before the key is served).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from . import signing
from .launching import parse_records

RECORDS = "records.jsonl"
KEY = "key.pem"
OTHER_KEY = "other.pem"
WITHHOLD = "withhold"
WITHHOLD_LOCK = "withhold.lock"  # taken by every process that reads or writes the withhold file
HOLD = "hold"  # the withhold file's last word while a test holds the key back (lift-hold)
REPORT_PATHS = ("/worker_status/", "/delete_requests/")
MAX_BODY = 1 << 20  # the SDK's reports are a few kB; anything bigger is recorded truncated


class State:
    """The stand-in's files in one directory, shared by the server and the CLI."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self._records_lock = threading.Lock()

    @property
    def records_path(self) -> Path:
        return self.dir / RECORDS

    def key(self) -> Any:
        """The control plane's private key (made on first use)."""
        return signing.load_or_create(self.dir / KEY)

    def other_key(self) -> Any:
        """A second key the worker never sees: signatures by it must be refused."""
        return signing.load_or_create(self.dir / OTHER_KEY)

    @contextlib.contextmanager
    def _switch(self) -> Any:
        """The withhold switch, held across processes: the server's count-down and a CLI's
        lift-hold are read-modify-writes of one file, and a lift landing between the server's read
        and write was undone (the key then stayed withheld for good)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with (self.dir / WITHHOLD_LOCK).open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def withheld_status(self) -> int | None:
        """The status /pubkey/ answers now while the key is withheld, else None. A withhold limited
        to N answers counts this one and lifts itself after the Nth."""
        path = self.dir / WITHHOLD
        with self._switch():
            if not path.exists():
                return None
            fields = path.read_text().split()
            status = int(fields[0]) if fields and fields[0].isdigit() else 503
            hold = fields[-1] == HOLD
            if len(fields) > 1 and fields[1].isdigit():
                left = max(int(fields[1]) - 1, 0)
                if left == 0 and not hold:
                    path.unlink()
                else:
                    path.write_text(f"{status} {left}{' ' + HOLD if hold else ''}\n")
            return status

    def withhold(self, status: int = 503, times: int | None = None, hold: bool = False) -> None:
        """Make /pubkey/ answer `status` until release(), or for the next `times` fetches only; with
        `hold`, for those `times` and then until lift_hold()."""
        text = f"{status}" + (f" {times}" if times else "") + (f" {HOLD}" if hold and times else "")
        with self._switch():
            (self.dir / WITHHOLD).write_text(text + "\n")

    def lift_hold(self) -> None:
        """End a hold: the fetches still counted stay withheld, and then the key is served."""
        path = self.dir / WITHHOLD
        with self._switch():
            if not path.exists():
                return
            fields = path.read_text().split()
            if fields and fields[-1] == HOLD:
                fields.pop()
                if len(fields) > 1 and fields[1].isdigit() and int(fields[1]) > 0:
                    path.write_text(" ".join(fields) + "\n")
                else:
                    path.unlink()

    def release(self) -> None:
        """Serve the key from now on."""
        with self._switch():
            (self.dir / WITHHOLD).unlink(missing_ok=True)

    def record(self, entry: dict[str, Any]) -> None:
        """Append one request to the records, whole lines only (threads share the file)."""
        line = json.dumps(entry, sort_keys=True) + "\n"
        with self._records_lock, self.records_path.open("a", encoding="utf-8") as f:
            f.write(line)
            f.flush()

    def records(self) -> list[dict[str, Any]]:
        """Every recorded request so far, oldest first."""
        return parse_records(self.records_path.read_text(encoding="utf-8") if self.records_path.exists() else "")


def _body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return {"raw": raw[:2000].decode("utf-8", "replace")}


def make_handler(state: State, pem: str) -> type[BaseHTTPRequestHandler]:
    """The request handler bound to `state`, serving `pem` at /pubkey/."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "bakery-controlplane-standin/1"

        def log_message(self, format: str, *args: Any) -> None:
            return  # the records file is the log

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/pubkey/":
                withheld = state.withheld_status()
                status = withheld or 200
                if withheld:
                    self._answer(status, b'{"error": "key withheld by the stand-in"}', "application/json")
                else:
                    self._answer(200, pem.encode(), "text/plain; charset=utf-8")
            else:
                status = 404
                self._answer(404, b'{"error": "not found"}', "application/json")
            state.record({"time": time.time(), "method": "GET", "path": path, "status": status, "body": None})

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(min(length, MAX_BODY))
            if length > MAX_BODY:
                self.close_connection = True
            # Reports are accepted; any other path is recorded too (e.g. a callback a worker must
            # never make), and answered 404.
            status = 200 if path in REPORT_PATHS else 404
            self._answer(status, b"{}", "application/json")
            state.record({"time": time.time(), "method": "POST", "path": path, "status": status, "body": _body(raw)})

    return Handler


def serve(state: State, host: str, port: int, ready: threading.Event | None = None) -> None:
    """Serve until interrupted. The key is made before the port opens, so /pubkey/ never waits."""
    pem = signing.public_pem(state.key())
    server = ThreadingHTTPServer((host, port), make_handler(state, pem))
    server.daemon_threads = True
    (state.dir / "address").write_text(f"http://{host}:{server.server_address[1]}\n")
    if ready is not None:
        ready.set()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
