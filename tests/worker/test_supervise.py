"""The entry point's supervision (worker/boot/supervise.py), with real child processes on the host.

tests/worker/supervised.py runs the loop as an image's PID 1 would (a child subreaper); the engine
and the worker are small programs that record what happens to them. Checked: the stop order on
SIGTERM (worker drained first, engine after), the engine's own end (its exit line in MODEL_LOG,
the grace, its status), the worker's own end, a SIGKILL when a stop takes too long, an engine that
cannot start, a death by signal, and orphans reaped. Nothing is bounded by a sleep: each test waits
for a recorded event, with a generous deadline that only ends a hung run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.worker.helpers import HERE

DRIVER = HERE / "supervised.py"
# A child that records its life in $REC: "<name> <event>" lines. Modes: run (until SIGTERM, then exit 0),
# slow-stop (takes 0.5 s to exit after SIGTERM), deaf (ignores SIGTERM), exitN (exits N once the
# names in argv[3] have started: a stop must find their SIGTERM handlers in place), orphan (leaves a
# grandchild whose pid goes to $ORPHAN, then runs).
CHILD = r"""
import os, signal, sys, time
name, mode = sys.argv[1], sys.argv[2]
def rec(what):
    with open(os.environ["REC"], "a") as out:
        out.write(f"{name} {what}\n")
def on_term(*_):
    rec("got SIGTERM")
    if mode == "slow-stop":
        time.sleep(0.5)
    rec("exits")
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "deaf" else on_term)
if mode == "orphan":
    os.system("sleep 0.2 & echo $! > " + os.environ["ORPHAN"])
rec("started")
if mode.startswith("exit"):
    others = {f"{other} started" for other in sys.argv[3:]}
    while not others <= set(open(os.environ["REC"]).read().splitlines()):
        time.sleep(0.01)
    sys.exit(int(mode[4:]))
while True:
    time.sleep(0.05)
"""


def child(name: str, mode: str, *after: str) -> list[str]:
    return [sys.executable, "-c", CHILD, name, mode, *after]


class Run:
    """One supervised run: its plan, its output, its record."""

    def __init__(self, tmp: Path, engine: list[str], worker: list[str] | None, grace: float = 0.0,
                 worker_stop: float = 10.0, engine_stop: float = 10.0, **boot: bool) -> None:
        self.tmp = tmp
        self.rec, self.log, self.out = tmp / "rec", tmp / "engine.log", tmp / "out"
        plan = {"name": "engine", "argv": engine, "log": str(self.log), "worker": worker, "grace": grace,
                "worker_stop": worker_stop, "engine_stop": engine_stop, "pid_dir": str(tmp), **boot}
        (tmp / "plan.json").write_text(json.dumps(plan))
        env = {**os.environ, "REC": str(self.rec), "ORPHAN": str(tmp / "orphan")}
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, str(DRIVER), str(tmp / "plan.json")], env=env,
                                         stdout=out, stderr=subprocess.STDOUT)

    def records(self) -> list[str]:
        return self.rec.read_text().splitlines() if self.rec.exists() else []

    def wait_for(self, *events: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not set(events) <= set(self.records()):
            assert time.monotonic() < deadline and self.proc.poll() is None, (self.records(), self.output())
            time.sleep(0.02)

    def finish(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout)

    def output(self) -> str:
        return self.out.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for name in ("engine", "worker"):  # its children too, whatever a failed check left
            pid_file = self.tmp / f"{name}.pid"
            if pid_file.exists():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid_file.read_text()), signal.SIGKILL)


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[list[Run]]:
    started: list[Run] = []
    yield started
    for run in started:
        run.kill()


def start(runs: list[Run], tmp: Path, *args: object, **kwargs: object) -> Run:
    run = Run(tmp, *args, **kwargs)
    runs.append(run)
    return run


def test_sigterm_drains_the_worker_before_the_engine_is_stopped(runs: list[Run], tmp_path: Path) -> None:
    run = start(runs, tmp_path, child("engine", "run"), child("worker", "slow-stop"))
    run.wait_for("engine started", "worker started")
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 0, run.output()
    assert run.records()[2:] == ["worker got SIGTERM", "worker exits", "engine got SIGTERM", "engine exits"]
    out = run.output()
    assert out.index("bakery: stopped: worker (exit status 0)") < out.index("bakery: stopping engine") \
        < out.index("bakery: stopped: engine (exit status 0)"), out
    assert "INFO exited" not in run.log.read_text()  # a stop we asked for is not the engine's failure


def test_a_stop_signal_while_booting_ends_the_boot_before_anything_starts(runs: list[Run], tmp_path: Path) -> None:
    """The entry point holds the stop signals from its first line (as PID 1 an unhandled SIGTERM is
    dropped, and `docker stop` would wait its whole timeout): one that came meanwhile stops the boot."""
    run = start(runs, tmp_path, child("engine", "run"), child("worker", "run"), stopped_while_booting=True)
    assert run.finish() == 0, run.output()
    assert "bakery: SIGTERM received before the engine started: nothing started, exiting" in run.output()
    assert run.records() == [] and not (tmp_path / "engine.pid").exists()


def test_held_stop_signals_reach_the_loop_and_no_child_inherits_them_held(runs: list[Run], tmp_path: Path) -> None:
    run = start(runs, tmp_path, child("engine", "run"), child("worker", "run"), held=True)
    run.wait_for("engine started", "worker started")
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 0, run.output()
    assert {"worker got SIGTERM", "engine got SIGTERM"} <= set(run.records())


def test_pid_files_and_spawn_lines_name_the_children(runs: list[Run], tmp_path: Path) -> None:
    run = start(runs, tmp_path, child("engine", "run"), child("worker", "run"))
    run.wait_for("engine started", "worker started")
    pids = {name: int((tmp_path / f"{name}.pid").read_text()) for name in ("engine", "worker")}
    for name, pid in pids.items():
        assert f"bakery: spawned: '{name}' with pid {pid}" in run.output()
        assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[-3:-1] == [name.encode(), b"run"]
    run.proc.send_signal(signal.SIGINT)
    assert run.finish() == 0, run.output()


def test_an_engine_that_ends_is_written_to_its_log_and_ends_the_container_with_its_status(
        runs: list[Run], tmp_path: Path) -> None:
    run = start(runs, tmp_path, child("engine", "exit3", "worker"), child("worker", "run"), grace=0.3)
    assert run.finish() == 3, run.output()
    assert run.log.read_text() == "INFO exited: engine (exit status 3; not expected)\n"
    out = run.output()
    assert out.index("bakery: exited: engine (exit status 3; not expected)") \
        < out.index("stopping the container in 0.3 s") < out.index("bakery: stopped: worker (exit status 0)"), out
    assert run.records()[-2:] == ["worker got SIGTERM", "worker exits"]


def test_a_worker_that_ends_stops_the_engine_and_the_container_takes_its_status(runs: list[Run],
                                                                               tmp_path: Path) -> None:
    run = start(runs, tmp_path, child("engine", "run"), child("worker", "exit4", "engine"))
    assert run.finish() == 4, run.output()
    assert run.records()[-2:] == ["engine got SIGTERM", "engine exits"]
    assert "bakery: exited: worker (exit status 4; not expected)" in run.output()
    assert run.log.read_text() == ""


def test_a_worker_that_ignores_sigterm_is_killed_after_its_stop_time(runs: list[Run], tmp_path: Path) -> None:
    run = start(runs, tmp_path, child("engine", "run"), child("worker", "deaf"), worker_stop=0.5)
    run.wait_for("engine started", "worker started")
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 0, run.output()
    out = run.output()
    assert out.index("bakery: worker did not stop in time: SIGKILL") \
        < out.index("bakery: stopped: worker (terminated by SIGKILL)") < out.index("bakery: stopping engine"), out
    assert run.records()[-2:] == ["engine got SIGTERM", "engine exits"]


def test_an_engine_that_cannot_start_is_reported_like_one_that_ended(runs: list[Run], tmp_path: Path) -> None:
    run = start(runs, tmp_path, ["/nonexistent/engine x", "--serve"], child("worker", "run"))
    assert run.finish() == 127, run.output()
    assert run.log.read_text() == ("bakery: cannot start the engine '/nonexistent/engine x': No such file or "
                                   "directory\nINFO exited: engine (exit status 127; not expected)\n")
    assert not (tmp_path / "engine.pid").exists()
    not_runnable = tmp_path / "engine.sh"
    not_runnable.write_text("#!/bin/sh\n")  # not executable
    (tmp_path / "again").mkdir()
    again = start(runs, tmp_path / "again", [str(not_runnable)], None)
    assert again.finish() == 126, again.output()
    assert "Permission denied" in again.output()


def test_an_engine_killed_by_a_signal_gives_128_plus_its_number(runs: list[Run], tmp_path: Path) -> None:
    run = start(runs, tmp_path, child("engine", "run"), None, grace=5)
    run.wait_for("engine started")
    os.kill(int((tmp_path / "engine.pid").read_text()), signal.SIGKILL)
    assert run.finish() == 128 + signal.SIGKILL, run.output()
    assert "bakery: exited: engine (terminated by SIGKILL; not expected)" in run.output()
    assert run.log.read_text() == "INFO exited: engine (terminated by SIGKILL; not expected)\n"
    assert "stopping the container in" not in run.output()  # no worker to wait for: no grace


def test_orphans_are_reaped(runs: list[Run], tmp_path: Path) -> None:
    run = start(runs, tmp_path, child("engine", "orphan"), None)
    run.wait_for("engine started")
    orphan = int((tmp_path / "orphan").read_text())
    status = Path(f"/proc/{orphan}/status")
    deadline = time.monotonic() + 30
    while status.exists() and time.monotonic() < deadline:  # a zombie keeps its /proc entry until reaped
        time.sleep(0.02)
    assert not status.exists(), status.read_text()
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 0, run.output()
