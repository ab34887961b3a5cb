#!/usr/bin/env python3
"""N streamed completions at once (stdlib only), run as its own process by bench/serving_bench.py (part scale).

    python3 streamload.py --port PORT [--streams 256] [--envelope [--url U --signature S]] [--first-idx 1]
                          [--body '{"model": "standin-model", "prompt": "scale", "stream": true}']
                          [--path /v1/completions] [--timeout 120]

Opens `--streams` connections at once (all of them before the first request is sent, so that the
time spent connecting -- a listen backlog that overflows, SYN retransmits -- is not in the figures),
then sends one POST of `--body` on each at the same moment and reads every answer: SSE over chunked
transfer encoding (or a Content-Length body, or a body to EOF). With `--envelope` each body is
wrapped in the SDK's envelope, as tests.worker.serving.envelope does (`{"auth_data": {...},
"payload": body}`), stream i with reqnum = request_idx = `--first-idx` + i; `--url` and `--signature`
fill auth_data for a worker that checks signatures (one signature serves every request: it covers
the url alone).

A streamed body ({"stream": true}) is complete when its `data: [DONE]` event arrived; another one when
it answered 200 and its whole body was read. Prints one JSON object:

    streams      streams asked
    completed    streams complete (see above)
    errors       streams not complete; first_errors: the first 3 reasons
    events       `data:` events over all streams ([DONE] included)
    wall_s       first send -> last stream ended; events_per_s = events / wall_s
    ttft_p50_ms, ttft_p95_ms   from a stream's send to its first `data:` event (streams that had one;
                 null when none had)
    connect_s    time to open all the connections (not in wall_s)
    timed_out    whether `--timeout` (the whole run, connecting included) cut it short

It always stops by itself: after `--timeout` seconds every stream still open is closed and counted as
an error. It is a raw asyncio client on purpose (as bench/loadgen.py): the cheaper the client, the
more of the shared machine is left to the servers measured. Only loopback addresses are used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass

from loadgen import read_head  # bench/ is this script's directory, first on sys.path

LOOPBACK = ("127.0.0.1", "localhost", "::1")
DEFAULT_BODY = '{"model": "standin-model", "prompt": "scale", "stream": true}'


@dataclass
class Stream:
    """One stream's outcome."""

    sent: float = 0.0
    first: float = 0.0  # the first `data:` event (0: none yet)
    ended: float = 0.0
    events: int = 0
    done: bool = False  # complete (see the module docstring)
    error: str = ""


def envelope(payload: dict, idx: int, url: str = "x", signature: str = "") -> dict:
    """The SDK's envelope around `payload`, the fields of tests.worker.serving.envelope (UNSECURED
    unless `url` and `signature` are the platform's: its signature covers the url alone)."""
    auth = {"cost": "8", "endpoint": "test", "reqnum": idx, "request_idx": idx, "signature": signature, "url": url}
    return {"auth_data": auth, "payload": payload}


def request_bytes(host: str, port: int, path: str, body: dict) -> bytes:
    data = json.dumps(body, separators=(",", ":")).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n")
    return head.encode() + data


class Lines:
    """Splits body bytes into lines and counts the SSE `data:` events of one stream."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.rest = b""

    def feed(self, data: bytes) -> None:
        self.rest += data
        if b"\n" not in data:
            return
        *lines, self.rest = self.rest.split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                if not self.stream.events:
                    self.stream.first = time.perf_counter()
                self.stream.events += 1
                if line[5:].strip() == b"[DONE]":
                    self.stream.done = True


async def read_answer(reader: asyncio.StreamReader, stream: Stream, streamed: bool) -> None:
    """Read one response into `stream`."""
    status, headers, _ = await read_head(reader)
    sink = Lines(stream)
    body = bytearray()

    def take(data: bytes) -> None:
        sink.feed(data)
        if status != 200 and len(body) < 300:
            body.extend(data[:300])

    if "content-length" in headers:
        take(await reader.readexactly(int(headers["content-length"])))
    elif headers.get("transfer-encoding") == "chunked":
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                break
            take(data[:-2])
    else:
        while data := await reader.read(65536):
            take(data)
    sink.feed(b"\n")  # a last line without its newline
    if status != 200:
        stream.done = False
        stream.error = f"HTTP {status}: {bytes(body[:200]).decode(errors='replace')}"
    elif not streamed:
        stream.done = True
    elif not stream.done:
        stream.error = "ended without data: [DONE]"


async def one(args: argparse.Namespace, request: bytes, streamed: bool, stream: Stream,
              connected: asyncio.Queue, go: asyncio.Event) -> None:
    """Connect, report it, wait for `go`, send, read the answer."""
    writer = None
    try:
        try:
            reader, writer = await asyncio.open_connection(args.host, args.port)
        finally:
            connected.put_nowait(None)  # connected or failed: the start waits for every stream
        await go.wait()
        stream.sent = time.perf_counter()
        writer.write(request)
        await writer.drain()
        await read_answer(reader, stream, streamed)
    except asyncio.CancelledError:
        stream.error = f"timeout: still open after --timeout {args.timeout:g} s"
        raise
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError) as exc:
        stream.error = f"{type(exc).__name__}: {exc}"
    finally:
        stream.ended = time.perf_counter()
        if writer is not None:
            writer.close()


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


async def run(args: argparse.Namespace) -> dict:
    payload = json.loads(args.body)
    streamed = bool(payload.get("stream"))
    streams = [Stream() for _ in range(args.streams)]
    bodies = [envelope(payload, args.first_idx + i, args.url, args.signature) if args.envelope else payload
              for i in range(args.streams)]
    requests = [request_bytes(args.host, args.port, args.path, body) for body in bodies]
    connected: asyncio.Queue = asyncio.Queue()
    go = asyncio.Event()
    began = time.perf_counter()
    deadline = began + args.timeout
    tasks = [asyncio.ensure_future(one(args, requests[i], streamed, streams[i], connected, go))
             for i in range(args.streams)]
    timed_out = False
    try:
        for _ in range(args.streams):
            await asyncio.wait_for(connected.get(), timeout=max(0.0, deadline - time.perf_counter()))
    except asyncio.TimeoutError:
        timed_out = True
    connect_s = time.perf_counter() - began
    first_send = time.perf_counter()
    go.set()
    _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.perf_counter()))
    if pending:
        timed_out = True
        for task in pending:
            task.cancel()
        await asyncio.wait(pending)
    sent = [s for s in streams if s.sent]
    last = max((s.ended for s in sent), default=first_send)
    wall = max(1e-9, last - first_send)
    events = sum(s.events for s in streams)
    ttft = [(s.first - s.sent) * 1000 for s in sent if s.first]
    errors = [s.error or "not complete" for s in streams if not s.done]
    return {"streams": args.streams, "completed": sum(s.done for s in streams), "errors": len(errors),
            "first_errors": errors[:3], "events": events, "wall_s": round(wall, 4),
            "events_per_s": round(events / wall, 1),
            "ttft_p50_ms": round(statistics.median(ttft), 2) if ttft else None,
            "ttft_p95_ms": round(pct(ttft, 0.95), 2) if ttft else None, "connect_s": round(connect_s, 4),
            "timed_out": timed_out}


def main() -> int:
    """Run the streams and print the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default="/v1/completions")
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--body", default=DEFAULT_BODY, help="the request's JSON body (an OpenAI payload)")
    parser.add_argument("--envelope", action="store_true", help="wrap each body in the SDK's envelope")
    parser.add_argument("--first-idx", type=int, default=1, help="reqnum/request_idx of the first enveloped body")
    parser.add_argument("--url", default="x", help="with --envelope: auth_data.url (the worker's own URL)")
    parser.add_argument("--signature", default="",
                        help="with --envelope: auth_data.signature (the platform's, of --url)")
    parser.add_argument("--timeout", type=float, default=120.0, help="the whole run stops after this (s)")
    args = parser.parse_args()
    if args.host not in LOOPBACK:
        parser.error("loopback only")
    if args.streams < 1:
        parser.error("--streams must be at least 1")
    print(json.dumps(asyncio.run(run(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
