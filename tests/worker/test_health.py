"""The image's Docker HEALTHCHECK (worker/boot/health.py) and the worker's ready mark it reads
(control/ready_mark.py), on the host with the real SDK and the vLLM stand-in.

Under SERVERLESS=true the check follows the worker: unhealthy while the model loads, healthy once the
worker is ready, unhealthy again once it is errored. Otherwise it follows the engine's health endpoint.
The same command runs on a container in the gate (tests/image/test_gate.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tests.worker.helpers import WORKER_DIR, Harness

HEALTH = WORKER_DIR / "boot" / "health.py"
MODEL = "standin-model"
EXIT_LINE = "INFO exited: vllm"  # counts at once, also after load (late_errors.py)


def health(python: Path, **env: str) -> tuple[int, str]:
    """Run the HEALTHCHECK's command with `env` only (as Docker runs it: the container's environment)."""
    done = subprocess.run([str(python), str(HEALTH)], env={"PATH": os.environ["PATH"], **env},
                          capture_output=True, text=True, timeout=30, check=False)
    return done.returncode, done.stdout.strip() + done.stderr.strip()


def until(check: Callable[[], bool], timeout: float) -> bool:
    """Poll `check` every 0.2 s until true or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return check()


def test_serverless_health_follows_the_worker(harness: Harness, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    python = harness.worker_python
    env = {"SERVERLESS": "true", "BAKERY_RUN_DIR": str(run_dir)}
    engine = harness.standin("vllm", load_seconds=4)
    served = harness.worker("vllm", engine, MODEL_NAME=MODEL, BAKERY_RUN_DIR=str(run_dir))
    code, said = health(python, **env)
    assert code == 1 and "not ready" in said, said  # loading: not ready yet
    assert until(lambda: health(python, **env)[0] == 0, 90), \
        f"the health check never said ready: {health(python, **env)}\n{served.worker.text[-2000:]}"
    assert served.reports is not None and served.reports.wait_loaded(timeout=30)
    assert "the worker is ready" in health(python, **env)[1]
    # Errored (the engine's exit line counts at once): the mark goes, the check says unhealthy.
    with engine.log.open("a", encoding="utf-8") as log:
        log.write(f"2026-12-01 10:00:00,000 {EXIT_LINE} (exit status 1; not expected)\n")
    assert until(lambda: health(python, **env)[0] == 1, 10), \
        f"still healthy after the worker was errored: {health(python, **env)}"
    assert not (run_dir / "worker-ready").exists()


def test_engine_only_health_follows_the_engine(harness: Harness) -> None:
    python = harness.worker_python
    engine = harness.standin("vllm", load_seconds=3)
    env = {"MODEL_SERVER_URL": engine.url, "MODEL_HEALTH_ENDPOINT": "/health"}
    assert until(lambda: health(python, **env)[0] == 0, 60), f"never healthy: {health(python, **env)}"
    assert f"answers 200 at {engine.url}/health" in health(python, **env)[1]
    # SERVERLESS that is not true means engine only, whatever the run directory holds.
    assert health(python, SERVERLESS="false", **env)[0] == 0
    assert engine.proc is not None
    os.killpg(engine.proc.popen.pid, signal.SIGKILL)
    engine.proc.popen.wait(10)
    code, said = health(python, **env)
    assert code == 1 and "does not answer" in said, said


def test_a_full_health_url_is_used_as_is(harness: Harness) -> None:
    engine = harness.standin("vllm", load_seconds=0.3)
    python = harness.worker_python
    env = {"MODEL_SERVER_URL": "http://127.0.0.1:9", "MODEL_HEALTH_ENDPOINT": f"{engine.url}/health"}
    assert until(lambda: health(python, **env)[0] == 0, 60), f"never healthy: {health(python, **env)}"
