#!/usr/bin/env python3
"""The least one asyncio event loop can cost a forwarder: a byte relay in Python, for bench/relay_floor.py.

    <worker venv>/bin/python bench/py_relay.py PORT ENGINE_PORT [uvloop|asyncio]

bench/relay_floor.c in Python: it accepts on 127.0.0.1:PORT, opens one connection to
127.0.0.1:ENGINE_PORT per client, and copies bytes both ways as they arrive through asyncio's
protocols (no HTTP parsing, no envelope, no accounting; asyncio sets TCP_NODELAY on both). What it
costs per streamed event and per request, and what it adds to a burst's first token, is the floor
under any port-3000 server that runs on one asyncio loop, aiohttp or one of bakery's own: the gap
between it and the C relay is the event loop's, the gap between it and the worker is HTTP's and
bakery's. With `uvloop` it runs on uvloop's loop, as the worker does by default (BAKERY_EVENT_LOOP).
Loopback only; prints one line once it listens. Not part of the product.
"""

from __future__ import annotations

import asyncio
import sys
from typing import cast


class Upstream(asyncio.Protocol):
    """The engine side of one pair: what the engine writes goes to the client as it arrives."""

    def __init__(self, client: asyncio.Transport) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class Client(asyncio.Protocol):
    """The client side: its bytes go to the engine once that connection is up (held until then)."""

    def __init__(self, engine_port: int) -> None:
        self.engine_port = engine_port
        self.transport: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.held: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass
        asyncio.get_running_loop().create_task(self.connect())

    async def connect(self) -> None:
        assert self.transport is not None
        try:
            upstream, _ = await asyncio.get_running_loop().create_connection(
                lambda: Upstream(self.transport), "127.0.0.1", self.engine_port)  # type: ignore[arg-type]
        except OSError:
            self.transport.close()
            return
        if self.transport.is_closing():
            upstream.close()
            return
        self.upstream = upstream
        if self.held:
            upstream.write(b"".join(self.held))
            self.held.clear()

    def data_received(self, data: bytes) -> None:
        if self.upstream is not None:
            self.upstream.write(data)
        else:
            self.held.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.close()


async def serve(port: int, engine_port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client(engine_port), "127.0.0.1", port, backlog=4096)
    print(f"py_relay: listening on 127.0.0.1:{port} -> 127.0.0.1:{engine_port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> int:
    if len(sys.argv) not in (3, 4) or sys.argv[3:] not in ([], ["uvloop"], ["asyncio"]):
        print("usage: py_relay.py PORT ENGINE_PORT [uvloop|asyncio]", file=sys.stderr)
        return 2
    relay = serve(int(sys.argv[1]), int(sys.argv[2]))
    if sys.argv[3:] == ["uvloop"]:
        import uvloop

        uvloop.run(relay)  # stopped by SIGTERM (its default action)
    else:
        asyncio.run(relay)
    return 0


if __name__ == "__main__":
    sys.exit(main())
