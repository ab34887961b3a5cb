#!/usr/bin/env python3
"""The vastai SDK's serverless worker with nothing of bakery's: the baseline for the proxy overhead.

Run by bench/run.py inside an image, with the image's worker Python (/opt/bakery/venv/bin/python),
next to the shipped worker, on its own port (WORKER_PORT, e.g. 3100). It configures the SDK the way
its own documentation does (two OpenAI routes proxied in parallel, a benchmark on /v1/completions,
log-line readiness) and nothing else: no request parser, no workload calculator, no extra log
handler, no supervisord, output to a file. What the shipped worker costs on top of this is ours.
"""

from __future__ import annotations

import json
import os

from vastai import BenchmarkConfig, HandlerConfig, LogActionConfig, Worker, WorkerConfig


def _lines(name: str) -> list[str]:
    raw = os.environ.get(name, "").strip()
    return json.loads(raw) if raw.startswith("[") else [s for s in raw.splitlines() if s.strip()]


def main() -> None:
    """Configure and run the bare SDK worker (never returns)."""
    model = os.environ.get("VLLM_MODEL") or "standin/tiny-chat"
    benchmark = BenchmarkConfig(generator=lambda: {"prompt": "hello " * 50, "max_tokens": 8, "model": model},
                                runs=1, concurrency=1)
    config = WorkerConfig(
        model_server_url="http://127.0.0.1",
        model_server_port=18000,
        model_log_file=os.environ["MODEL_LOG"],
        model_healthcheck_url="http://127.0.0.1:18000/health",
        handlers=[
            HandlerConfig(route="/v1/completions", allow_parallel_requests=True, max_queue_time=600.0,
                          benchmark_config=benchmark),
            HandlerConfig(route="/v1/chat/completions", allow_parallel_requests=True, max_queue_time=600.0),
        ],
        log_action_config=LogActionConfig(on_load=_lines("MODEL_LOAD_LOG_MSG"),
                                          on_error=_lines("MODEL_ERROR_LOG_MSGS")),
    )
    Worker(config).run()


if __name__ == "__main__":
    main()
