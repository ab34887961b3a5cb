"""Run inside a worker venv (PYTHONPATH=worker/): import everything the worker uses at run time.

    <venv>/bin/python import_probe.py [--block MODULE ...]

Imports vastai (and fails if its try/except turned the serverless names into None), every module
of vastai.serverless.server, the worker's core and engine modules, builds the real WorkerConfig
and Worker for each engine (which wires the SDK's backend, metrics and handlers), and prints a JSON
object: the distributions whose modules were loaded. `--block` makes a module unimportable first,
to prove the probe notices a missing dependency. Exit 1 with the ImportError on failure.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import pkgutil
import sys


def main() -> int:
    """Import, build, report."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--block", action="append", default=[])
    args = parser.parse_args()
    for name in args.block:
        sys.modules[name] = None  # type: ignore[assignment]  (import of it now raises ImportError)

    try:
        import vastai

        names = ("Worker", "WorkerConfig", "HandlerConfig", "BenchmarkConfig", "LogActionConfig")
        swallowed = [n for n in names if getattr(vastai, n) is None]
        if swallowed:
            # vastai/__init__ hid an ImportError: import its parts again to surface it.
            for module in ("vastai.serverless.server.worker", "vastai.sync.client", "vastai.async_.client",
                           "vastai.serverless.remote"):
                importlib.import_module(module)
            raise ImportError(f"vastai left {swallowed} as None")
        import vastai.serverless.server as server_pkg

        for info in pkgutil.walk_packages(server_pkg.__path__, server_pkg.__name__ + "."):
            importlib.import_module(info.name)
        from app import core, worker_config
        from policy import signed_first  # noqa: F401 (msgspec: imported as the worker imports it)

        for engine in ("vllm", "sglang", "llama", "openai"):
            defaults = importlib.import_module(f"workers.{engine}.worker").DEFAULTS
            env = {"CONTAINER_ID": "1", "REPORT_ADDR": "http://127.0.0.1:9", "PUBLIC_IPADDR": "127.0.0.1",
                   "WORKER_PORT": "3000", "VAST_TCP_PORT_3000": "3000", "MODEL_NAME": "m",
                   **{k: v for k, v in os.environ.items() if k.startswith("MODEL_")}}  # the baked facts
            settings = worker_config.load_settings(defaults, env)
            config, _ = core.build_worker_config(settings, vastai, core.load_words())
            os.environ.update(env)
            vastai.Worker(config)
    except ImportError as err:
        print(f"ImportError: {err}", file=sys.stderr)
        return 1

    packages = importlib.metadata.packages_distributions()
    loaded = set()
    for dist in {dist for mod in list(sys.modules) for dist in packages.get(mod.split(".")[0], [])}:
        # setuptools puts its vendored packages (packaging, jaraco.*) on sys.path: they are its own.
        where = str(importlib.metadata.distribution(dist).locate_file(""))
        loaded.add("setuptools" if "/setuptools/_vendor" in where else dist)
    loaded = sorted(loaded)
    print(json.dumps({"loaded": loaded}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
