"""The entry point wakes supervisord so the engine and the worker start without its first 1 s poll.

Runs the real supervisord of the lean worker venv on the host, from the entry point's own
configuration; exact checks on supervisord's answers, no timings.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from tests.worker.helpers import WORKER_DIR

SCRIPT = r"""
import importlib.util, json, os, subprocess, sys, time
from pathlib import Path
spec = importlib.util.spec_from_file_location("entrypoint", sys.argv[1])
ep = importlib.util.module_from_spec(spec); spec.loader.exec_module(ep)
ep.RUN_DIR.mkdir(parents=True, exist_ok=True)
config = ep.RUN_DIR / "supervisord.conf"
ep.write_engine_file([sys.executable, "-c", "import time; time.sleep(60)"], ep.RUN_DIR / "engine.log")
config.write_text(ep.supervisor_config("engine", False))
sock = Path(sys.argv[2])
child = subprocess.Popen([str(Path(sys.executable).with_name("supervisord")), "-c", str(config)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    woke = ep.wake(child, sock, timeout=float(sys.argv[3]))
    from supervisor import childutils
    info = childutils.getRPCInterface({"SUPERVISOR_SERVER_URL": f"unix://{ep.SOCKET}"}).supervisor.getProcessInfo("engine")
    print(json.dumps({"woke": woke, "state": info["statename"], "started": info["start"]}))
finally:
    child.terminate()
    try:
        child.wait(40)
    except subprocess.TimeoutExpired:
        child.kill()
"""


def run_wake(worker_python: Path, sock: Path | None = None, timeout: float = 10) -> dict:
    # A short run dir: a unix socket's path must fit in 108 bytes (pytest's tmp_path may not).
    with tempfile.TemporaryDirectory(prefix="bk-wake-", dir="/tmp") as run:
        env = {**os.environ, "BAKERY_RUN_DIR": run}
        proc = subprocess.run([str(worker_python), "-c", SCRIPT, str(WORKER_DIR / "boot" / "entrypoint.py"),
                               str(sock or Path(run) / "supervisor.sock"), str(timeout)],
                              env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_wake_has_supervisord_spawn_the_programs_before_it_answers(worker_python: Path) -> None:
    """When supervisord answers the wake-up call, it has already spawned the autostart programs:
    the wake-up ended its first poll, which otherwise waits 1 s before spawning anything."""
    got = run_wake(worker_python)
    assert got["woke"] is True
    assert got["state"] in {"STARTING", "RUNNING"} and got["started"] > 0


def test_wake_gives_up_quietly_on_a_socket_that_never_answers(worker_python: Path, tmp_path: Path) -> None:
    """A wrong socket only costs the speed-up (False after the timeout); supervisord still starts
    the programs on its own."""
    got = run_wake(worker_python, sock=tmp_path / "nowhere.sock", timeout=1)
    assert got["woke"] is False
    assert got["state"] in {"STARTING", "RUNNING"}
