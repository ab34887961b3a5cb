"""Run the engine and the worker as children of the entry point (PID 1), and end the container with them.

Both are spawned by posix_spawn: no interpreter starts between the entry point's checks and the engine's exec.
On a stop signal the worker drains first, then the engine stops; when one exits on its own the other is
stopped, and every child is reaped. Standard library only. See docs/image.md, "The entry point".
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
EXIT_LINE = "INFO exited: {name} ({how}; {reason})\n"  # bakery.spec.engine_spec.EXIT_LINE's grammar
NOT_FOUND, NOT_RUNNABLE = 127, 126  # a shell's statuses for a command it cannot find / cannot run


@dataclass
class Program:
    """One child: its name, pid (None once it has ended or never started), and stop deadline."""

    name: str
    pid: int | None
    kill_at: float | None = None  # when a SIGTERM it was sent turns into a SIGKILL
    signalled: bool = False  # whether we asked it to stop (its exit is then expected)


def describe(status: int) -> tuple[str, int]:
    """A wait status as supervisord words it ('exit status 3', 'terminated by SIGKILL') and as an exit
    code (a signal's death is 128 + its number, as a shell reports it)."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"terminated by {name}", 128 + number
    code = os.waitstatus_to_exitcode(status)
    return f"exit status {code}", code


class CannotStart(Exception):
    """The engine's command could not be started; `status` is what a shell would exit with."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def spawn_engine(argv: list[str], log: str, env: Mapping[str, str], say: Callable[[str], None]) -> int:
    """Start the engine with its output appended to `log`, and return its pid. CannotStart (after one
    line saying why, in the log too) when it cannot: 127 when the command is not found, else 126."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)  # close-on-exec: only dup2 passes it
    try:
        return os.posix_spawnp(argv[0], argv, env, file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, fd, 1), (os.POSIX_SPAWN_DUP2, fd, 2)], setsigmask=())
    except OSError as exc:
        line = f"bakery: cannot start the engine {argv[0]!r}: {exc.strerror}"
        os.write(fd, (line + "\n").encode("utf-8", "backslashreplace"))
        say(line)
        raise CannotStart(NOT_FOUND if exc.errno == errno.ENOENT else NOT_RUNNABLE) from None
    finally:
        os.close(fd)


def spawn_worker(argv: list[str], env: Mapping[str, str]) -> int:
    """Start the worker with the container's output (its lines are the container's log)."""
    return os.posix_spawn(argv[0], argv, env, file_actions=[(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0)],
                          setsigmask=())


class Supervisor:
    """The entry point's loop over its two children; `run()` returns the container's exit status."""

    def __init__(self, engine: Program, worker: Program | None, log: str, *, grace: float, worker_stop: float,
                 engine_stop: float = 30.0, say: Callable[[str], None] = print) -> None:
        self.engine, self.worker, self.log = engine, worker, log
        self.grace, self.worker_stop, self.engine_stop = grace, worker_stop, engine_stop
        self.say = say
        self.status: int | None = None  # the status of whichever program ended first on its own
        self.stopping = False
        self.stop_at: float | None = None  # the end of the grace after the engine's own exit
        self.requested: int | None = None  # a stop signal received, handled by the loop

    # ----------------------------------------------------------------------------------- events
    def exited(self, program: Program, status: int) -> None:
        """`program` ended with wait status `status`."""
        how, code = describe(status)
        program.pid, program.kill_at = None, None
        if program.signalled:
            self.say(f"bakery: stopped: {program.name} ({how})")
        else:
            self.say(f"bakery: exited: {program.name} ({how}; not expected)")
        if program is self.engine and not program.signalled:
            self.engine_ended(how, code)
        elif program is self.worker and not self.stopping:
            if self.status is None:
                self.status = code
            self.begin_stop()
        elif program is self.worker:
            self.stop_engine()

    def not_started(self, status: int) -> None:
        """The engine's command could not be started (CannotStart): as if it had exited with `status`."""
        self.engine.pid = None
        self.say(f"bakery: exited: {self.engine.name} (exit status {status}; not expected)")
        self.engine_ended(f"exit status {status}", status)

    def engine_ended(self, how: str, code: int) -> None:
        """The engine ended on its own (or never started): tell the worker, give it the grace, then stop."""
        with open(self.log, "a", encoding="utf-8", errors="backslashreplace") as out:
            out.write(EXIT_LINE.format(name=self.engine.name, how=how, reason="not expected"))
        if self.stopping:
            return
        if self.status is None:
            self.status = code
        if self.worker is not None and self.worker.pid is not None and self.grace > 0:
            self.say(f"bakery: the engine {self.engine.name} ended ({how}); stopping the container in "
                     f"{self.grace:g} s, once the worker has reported it")
            self.stop_at = time.monotonic() + self.grace
        else:
            self.begin_stop()

    def begin_stop(self) -> None:
        """Stop the worker first (it drains), then the engine."""
        if self.stopping:
            return
        self.stopping, self.stop_at = True, None
        if self.worker is not None and self.worker.pid is not None:
            self.terminate(self.worker, self.worker_stop)
        else:
            self.stop_engine()

    def stop_engine(self) -> None:
        if self.engine.pid is not None:
            self.terminate(self.engine, self.engine_stop)

    def terminate(self, program: Program, seconds: float) -> None:
        program.signalled = True
        program.kill_at = time.monotonic() + seconds
        self.say(f"bakery: stopping {program.name} (SIGTERM, SIGKILL after {seconds:g} s)")
        self.send(program, signal.SIGTERM)

    @staticmethod
    def send(program: Program, signum: int) -> None:
        if program.pid is not None:
            with contextlib.suppress(ProcessLookupError):  # ended: its status is reaped next
                os.kill(program.pid, signum)

    # ------------------------------------------------------------------------------------- loop
    def reap(self) -> None:
        """Collect every ended child: ours are handled, orphans re-parented to PID 1 are dropped."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for program in (self.engine, self.worker):
                if program is not None and program.pid == pid:
                    self.exited(program, status)

    def act_on_deadlines(self) -> float | None:
        """Act on the deadlines that have passed (the grace's end: stop; a stop time: SIGKILL), and
        return the seconds until the next one (None: none pending)."""
        now = time.monotonic()
        if self.stop_at is not None and now >= self.stop_at:
            self.begin_stop()
        deadlines = [self.stop_at] if self.stop_at is not None else []
        for program in (self.worker, self.engine):
            if program is None or program.pid is None or program.kill_at is None:
                continue
            if now >= program.kill_at:
                self.say(f"bakery: {program.name} did not stop in time: SIGKILL")
                self.send(program, signal.SIGKILL)
                program.kill_at = None
            else:
                deadlines.append(program.kill_at)
        return max(min(deadlines) - now, 0.0) if deadlines else None

    def alive(self) -> bool:
        return any(p is not None and p.pid is not None for p in (self.engine, self.worker))

    def run(self, wake_fd: int) -> int:
        """Loop until both programs have ended; `wake_fd` is the signal wake-up pipe's read end."""
        while True:
            self.reap()
            if self.requested is not None:
                self.say(f"bakery: {signal.Signals(self.requested).name} received: stopping the container")
                self.requested = None
                self.begin_stop()
            timeout = self.act_on_deadlines()
            if not self.alive():
                return self.status if self.status is not None else 0
            ready, _, _ = select.select([wake_fd], [], [], timeout)
            if ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_fd, 512)

    def install(self) -> int:
        """Catch the stop signals and SIGCHLD through a wake-up pipe; returns its read end. Call before
        spawning: a signal caught by Python is reset to its default in the child's exec."""
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        os.set_blocking(write_end, False)
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)

        def stop(signum: int, _frame: object) -> None:
            if self.requested is None and not self.stopping:
                self.requested = signum

        for sig in STOP_SIGNALS:
            signal.signal(sig, stop)
        signal.signal(signal.SIGCHLD, lambda _s, _f: None)  # only to wake the loop
        # The entry point held the stop signals from its first line: one that came meanwhile is handled now.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        return read_end


def run_programs(name: str, argv: list[str], log: str, worker_argv: list[str] | None, *, grace: float,
                 worker_stop: float, engine_stop: float, env: Mapping[str, str], pid_dir: Path | None = None,
                 before_spawn: Callable[[], None] = lambda: None, say: Callable[[str], None] = print) -> int:
    """Spawn the engine `name` (then the worker, when `worker_argv` is given) with the environment `env`,
    supervise both until they have ended, and return the container's exit status. `pid_dir` gets
    `<name>.pid` and `worker.pid`; `before_spawn` runs once the signals are caught, right before the engine starts."""
    supervisor = Supervisor(Program(name, None), Program("worker", None) if worker_argv else None, log,
                            grace=grace, worker_stop=worker_stop, engine_stop=engine_stop, say=say)
    wake_fd = supervisor.install()
    if supervisor.requested is not None:  # stopped while booting: there is nothing to start or stop
        say(f"bakery: {signal.Signals(supervisor.requested).name} received before the engine started: "
            "nothing started, exiting")
        return 0
    before_spawn()
    failed: CannotStart | None = None
    try:
        supervisor.engine.pid = spawn_engine(argv, log, env, say)
    except CannotStart as exc:
        failed = exc
    else:
        started(supervisor.engine, pid_dir, say)
    if supervisor.worker is not None and worker_argv is not None:
        supervisor.worker.pid = spawn_worker(worker_argv, env)
        started(supervisor.worker, pid_dir, say)
    if failed is not None:  # after the worker's start: it reads the exit line and reports the failure
        supervisor.not_started(failed.status)
    return supervisor.run(wake_fd)


def started(program: Program, pid_dir: Path | None, say: Callable[[str], None]) -> None:
    """Say that `program` runs (supervisord's wording, which the gate reads) and write its pid file."""
    if pid_dir is not None:
        (pid_dir / f"{program.name}.pid").write_text(f"{program.pid}\n", encoding="ascii")
    say(f"bakery: spawned: '{program.name}' with pid {program.pid}")
