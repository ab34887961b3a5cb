"""Run inside the worker venv (PYTHONPATH=worker/): the request path a real SDK Worker runs.

    <venv>/bin/python request_path_probe.py [--plant]

Builds a Worker as core.run() does (core.install_parts, core.serve_routes) and prints, as one JSON object,
the stages it runs: aiohttp.web's middlewares in the order the app made through the guards' web shim has
them, the layers of the signature check and of the engine call, outermost first, what the SDK's own callers
reach, and every SDK function one signed request calls on its way through a route's handler to an engine
(a loopback one started here) and back. --plant installs the guards in the reverse of their order (a
reordering planted in the code): tests/worker/test_request_path.py must see it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

ENV = {"CONTAINER_ID": "5", "REPORT_ADDR": "http://127.0.0.1:9", "PUBLIC_IPADDR": "203.0.113.7",
       "WORKER_PORT": "3000", "VAST_TCP_PORT_3000": "41234", "USE_SSL": "false", "UNSECURED": "false",
       "MODEL_SERVER_URL": "http://127.0.0.1:18457"}


def innermost(outer: object) -> str:
    """The name of what the last tagged layer of a chain wraps (None when the chain is bakery's to its end)."""
    while getattr(outer, "bakery_stage", None) is not None:
        outer = getattr(outer, "__wrapped__", None)
    return getattr(outer, "__name__", type(outer).__name__)


async def traced_request(worker: Any, ctx: Any, handlers: dict[str, Any], serve_routes: Any) -> dict[str, Any]:
    """One signed request through bakery's route handler to a loopback engine: its status, and the SDK
    functions it called (file:function), traced with sys.setprofile."""
    import base64

    from Crypto.Hash import SHA256
    from Crypto.PublicKey import RSA
    from Crypto.Signature import pkcs1_15

    answer = b'{"choices": [{"text": "ok"}], "usage": {"completion_tokens": 1}}'

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(answer), answer))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(engine, "127.0.0.1", int(os.environ["MODEL_SERVER_URL"].rsplit(":", 1)[1]))
    key = RSA.generate(2048)
    ctx.platform.set_pubkey(key.publickey())
    url = worker.backend.metrics.url
    digest = SHA256.new(json.dumps({"url": url}, indent=4, sort_keys=True).encode())
    auth = {"cost": "1", "endpoint": "e", "reqnum": 1, "request_idx": 1, "url": url,
            "signature": base64.b64encode(pkcs1_15.new(key).sign(digest)).decode()}
    body = {"auth_data": auth, "payload": {"prompt": "hi", "max_tokens": 1, "model": "m"}}
    serve_routes(worker, ctx, handlers)  # as core.run() does
    route = next(r for r in worker.routes if r.path == "/v1/completions")

    class Request:  # what a route's handler reads of aiohttp's request for a JSON answer
        path = "/v1/completions"

        async def json(self) -> Any:
            return body

    called: set[str] = set()

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event == "call" and "/vastai/" in frame.f_code.co_filename:
            called.add(f"{frame.f_code.co_filename.split('/vastai/', 1)[1]}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        response = await route.handler(Request())
    finally:
        sys.setprofile(None)
    server.close()
    seen, called = sorted(called), set()
    sys.setprofile(profile)  # the control: the same trace does see the SDK's code when it runs
    try:
        worker.backend.metrics._request_id(ctx.outcomes.new(1, 1, 0.0))
    finally:
        sys.setprofile(None)
    return {"status": response.status, "body": response.body.decode(), "sdk_called": seen,
            "control_called": sorted(called)}


def main() -> int:
    os.environ.update(ENV)
    import vastai

    from app import core, sdk_config
    from config import request_path
    from control import queue_wait, sdk_seam
    from policy import guards
    from workers.llama.worker import DEFAULTS

    if "--plant" in sys.argv:
        guards.ACTIVE = tuple(reversed(guards.ACTIVE))
    cfg = core.load_config(DEFAULTS, os.environ)
    made, _ = sdk_config.build_worker_config(cfg.settings, vastai, ["word"])
    worker = vastai.Worker(made)
    ctx = core.install_parts(worker, cfg, sdk_config.endpoint_handlers(made))
    assert queue_wait.install(ctx.sdk)  # as core.run() does: the queue estimate is bakery's kept sum
    backend = worker.backend
    app = sdk_seam.WebShim(sdk_seam.real_web("probe"), ctx).Application()
    signature, engine = ctx.check_signature, ctx.call_engine
    print(json.dumps({
        "middleware": [getattr(mw, "bakery_stage", getattr(mw, "__name__", "?")) for mw in app.middlewares],
        "signature": list(request_path.chain(signature)), "signature_inner": innermost(signature),
        "engine": list(request_path.chain(engine)), "engine_inner": innermost(engine),
        "sdk_reaches_bakerys": [sdk_seam._get(backend, "check_signature") is signature,
                                sdk_seam._get(backend, "call_backend") is engine],
        "request": asyncio.run(traced_request(worker, ctx, sdk_config.endpoint_handlers(made), core.serve_routes)),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
