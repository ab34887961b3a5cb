"""Helpers for the serving tests (streaming, drain, engine connections): a client that reads a streamed
answer one SSE event at a time, and the stand-in's stream records. Engines and workers are started by
helpers.Harness."""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path
from typing import Any

from tests.worker.helpers import STANDIN_MODEL

MODEL = STANDIN_MODEL


def envelope(payload: dict[str, Any], idx: int = 1) -> bytes:
    """The SDK's envelope around `payload` (UNSECURED: the signature is not checked)."""
    auth = {"cost": "8", "endpoint": "test", "reqnum": idx, "request_idx": idx, "signature": "", "url": "x"}
    return json.dumps({"auth_data": auth, "payload": payload}).encode()


class EventStream:
    """One streamed POST; `next_event()` returns each SSE event's bytes (`data: ...\\n\\n`) as it arrives."""

    def __init__(self, port: int, path: str, body: bytes, timeout: float = 60.0) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        self.conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.headers = {k.lower(): v for k, v in self.response.getheaders()}

    def next_event(self) -> bytes:
        """The next event (b"" at the end of the body)."""
        lines = []
        while True:
            line = self.response.readline()
            if not line:
                return b"".join(lines)
            lines.append(line)
            if line in (b"\n", b"\r\n"):
                return b"".join(lines)

    def rest(self) -> bytes:
        """Everything left of the body."""
        return self.response.read()

    def close(self) -> None:
        """Drop the connection (a client that goes away)."""
        self.conn.sock and self.conn.sock.close()  # type: ignore[func-returns-value]
        self.conn.close()


def direct_events(port: int, path: str, payload: dict[str, Any]) -> list[bytes]:
    """The events of `payload` streamed straight from the engine on `port` (no worker)."""
    stream = EventStream(port, path, json.dumps(payload).encode())
    events = []
    while event := stream.next_event():
        events.append(event)
    stream.close()
    return events


def normalise(event: bytes) -> Any:
    """An event with its per-answer fields (id, created) removed, for comparing two answers."""
    text = event.decode().strip()
    assert text.startswith("data: "), event
    data = text[len("data: "):]
    if data == "[DONE]":
        return data
    obj = json.loads(data)
    obj.pop("id", None)
    obj.pop("created", None)
    return obj


def stream_records(record: Path) -> list[dict[str, Any]]:
    """The stand-in's end-of-stream records (STANDIN_STREAM_RECORD)."""
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


def wait_record(record: Path, prompt: str, timeout: float = 30.0) -> dict[str, Any]:
    """Wait until the stand-in recorded the end of the stream that answered `prompt`; return that record.

    Found by its prompt, never by counting: an earlier stream's record may still be on its way (the
    stand-in writes it after the last byte, so a later test can overtake it on a busy machine)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        mine = [r for r in stream_records(record) if r.get("prompt") == prompt]
        if len(mine) > 1:
            raise AssertionError(f"two streams answered {prompt!r}: {mine}; give each request its own prompt")
        if mine:
            return mine[0]
        time.sleep(0.05)
    raise AssertionError(f"the stand-in recorded no stream for {prompt!r} within {timeout} s: {stream_records(record)}")
