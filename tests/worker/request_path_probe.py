"""Run inside the worker venv (PYTHONPATH=worker/): the request path a real SDK Worker runs.

    <venv>/bin/python request_path_probe.py [--plant]

Builds a Worker as core.run() does (core.install_parts: every guard, serving part and engine-call layer)
and prints, as one JSON object, the stages it runs: aiohttp.web's middlewares in the order the app made
through the guards' web shim has them, the layers of the signature check and of the engine call,
outermost first, and what the innermost layer of each wraps. --plant installs the guards in the reverse
of their order (a reordering planted in the code): tests/worker/test_request_path.py must see it.
"""

from __future__ import annotations

import json
import os
import sys

ENV = {"CONTAINER_ID": "5", "REPORT_ADDR": "http://127.0.0.1:9", "PUBLIC_IPADDR": "203.0.113.7",
       "WORKER_PORT": "3000", "VAST_TCP_PORT_3000": "41234", "USE_SSL": "false", "UNSECURED": "false"}


def innermost(outer: object) -> str:
    """The name of what the last tagged layer of a chain wraps (the SDK's own method, or a bakery layer)."""
    while getattr(outer, "bakery_stage", None) is not None:
        outer = getattr(outer, "__wrapped__", None)
    return getattr(outer, "__name__", type(outer).__name__)


def main() -> int:
    os.environ.update(ENV)
    import vastai

    from app import core, sdk_config
    from config import request_path
    from control import sdk_seam
    from policy import guards
    from workers.llama.worker import DEFAULTS

    if "--plant" in sys.argv:
        guards.ACTIVE = tuple(reversed(guards.ACTIVE))
    cfg = core.load_config(DEFAULTS, os.environ)
    made, _ = sdk_config.build_worker_config(cfg.settings, vastai, ["word"])
    worker = vastai.Worker(made)
    ctx = core.install_parts(worker, cfg, sdk_config.endpoint_handlers(made))
    backend = worker.backend
    app = sdk_seam.WebShim(sdk_seam.real_web("probe"), ctx).Application()
    signature = sdk_seam.get(backend, "check_signature")
    engine = sdk_seam.get(backend, "call_backend")
    print(json.dumps({
        "middleware": [getattr(mw, "bakery_stage", getattr(mw, "__name__", "?")) for mw in app.middlewares],
        "signature": list(request_path.chain(signature)), "signature_inner": innermost(signature),
        "engine": list(request_path.chain(engine)), "engine_inner": innermost(engine),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
