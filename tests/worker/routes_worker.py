"""Test-only launcher: the worker (core.run) with the route table wired in, as core.py will wire it.

    PYTHONPATH=worker <worker venv>/bin/python tests/worker/routes_worker.py vllm|sglang|llama

core.py does not call workers/openai/routes.py yet (issue 15: another change to core.py is in
flight). This launcher replaces core.build_worker_config with the few lines core.py is to gain, so
the routes, uploads and workloads are proven through the real SDK and real processes now. Everything
else (settings, ports, logging, readiness) is core's own.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from workers.openai import core, routes


def build_worker_config(settings: core.Settings, sdk: Any, words: list[str]) -> tuple[Any, str]:
    """core.build_worker_config, with the handlers from routes.handler_specs()."""
    try:
        route_settings = routes.load_route_settings(os.environ)
    except routes.RouteConfigError as exc:
        for line in exc.lines:
            print(f"bakery-worker: error: {line}", file=sys.stderr, flush=True)
        raise SystemExit(core.EXIT_CONFIG) from None
    for warning in route_settings.warnings:
        print(f"bakery-worker: warning: {warning}", file=sys.stderr, flush=True)
    for line in routes.startup_lines(route_settings):
        print(line, flush=True)
    specs = routes.handler_specs(
        route_settings, words=words, model_id=settings.model_id, max_tokens=settings.benchmark_max_tokens,
        runs=routes.env_overrides(os.environ, "BENCHMARK_RUNS", settings.benchmark_runs),
        concurrency=routes.env_overrides(os.environ, "BENCHMARK_CONCURRENCY", settings.benchmark_concurrency))
    handlers = routes.sdk_handlers(specs, sdk, core.MAX_QUEUE_TIME)
    extra, note = core.readiness_kwargs(settings, sdk.WorkerConfig)
    config = sdk.WorkerConfig(
        model_server_url=settings.server_base,
        model_server_port=settings.server_port,
        model_log_file=settings.model_log,
        model_healthcheck_url=settings.healthcheck_url,
        handlers=handlers,
        log_action_config=sdk.LogActionConfig(on_load=settings.load_lines, on_error=settings.error_lines,
                                              on_info=settings.info_lines),
        **extra,
    )
    return config, note


if __name__ == "__main__":
    engine = sys.argv[1] if len(sys.argv) > 1 else "vllm"
    defaults = importlib.import_module(f"workers.{engine}.worker").DEFAULTS
    core.build_worker_config = build_worker_config
    core.run(defaults)
