#!/usr/bin/env python3
"""A small closed-loop HTTP/1.1 load generator (stdlib only), run inside the container by bench/run.py.

    python3 loadgen.py --port 3000 [--envelope] [--close] [--concurrency 16] [--seconds 3] [--warmup 0.5]

`--concurrency` connections (keep-alive; with `--close` a new connection per request) each send
POST /v1/completions, wait for the whole answer, and send the next one, for `--warmup` seconds (not
counted) and then `--seconds` seconds. With `--envelope` the OpenAI body is wrapped the way the
serverless router delivers it to a worker (`{"auth_data": {...}, "payload": {...}}`, as
worker/workers/openai/client.py does), each request with its own reqnum. Prints one JSON object:
requests, errors, seconds, rps, p50/p90/p99 latency (ms).

It is a raw asyncio client on purpose: the cheaper the client, the more of the (shared, 2-core)
machine is left to the servers being compared. Only loopback addresses are used.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import time

_counter = itertools.count(1)


def _request(host: str, port: int, path: str, body: dict, envelope: bool, close: bool) -> bytes:
    if envelope:
        reqnum = next(_counter)
        body = {"auth_data": {"cost": str(body.get("max_tokens", 0)), "endpoint": "bakery-bench",
                              "reqnum": reqnum, "request_idx": reqnum, "signature": "", "url": path},
                "payload": body}
    data = json.dumps(body, separators=(",", ":")).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: {'close' if close else 'keep-alive'}\r\n\r\n")
    return head.encode() + data


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], str]:
    """Read a response's head; return (status, headers lowercased, status line)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip().lower()
    return status, headers, lines[0]


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """Read one whole response; return (status, keep-alive)."""
    status, headers, status_line = await read_head(reader)
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    else:
        await reader.read()
        return status, False
    keep = headers.get("connection") != "close" and status_line.startswith("HTTP/1.1")
    return status, keep


async def _client(args: argparse.Namespace, start: float, end: float, latencies: list[float],
                  errors: list[str]) -> None:
    reader = writer = None
    while time.perf_counter() < end:
        if writer is None:
            reader, writer = await asyncio.open_connection(args.host, args.port)
        body = {"prompt": "Say hello.", "max_tokens": args.max_tokens, "temperature": 0.0}
        if args.model:
            body["model"] = args.model
        request = _request(args.host, args.port, args.path, body, args.envelope, args.close)
        sent = time.perf_counter()
        try:
            writer.write(request)
            status, keep = await _read_response(reader)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            writer.close()
            reader = writer = None
            continue
        done = time.perf_counter()
        if status != 200:
            errors.append(f"HTTP {status}")
        elif sent >= start:
            latencies.append(done - sent)
        if args.close or not keep:
            writer.close()
            reader = writer = None
    if writer is not None:
        writer.close()


async def _main(args: argparse.Namespace) -> dict:
    latencies: list[float] = []
    errors: list[str] = []
    start = time.perf_counter() + args.warmup
    end = start + args.seconds
    await asyncio.gather(*(_client(args, start, end, latencies, errors) for _ in range(args.concurrency)))
    ms = sorted(x * 1000 for x in latencies)

    def pct(p: float) -> float:
        return ms[min(len(ms) - 1, int(p * len(ms)))] if ms else float("nan")

    return {"requests": len(ms), "errors": len(errors), "first_errors": errors[:3], "seconds": args.seconds,
            "rps": len(ms) / args.seconds, "p50_ms": statistics.median(ms) if ms else float("nan"),
            "p90_ms": pct(0.90), "p99_ms": pct(0.99), "concurrency": args.concurrency}


def main() -> int:
    """Run the load and print the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default="/v1/completions")
    parser.add_argument("--envelope", action="store_true", help="wrap bodies in the SDK's envelope")
    parser.add_argument("--model", default="standin/tiny-chat")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--close", action="store_true", help="a new connection per request")
    args = parser.parse_args()
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        parser.error("loopback only")
    print(json.dumps(asyncio.run(_main(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
