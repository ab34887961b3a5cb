#!/usr/bin/env python3
"""Bench the shared worker on this host: how fast it listens, and how fast it is ready after a load line.

    python3 bench/worker_bench.py [--runs 5] [--engine standin|llama]

Each run starts a fresh worker (worker/start_server.sh, the lean venv of bakery.host.downloads, the
offline platform environment, a local report server) and measures:
- start -> listening: from spawning start_server.sh to a TCP connect succeeding on WORKER_PORT;
- load line -> ready: the engine is already serving; the load line is appended to MODEL_LOG at T0,
  and "ready" is the SDK's own log line `... marking model as loaded`, printed after the benchmark
  (warm-up + 1 run of 1 request, BENCHMARK_MAX_TOKENS=8) and the first health check passed.
The engine is the project's vLLM stand-in (bases/standin; default: measures the worker, not a model) or the real
llama.cpp with SmolLM2 (`--engine llama`). Prints median/min/max in a table. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bakery.host import downloads  # noqa: E402 (after the repo root is on sys.path)
from tests.worker.helpers import (  # noqa: E402
    SDK_READY,
    Proc,
    ReportServer,
    free_port,
    free_port_pair,
    start_llama,
    start_standin,
    start_worker,
    worker_env_for,
)

LOAD_LINES = {"standin": "INFO:     Application startup complete.", "llama": "srv  init: model loaded"}


def _pubkey(python: Path) -> str:
    code = "from Crypto.PublicKey import RSA; print(RSA.generate(1024).publickey().export_key().decode())"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout


def _wait_listening(port: int, proc: Proc, timeout: float = 30.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            sock.settimeout(0.2)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return time.monotonic()
        if proc.popen.poll() is not None:
            raise SystemExit(f"worker exited {proc.popen.returncode}:\n{proc.text[-2000:]}")
        time.sleep(0.002)
    raise SystemExit(f"worker not listening on {port} after {timeout} s:\n{proc.text[-2000:]}")


def _wait_output(proc: Proc, pattern: str, timeout: float = 120.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pattern in proc.text:
            return time.monotonic()
        if proc.popen.poll() is not None:
            raise SystemExit(f"worker exited {proc.popen.returncode}:\n{proc.text[-2000:]}")
        time.sleep(0.002)
    raise SystemExit(f"no {pattern!r} after {timeout} s:\n{proc.text[-2000:]}")


def one_run(workdir: Path, engine: str, python: Path, report: ReportServer) -> tuple[float, float]:
    """(start -> listening, load line -> ready) in seconds for one fresh worker."""
    procs: list[Proc] = []
    try:
        engine_port, port = free_port(), free_port_pair()
        engine_out = workdir / "engine.out"
        if engine == "llama":
            start_llama(downloads.xllamacpp_python(), downloads.smollm2_model_path(), engine_port, engine_out, procs)
            procs[-1].wait_for("model loaded", timeout=120)
        else:
            start_standin("vllm", engine_port, engine_out, procs, model="smollm2", load_seconds=0)
            procs[-1].wait_for("Application startup complete.", timeout=30)
        log = workdir / "model.log"  # the engine is up; the worker sees its load line only at T0
        log.write_text("engine starting\n")
        env = worker_env_for("vllm", python, workdir / "state", port, report.url, MODEL_LOG=str(log),
                             MODEL_SERVER_URL=f"http://127.0.0.1:{engine_port}", MODEL_NAME="smollm2",
                             MODEL_LOAD_LOG_MSG=LOAD_LINES[engine])
        started = time.monotonic()
        worker = start_worker(workdir, env, procs)
        listening = _wait_listening(port, worker)
        worker.wait_for("Opening log file", timeout=30)
        t0 = time.monotonic()
        with log.open("a") as handle:
            handle.write(f"0.01.000.000 I {LOAD_LINES[engine]}\n")
        ready = _wait_output(worker, SDK_READY)
        return listening - started, ready - t0
    finally:
        for proc in reversed(procs):
            proc.stop()


def main() -> int:
    """Run the bench and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--engine", choices=("standin", "llama"), default="standin")
    args = parser.parse_args()
    python = downloads.host_worker_venv() / "bin" / "python"
    report = ReportServer(_pubkey(python))
    listen, ready = [], []
    try:
        for run in range(1, args.runs + 1):
            with tempfile.TemporaryDirectory(prefix="bakery-worker-bench-") as tmp:
                a, b = one_run(Path(tmp), args.engine, python, report)
            listen.append(a)
            ready.append(b)
            print(f"run {run}: start->listening {a:.3f} s, load line->ready {b:.3f} s", flush=True)
    finally:
        report.close()
    print()
    print(f"worker bench: {args.runs} runs, engine={args.engine}, benchmark 1 run x 1 request (+warm-up), "
          f"max_tokens 8, Python {sys.version_info[0]}.{sys.version_info[1]} lean venv")
    print(f"{'measure':<28}{'median':>10}{'min':>10}{'max':>10}")
    for name, values in (("start -> listening (s)", listen), ("load line -> ready (s)", ready)):
        print(f"{name:<28}{statistics.median(values):>10.3f}{min(values):>10.3f}{max(values):>10.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
