"""The worker as a process: start_server.sh rules and the failure cases, each with a real process."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.worker.helpers import (
    REPO,
    SDK_READY,
    START_SERVER,
    WORKER_DIR,
    Harness,
    free_port,
    free_port_pair,
    worker_env_for,
)

CLIENT = WORKER_DIR / "workers" / "openai" / "client.py"
BACKENDS = "llama openai sglang vllm"


def run_start_server(env: dict[str, str], script: Path = START_SERVER,
                     timeout: float = 20) -> subprocess.CompletedProcess[str]:
    """Run start_server.sh to completion with plain sh."""
    return subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=timeout, check=False)


def base_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """PATH plus `extra`: nothing inherited that could hide a missing variable."""
    import os

    return {"PATH": os.environ["PATH"], "WORKER_STATE_DIR": str(tmp_path / "state"), **extra}


# --------------------------------------------------------------------------- start_server.sh


@pytest.mark.parametrize("backend", [None, "", "nope", "../vllm", "vllm/../llama", "VLLM "])
def test_unknown_backend_exits_at_once(backend: str | None, tmp_path: Path) -> None:
    """Empty or unknown BACKEND: non-zero at once, naming the valid backends."""
    env = base_env(tmp_path, WORKER_PYTHON=sys.executable)
    if backend is not None:
        env["BACKEND"] = backend
    result = run_start_server(env, timeout=5)
    assert result.returncode == 2
    assert f"valid: {BACKENDS}" in result.stderr
    assert not (tmp_path / "state").exists()


def _worker_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "worker"
    shutil.copytree(WORKER_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_valid_backends_come_from_the_workers_directory(tmp_path: Path) -> None:
    """The list is derived from workers/*/worker.py, not hard-coded."""
    copy = _worker_copy(tmp_path)
    (copy / "workers" / "extra").mkdir()
    (copy / "workers" / "extra" / "worker.py").write_text("")
    (copy / "workers" / "nodriver").mkdir()  # no worker.py: not a backend
    result = run_start_server(base_env(tmp_path, BACKEND="nope", WORKER_PYTHON=sys.executable),
                              copy / "start_server.sh")
    assert result.returncode == 2
    assert "valid: extra llama openai sglang vllm" in result.stderr


def test_missing_worker_python(tmp_path: Path) -> None:
    """A WORKER_PYTHON that is not there: a clear message, non-zero."""
    result = run_start_server(base_env(tmp_path, BACKEND="vllm", WORKER_PYTHON=str(tmp_path / "nope" / "python")))
    assert result.returncode == 2
    assert "WORKER_PYTHON" in result.stderr


def test_runs_in_state_dir_isolated_from_engine_python(tmp_path: Path) -> None:
    """It runs workers/$BACKEND/worker.py with WORKER_PYTHON, in WORKER_STATE_DIR (created), with
    PYTHONPATH set to the worker directory alone (an engine's PYTHONPATH/PYTHONHOME are dropped)."""
    copy = _worker_copy(tmp_path)
    (copy / "workers" / "probe").mkdir()
    (copy / "workers" / "probe" / "worker.py").write_text(
        "import json, os, sys\n"
        "print(json.dumps({'cwd': os.getcwd(), 'pythonpath': os.environ.get('PYTHONPATH'),\n"
        "                  'home': os.environ.get('PYTHONHOME'), 'exe': sys.executable, 'path': sys.path}))\n")
    state = tmp_path / "deep" / "state"
    env = base_env(tmp_path, BACKEND="probe", WORKER_PYTHON=sys.executable, WORKER_STATE_DIR=str(state),
                   PYTHONPATH="/opt/engine/site-packages", PYTHONHOME="/opt/engine")
    result = run_start_server(env, copy / "start_server.sh")
    assert result.returncode == 0, result.stderr
    import json

    seen = json.loads(result.stdout)
    assert seen["cwd"] == str(state)
    assert seen["pythonpath"] == str(copy)
    assert seen["home"] is None
    assert "/opt/engine/site-packages" not in seen["path"]
    assert seen["exe"] == sys.executable


def test_start_server_is_posix_sh() -> None:
    """No bash needed: the script parses with sh -n (dash here) and has a /bin/sh shebang."""
    assert START_SERVER.read_text().startswith("#!/bin/sh\n")
    assert subprocess.run(["sh", "-n", str(START_SERVER)], check=False).returncode == 0
    if shutil.which("dash"):
        assert subprocess.run(["dash", "-n", str(START_SERVER)], check=False).returncode == 0


# --------------------------------------------------------------------------- worker failure cases


@pytest.mark.slow
@pytest.mark.parametrize("missing", ["CONTAINER_ID", "REPORT_ADDR", "WORKER_PORT", "VAST_TCP_PORT", "PUBLIC_IPADDR"])
def test_missing_platform_variable_exits_with_one_line(missing: str, tmp_path: Path, worker_python: Path) -> None:
    """The real worker: one line naming the variable, exit 2, no KeyError from the SDK."""
    port = free_port_pair()
    name = f"VAST_TCP_PORT_{port}" if missing == "VAST_TCP_PORT" else missing
    env = worker_env_for("vllm", worker_python, tmp_path / "state", port, "http://127.0.0.1:9", **{name: None})
    result = run_start_server(env, timeout=30)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("bakery-worker: error:")]
    assert len(errors) == 1
    assert errors[0].startswith(f"bakery-worker: error: {name} ")
    assert "Vast.ai platform" in errors[0]
    assert "KeyError" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_bad_numbers_warn_once_and_run(harness: Harness) -> None:
    """Bad numbers: one warning per variable naming it; the worker runs with the defaults."""
    worker = harness.worker("vllm", BENCHMARK_RUNS="abc", BENCHMARK_CONCURRENCY="0", BENCHMARK_MAX_TOKENS="-5",
                            READINESS_TIMEOUT="inf", HEALTHCHECK_PROBE_TIMEOUT="nan",
                            MODEL_LOG=str(harness.tmp / "e.log")).worker
    out = worker.wait_for("beginning log tracking")
    for var in ("BENCHMARK_RUNS", "BENCHMARK_CONCURRENCY", "BENCHMARK_MAX_TOKENS", "READINESS_TIMEOUT",
                "HEALTHCHECK_PROBE_TIMEOUT"):
        assert out.count(f"bakery-worker: warning: {var}=") == 1, var
    assert "benchmark=3x10 max_tokens=500" in out


@pytest.mark.slow
def test_empty_model_log_is_named_not_waited_for(harness: Harness) -> None:
    """MODEL_LOG='' counts as unset (upstream waited forever for a file named ''): the worker, which states
    no engine fact, names it and exits 2 (in an image the entry point sets the engine's log first)."""
    worker = harness.worker("sglang", MODEL_LOG="").worker
    assert worker.wait_exit(timeout=30) == 2
    assert "bakery-worker: error: MODEL_LOG is not set: an image bakes it" in worker.text


@pytest.mark.slow
@pytest.mark.parametrize("which", ["worker port", "SDK http port"])
def test_busy_port_exits(which: str, tmp_path: Path, worker_python: Path) -> None:
    """A listener on WORKER_PORT (or on WORKER_PORT+1, the SDK's second server): exit 3, clear message."""
    port = free_port_pair()
    taken = port if which == "worker port" else port + 1
    env = worker_env_for("vllm", worker_python, tmp_path / "state", port, "http://127.0.0.1:9",
                         MODEL_LOG=str(tmp_path / "e.log"))
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", taken))
        listener.listen()
        result = run_start_server(env, timeout=30)
    assert result.returncode == 3, result.stderr
    assert f"port {taken} is already in use" in result.stderr


@pytest.mark.slow
def test_two_workers_on_one_port_only_one_runs(harness: Harness) -> None:
    """Two workers started together on one port (the upstream double launch): exactly one runs."""
    port, log = free_port_pair(), str(harness.tmp / "e.log")
    first = harness.worker("vllm", port=port, name="first", MODEL_LOG=log).worker
    second = harness.worker("vllm", port=port, name="second", MODEL_LOG=log).worker
    winners, losers = [], []
    for proc in (first, second):
        try:
            proc.wait_for("beginning log tracking", timeout=30)
            winners.append(proc)
        except AssertionError:
            losers.append(proc)
    assert len(winners) == 1 and len(losers) == 1
    assert losers[0].wait_exit() == 3
    assert "another bakery worker already runs on port" in losers[0].text
    assert winners[0].popen.poll() is None


@pytest.mark.slow
def test_sdk_launch_failure_exits(tmp_path: Path, worker_python: Path) -> None:
    """USE_SSL=true without /etc/instance.crt: the SDK cannot launch; the worker exits instead of looping."""
    if Path("/etc/instance.crt").exists():
        pytest.fail("this host has /etc/instance.crt: the test needs it absent")
    port = free_port_pair()
    env = worker_env_for("vllm", worker_python, tmp_path / "state", port, "http://127.0.0.1:9", USE_SSL="true",
                         MODEL_LOG=str(tmp_path / "e.log"))
    result = run_start_server(env, timeout=30)
    assert result.returncode == 4, result.stderr
    assert "bakery-worker: error: Worker Server failed to launch" in result.stderr


@pytest.mark.slow
def test_real_sdk_without_readiness_runs_in_log_mode(harness: Harness, worker_python: Path) -> None:
    """vastai 1.9.1 has no readiness settings: READINESS=healthcheck is reported ignored, once."""
    check = subprocess.run([str(worker_python), "-c",
                            "import inspect, vastai; print(sorted(inspect.signature(vastai.WorkerConfig).parameters))"],
                           capture_output=True, text=True, check=True)
    assert "readiness" not in check.stdout
    worker = harness.worker("vllm", READINESS="healthcheck", MODEL_LOG=str(harness.tmp / "e.log")).worker
    out = worker.wait_for("beginning log tracking")
    assert out.count("READINESS=healthcheck ignored") == 1
    assert "readiness: logs" in out


@pytest.mark.slow
def test_demo_client(harness: Harness) -> None:
    """client.py (host python, stdlib) sends a completion and a chat through the worker; 1 on failure."""
    served = harness.worker("vllm", harness.standin("vllm"), VLLM_MODEL="standin-model")
    served.worker.wait_for(SDK_READY, timeout=60)
    port = served.port
    for extra in ([], ["--stream"]):
        result = subprocess.run([sys.executable, str(CLIENT), f"http://127.0.0.1:{port}", "--max-tokens", "8", *extra],
                                capture_output=True, text=True, timeout=60, check=False, cwd=REPO)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0].startswith("/v1/completions: Stand-in answer:")
        assert lines[1].startswith("/v1/chat/completions: Stand-in answer:")
    dead = subprocess.run([sys.executable, str(CLIENT), f"http://127.0.0.1:{free_port()}"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert dead.returncode == 1
    assert "request failed" in dead.stderr
