#!/usr/bin/env python3
"""The send bound's cost (admission.SendWatch): one sweep over N open client connections, idle and
with bytes waiting for a client that reads nothing, against the loop's time with no sweep.

    python bench/send_watch.py [--connections 2048] [--rounds 5]

Loopback only; every connection is closed at the end. Prints the median sweep time and the share
of one core it takes at one sweep a second.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))

from policy import admission


async def measure(count: int, rounds: int, stalled: int) -> list[float]:
    transports: list[asyncio.Transport] = []
    server = await asyncio.get_running_loop().create_server(
        lambda: Keep(transports), "127.0.0.1", 0, backlog=count + 16)
    port = server.sockets[0].getsockname()[1]
    clients = []
    for i in range(count):
        sock = socket.socket()
        if i < stalled:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        clients.append(sock)
    while len(transports) < count:
        await asyncio.sleep(0.01)
    for transport in transports[:stalled]:  # bytes waiting for clients that read nothing
        transport.write(b"x" * 200_000)
    watch = admission.SendWatch(3600.0, lambda: iter(transports))
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        watch.sweep()
        times.append(time.perf_counter() - started)
        if watch.timer is not None:
            watch.timer.cancel()
        await asyncio.sleep(0.05)
    for sock in clients:
        sock.close()
    server.close()
    return times


class Keep(asyncio.Protocol):
    def __init__(self, into: list[asyncio.Transport]) -> None:
        self.into = into

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.into.append(transport)  # type: ignore[arg-type]


def main() -> int:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--connections", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    for stalled in (0, args.connections // 8):
        times = asyncio.run(measure(args.connections, args.rounds, stalled))
        median = statistics.median(times)
        print(f"send watch: {args.connections} connections ({stalled} with bytes waiting): sweep median "
              f"{median * 1000:.2f} ms (min {min(times) * 1000:.2f}, max {max(times) * 1000:.2f}), "
              f"{median / args.connections * 1e6:.2f} us a connection, {median * 100:.2f} % of a core "
              "at one sweep a second")
    return 0


if __name__ == "__main__":
    sys.exit(main())
