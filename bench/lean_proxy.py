#!/usr/bin/env python3
"""The leanest honest aiohttp proxy: what aiohttp.web itself costs per request and per event.

    <worker venv>/bin/python bench/lean_proxy.py PORT ENGINE_PORT [PROCESSES [uvloop|asyncio]]

Issue 24's reference: it unwraps the platform's envelope (`payload`, when the body has one), posts it
to the engine on one pooled client session, and streams the answer back with `iter_any()` ->
`write()`; nothing else (no signature, no limits, no accounting). bench/relay_floor.py runs it as a
side beside the C relay and the worker, so the worker's CPU is read against what aiohttp.web alone
costs on this machine. PROCESSES > 1 (default 1) forks that many copies that all listen on PORT
(SO_REUSEPORT: the kernel spreads the connections over them), to measure what a second core buys a
forwarder here before the worker is split; the first process stops the others when it is stopped.
With `uvloop` every copy runs on uvloop's loop, as the worker does by default.
Loopback only; prints one line once it listens. Not part of the product.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from aiohttp import ClientSession, TCPConnector, web


async def session_on(app: web.Application) -> None:
    app["engine"] = ClientSession(connector=TCPConnector(limit=0, keepalive_timeout=4.0))


async def session_off(app: web.Application) -> None:
    await app["engine"].close()


def proxy(engine_port: int) -> web.Application:
    """The app: every POST is unwrapped and sent to the engine's same path."""
    base = f"http://127.0.0.1:{engine_port}"

    async def forward(request: web.Request) -> web.StreamResponse:
        data = json.loads(await request.read())
        body = data["payload"] if isinstance(data, dict) and "payload" in data else data
        async with request.app["engine"].post(base + request.path, json=body) as answer:
            if "text/event-stream" not in answer.content_type:
                return web.Response(body=await answer.read(), status=answer.status,
                                    content_type=answer.content_type)
            res = web.StreamResponse(status=answer.status)
            res.content_type = answer.content_type
            await res.prepare(request)
            async for chunk in answer.content.iter_any():
                await res.write(chunk)
            await res.write_eof()
            return res

    app = web.Application()
    app.router.add_post("/{path:.*}", forward)
    app.on_startup.append(session_on)
    app.on_cleanup.append(session_off)
    return app


def main() -> int:
    if len(sys.argv) not in (3, 4, 5) or sys.argv[4:] not in ([], ["uvloop"], ["asyncio"]):
        print("usage: lean_proxy.py PORT ENGINE_PORT [PROCESSES [uvloop|asyncio]]", file=sys.stderr)
        return 2
    port, engine_port = int(sys.argv[1]), int(sys.argv[2])
    processes = int(sys.argv[3]) if len(sys.argv) >= 4 else 1
    if sys.argv[4:] == ["uvloop"]:  # run_app makes its loop from the policy, as the SDK's asyncio.run() does
        import asyncio

        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    if processes < 1:
        print("lean_proxy: PROCESSES must be 1 or more", file=sys.stderr)
        return 2
    # Forked before any loop or socket exists, so every copy starts clean. Each child says on a pipe
    # when it listens; the first process announces itself only once all of them do, so the bench's
    # first connections are spread over every copy.
    ready_r, ready_w = os.pipe()
    children: list[int] = []
    for _ in range(processes - 1):
        pid = os.fork()
        if pid == 0:  # a child: its own server, no announcement, no children of its own
            os.close(ready_r)
            web.run_app(proxy(engine_port), host="127.0.0.1", port=port, backlog=4096, access_log=None,
                        reuse_port=True, print=lambda _: os.write(ready_w, b"."))
            return 0
        children.append(pid)
    os.close(ready_w)

    def announce(_: str) -> None:
        for _ in children:
            os.read(ready_r, 1)
        print(f"lean_proxy: listening on 127.0.0.1:{port} ({processes} process(es))", flush=True)

    try:
        web.run_app(proxy(engine_port), host="127.0.0.1", port=port, backlog=4096, access_log=None,
                    reuse_port=processes > 1, print=announce)
    finally:
        for pid in children:
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
