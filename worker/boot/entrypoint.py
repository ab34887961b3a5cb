"""The image's entry point: check the launch, then run the engine (and the worker) as its children.

It checks the launch variables, rotates MODEL_LOG (no load line from an earlier boot can make the worker
ready) and spawns the engine as an argv (no shell sees a value), then the worker; supervise.py keeps it PID 1.
Runs on the worker's own Python, standard library only. See docs/image.md, "The entry point".
"""

from __future__ import annotations

import signal

# First of all: hold the stop signals until supervise.py's handlers are in (it unblocks them then). As
# PID 1 with no handler, the kernel drops a SIGTERM outright, and `docker stop` then waits its whole
# timeout for a SIGKILL; held, it waits pending and stops the boot once the handlers are there. Only
# the interpreter's own start (~15 ms) comes before this line.
if __name__ == "__main__":  # not when a test imports this module: its children would inherit the mask
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})

import fcntl
import json
import math
import re
import shlex
import sys
import unicodedata
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

sys.path.insert(0, str(Path(__file__).resolve().parent))  # supervise.py, also when loaded by path (tests)
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the worker's stdlib-only config and stages
import driver
import supervise

from config import table

WORKER_DIR = Path(__file__).resolve().parent.parent
RUN_DIR = Path(table.read(table.snapshot(), "BAKERY_RUN_DIR"))
READY_MARK = "worker-ready"  # the worker's readiness for health.py (control/ready_mark.py)
TOKEN = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")
VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
BACKEND_NAME = re.compile(r"^[A-Za-z0-9_]+$")  # the set start_server.sh accepts too
# The engine's program name: its log lines (`spawned: '<name>'`, `INFO exited: <name>`) and RUN_DIR/<name>.pid.
PROGRAM_NAME = re.compile(r"^[a-z0-9_-]+$")
RESERVED_PROGRAMS = {"worker"}
# The engine program the image bakes from its spec (bakery.spec.engine_facts.PROGRAM_VAR): the entry point
# needs no table of engines, and BACKEND=<an alias> still runs the image's own engine program.
PROGRAM_VAR = "BAKERY_ENGINE_PROGRAM"
GENERIC_WORKER = "workers/openai/generic.py"  # what an engine without an adapter of its own runs
DEFAULT_DRAIN = table.BY_NAME["BAKERY_DRAIN_TIMEOUT"].default  # the engine alone: no worker to drain
WORKER_STOP_MARGIN = 2  # seconds beyond the drain for the worker to exit before it is killed
ENGINE_STOP_SECONDS = 30.0  # from the engine's SIGTERM to its SIGKILL


class BootError(Exception):
    """A launch problem the operator must fix; printed as one line, exit status 2."""


def single_line(name: str, value: str) -> str:
    """Return `value` if it holds no control character (newline, tab, ESC, DEL, C1...), else refuse it."""
    for char in value:
        if unicodedata.category(char) == "Cc":
            raise BootError(f"{name}={value!r} contains the control character U+{ord(char):04X}: "
                            f"launch variables must be one line of printable text")
    return value


def launch(env: Mapping[str, str] | None) -> Mapping[str, str]:
    """The launch's variables: `env`, or the table's snapshot of the environment (the one reader of it)."""
    return table.snapshot() if env is None else env


def raw(env: Mapping[str, str] | None, name: str) -> str:
    """`name`'s text as the table reads it ('' when unset or blank), refused if it holds a control character."""
    return single_line(name, table.value(launch(env), name) or "")


def flag(name: str, env: Mapping[str, str] | None = None) -> bool:
    """A boolean launch variable by its row (strictly: a typo must not silently mean false)."""
    errors: list[str] = []
    value = table.read({name: raw(env, name)}, name, errors=errors)
    if errors:
        raise BootError(errors[0])
    return bool(value)


def baked_program(env: Mapping[str, str] | None = None) -> str:
    """The engine program the image bakes (BAKERY_ENGINE_PROGRAM); '' when absent."""
    return raw(env, PROGRAM_VAR).strip()


def backends(env: Mapping[str, str] | None = None) -> list[str]:
    """The worker backends this image has: workers/<name>/worker.py, and the baked program when the
    generic worker runs it (an engine without an adapter of its own, as start_server.sh does)."""
    names = {p.parent.name for p in (WORKER_DIR / "workers").glob("*/worker.py")}
    program = baked_program(env)
    if program and BACKEND_NAME.match(program) and (WORKER_DIR / GENERIC_WORKER).is_file():
        names.add(program)
    return sorted(names)


def backend(env: Mapping[str, str] | None = None) -> str:
    """BACKEND, which must name a worker of this image exactly (no blank, no path, no control character)."""
    value = single_line("BACKEND", launch(env).get("BACKEND", ""))
    if not BACKEND_NAME.match(value) or value not in backends(env):
        raise BootError(f"BACKEND={value!r} names no worker of this image: set BACKEND to one of "
                        f"{', '.join(backends(env)) or '(none found)'}")
    return value


def engine_name(backend_name: str, env: Mapping[str, str] | None = None) -> str:
    """The engine's program name: the baked BAKERY_ENGINE_PROGRAM, whatever BACKEND a launch
    template picks (an alias BACKEND still runs the image's own program); BACKEND itself when not baked."""
    name = baked_program(env) or backend_name
    if not PROGRAM_NAME.match(name) or name in RESERVED_PROGRAMS:
        source = f"{PROGRAM_VAR}={name!r}" if baked_program(env) else f"BACKEND={backend_name!r}"
        raise BootError(f"{source} cannot name the engine program (lowercase letters, "
                        f"digits, _ and - only, not {', '.join(sorted(RESERVED_PROGRAMS))})")
    return name


def model_log(engine: str, env: Mapping[str, str] | None = None) -> Path:
    """MODEL_LOG, where the engine's output goes and the worker reads; blank counts as unset."""
    value = raw(env, "MODEL_LOG")
    if not value:
        value = f"/var/log/portal/{engine}.log"
        table.export("MODEL_LOG", value)  # the worker must read the same file
    path = Path(value)
    if not path.is_absolute():
        raise BootError(f"MODEL_LOG={value!r} must be an absolute path")
    return path


def engine_argv(env: Mapping[str, str] | None = None) -> list[str]:
    """The engine's command: BAKERY_ENGINE_CMD with ${VAR} tokens filled, plus the ARGS variable split.

    A model variable becomes exactly one argument, byte for byte; the ARGS variable is split like a
    POSIX shell would (quotes group, nothing is expanded), and each piece is passed as it is.
    """
    cmd = table.value(launch(env), "BAKERY_ENGINE_CMD") or ""
    try:
        template = json.loads(cmd)
        if not (isinstance(template, list) and template and all(isinstance(a, str) for a in template)):
            raise ValueError
    except ValueError:
        raise BootError(f"BAKERY_ENGINE_CMD={cmd!r} is not a JSON list of strings: rebuild the image") from None
    argv = []
    for arg in template:
        single_line("BAKERY_ENGINE_CMD", arg)
        match = TOKEN.match(arg)
        if match:
            name = match.group(1)
            value = single_line(name, launch(env).get(name, ""))  # byte for byte: blanks are a value here
            if not value:
                raise BootError(f"{name} is not set: the launch template must set it (the model to serve)")
            argv.append(value)
        else:
            argv.append(arg)
    args_var = table.text(launch(env), "BAKERY_ENGINE_ARGS_VAR") or ""
    if args_var and not VAR_NAME.match(args_var):
        raise BootError(f"BAKERY_ENGINE_ARGS_VAR={args_var!r} is not a variable name: rebuild the image")
    extra = raw(env, args_var) if args_var else ""
    try:
        argv += shlex.split(extra)
    except ValueError as exc:
        raise BootError(f"{args_var}={extra!r} cannot be split into arguments: {exc}") from None
    return argv


def rotate(log: Path) -> None:
    """Keep the previous boot's log as <log>.1 and start this boot with an empty one."""
    log.parent.mkdir(parents=True, exist_ok=True)
    if log.exists() and log.stat().st_size > 0:
        log.replace(log.with_name(log.name + ".1"))
    log.write_bytes(b"")


def seconds(name: str, env: Mapping[str, str] | None = None) -> float:
    """A number-of-seconds variable the entry point shares with the worker (BAKERY_DRAIN_TIMEOUT, the
    worker's stop must cover it; BAKERY_EXIT_GRACE), read by its row and rule in config/table.py."""
    errors: list[str] = []
    value = table.read({name: raw(env, name)}, name, errors=errors)
    if errors:
        raise BootError(errors[0])
    return value


def watch_stages(log: Path, env: Mapping[str, str]) -> None:
    """Stamp the engine's load stages as its log shows them (logs/stages.py), from before it
    starts: the worker may start after the engine has loaded, and its start must not pass for the
    engine's. Lines go to the container's log; a failure here never stops the boot."""
    try:
        from logs import stages

        stages.start_watch(log, env, say)
    except Exception as exc:  # noqa: BLE001 - a report, not a reason to stop the boot
        say(f"bakery: the load's stages are not stamped: {exc}", sys.stderr)


REFUSED_STATUS = 3  # the engine was refused (an older driver than the image's CUDA line needs)


def driver_verdict(env: Mapping[str, str]) -> driver.Verdict:
    """The host's driver against the image's baked CUDA floor (boot/driver.py), read through the table."""
    errors: list[str] = []
    floor = table.read(env, "BAKERY_CUDA_MIN_DRIVER", errors=errors)
    if errors:
        raise BootError(f"{errors[0]}: rebuild the image")
    version, found = driver.read_version(Path(table.read(env, "BAKERY_DRIVER_VERSION_FILE")))
    return driver.decide(version, found, table.text(env, "BAKERY_CUDA_VERSION"), floor)


def refuse(engine: str, log: Path, verdict: driver.Verdict, *, exit_line: bool) -> None:
    """Put the refusal in MODEL_LOG, and with `exit_line` the engine's exit line (a baked error line, which
    makes the worker report itself errored; under SERVERLESS supervise.py writes it when the slot exits)."""
    with open(log, "a", encoding="utf-8") as out:
        out.write(verdict.line + "\n")
        if exit_line:
            out.write(supervise.EXIT_LINE.format(name=engine, how=f"exit status {REFUSED_STATUS}",
                                                 reason="refused: driver below the image's CUDA floor"))


def main() -> int:
    """Boot the container; returns the exit status of the program that ended first."""
    try:
        # Every launch variable is checked before anything is written or started, from one snapshot.
        env = table.snapshot()
        serverless = flag("SERVERLESS", env)
        engine = engine_name(backend(env), env)
        log = model_log(engine, env)
        argv = engine_argv(env)
        drain = seconds("BAKERY_DRAIN_TIMEOUT", env) if serverless else DEFAULT_DRAIN
        grace = seconds("BAKERY_EXIT_GRACE", env)
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        lock = open(RUN_DIR / "entrypoint.lock", "w")  # noqa: SIM115 - held for the process lifetime
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BootError("the entry point is already running in this container: one engine, one worker") from None
        verdict = driver_verdict(env)
        rotate(log)
    except BootError as exc:
        say(f"bakery: {exc}", sys.stderr)
        return 2
    say(verdict.line, sys.stdout if verdict.start else sys.stderr)
    if not verdict.start:
        refuse(engine, log, verdict, exit_line=not serverless)
        if not serverless:
            return REFUSED_STATUS
        # The worker still starts, alone, to report the refusal (the exit line above is a baked error line);
        # in the engine's slot a process that only exits, so the usual exit grace then stops the container.
        argv = [sys.executable, "-c", f"raise SystemExit({REFUSED_STATUS})"]
    for stale in (READY_MARK, f"{engine}.pid", "worker.pid"):  # nothing of an earlier boot counts
        (RUN_DIR / stale).unlink(missing_ok=True)
    mode = "serverless: engine + worker on :3000" if serverless else "engine only (SERVERLESS is not true)"
    say(f"bakery: starting {engine} ({mode}); engine output -> {log}")
    table.export("BAKERY_ENGINE_PROGRAM", engine)

    worker = ["/bin/sh", str(WORKER_DIR / "start_server.sh")] if serverless else None
    # The stage watch starts reading MODEL_LOG before the engine writes its first line.
    return supervise.run_programs(engine, argv, str(log), worker, grace=grace,
                                  worker_stop=math.ceil(drain) + WORKER_STOP_MARGIN, engine_stop=ENGINE_STOP_SECONDS,
                                  pid_dir=RUN_DIR, before_spawn=lambda: watch_stages(log, env),
                                  env=table.snapshot(), say=say)


def say(line: str, stream: TextIO | None = None) -> None:
    """One line to the container's log, at once (the gate reads their Docker timestamps), in one write:
    the worker writes to the same pipe, and a line split in two writes could be glued to one of its."""
    out = stream or sys.stdout
    out.write(line + "\n")
    out.flush()


if __name__ == "__main__":
    sys.exit(main())
