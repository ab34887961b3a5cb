"""The image's entry point: prepare the boot, then run the engine (and the worker) under supervisord.

At every boot it checks the launch variables (no control character anywhere, a BACKEND that names
a worker), rotates MODEL_LOG (so a load line from an earlier boot can never make the worker ready),
builds the engine's argv from the baked BAKERY_ENGINE_CMD and the launch template's variables and
writes it as JSON to RUN_DIR/engine.json, which launch.py (supervisord's fixed engine command)
reads and execs; a thread stamps the engine's load stages as MODEL_LOG shows them. No launch text
ever enters supervisord's ini: its values are our own paths and program names from a strict set.
It stays PID 1 to forward SIGTERM/SIGINT to supervisord and to exit with the status of whichever
program died first (recorded by watch.py). Runs on the worker's own Python (stdlib + supervisor).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

RUN_DIR = Path(os.environ.get("BAKERY_RUN_DIR", "/run/bakery"))
SOCKET = RUN_DIR / "supervisor.sock"  # supervisord's control socket (watch.py and wake() use it)
ENGINE_FILE = RUN_DIR / "engine.json"  # the engine's argv and log, read by launch.py
READY_MARK = "worker-ready"  # the worker's readiness for health.py (workers/openai/ready_mark.py)
WORKER_DIR = Path(__file__).resolve().parent.parent
BOOT_DIR = Path(__file__).resolve().parent
VENV_PYTHON = sys.executable
TOKEN = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")
VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
BACKEND_NAME = re.compile(r"^[A-Za-z0-9_]+$")  # the set start_server.sh accepts too
PROGRAM_NAME = re.compile(r"^[a-z0-9_-]+$")  # supervisord program names: never launch text
# Our own paths that go into the ini: nothing supervisord's parser could read as syntax (; # % =).
INI_PATH = re.compile(r"^/[A-Za-z0-9._/+-]+$")
RESERVED_PROGRAMS = {"worker", "bakery-watch"}
TRUE, FALSE = {"true", "1", "yes"}, {"false", "0", "no", ""}
# The engine program the image bakes from its spec (bakery.spec.engine_facts.PROGRAM_VAR): the entry point
# needs no table of engines, and BACKEND=<an alias> still runs the image's own engine program.
PROGRAM_VAR = "BAKERY_ENGINE_PROGRAM"
GENERIC_WORKER = "workers/openai/generic.py"  # what an engine without an adapter of its own runs
DEFAULT_DRAIN = 8.0  # workers/openai/drain.py's default, for a caller that does not pass one
WORKER_STOP_MARGIN = 2  # seconds beyond the drain for the worker to exit before supervisord kills it


class BootError(Exception):
    """A launch problem the operator must fix; printed as one line, exit status 2."""


def single_line(name: str, value: str) -> str:
    """Return `value` if it holds no control character (newline, tab, ESC, DEL, C1...), else refuse it."""
    for char in value:
        if unicodedata.category(char) == "Cc":
            raise BootError(f"{name}={value!r} contains the control character U+{ord(char):04X}: "
                            f"launch variables must be one line of printable text")
    return value


def flag(name: str) -> bool:
    """Read a boolean launch variable strictly: a typo must not silently mean false."""
    value = single_line(name, os.environ.get(name, "")).strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise BootError(f"{name}={os.environ[name]!r} is neither true nor false: set {name}=true or false")


def baked_program() -> str:
    """The engine program the image bakes (BAKERY_ENGINE_PROGRAM); '' when absent."""
    return single_line(PROGRAM_VAR, os.environ.get(PROGRAM_VAR, "")).strip()


def backends() -> list[str]:
    """The worker backends this image has: workers/<name>/worker.py, and the baked program when the
    generic worker runs it (an engine without an adapter of its own, as start_server.sh does)."""
    names = {p.parent.name for p in (WORKER_DIR / "workers").glob("*/worker.py")}
    program = baked_program()
    if program and BACKEND_NAME.match(program) and (WORKER_DIR / GENERIC_WORKER).is_file():
        names.add(program)
    return sorted(names)


def backend() -> str:
    """BACKEND, which must name a worker of this image exactly (no blank, no path, no control character)."""
    value = single_line("BACKEND", os.environ.get("BACKEND", ""))
    if not BACKEND_NAME.match(value) or value not in backends():
        raise BootError(f"BACKEND={value!r} names no worker of this image: set BACKEND to one of "
                        f"{', '.join(backends()) or '(none found)'}")
    return value


def engine_name(backend_name: str) -> str:
    """The engine's supervisord program name: the baked BAKERY_ENGINE_PROGRAM, whatever BACKEND a launch
    template picks (an alias BACKEND still runs the image's own program); BACKEND itself when not baked."""
    name = baked_program() or backend_name
    if not PROGRAM_NAME.match(name) or name in RESERVED_PROGRAMS:
        source = f"{PROGRAM_VAR}={name!r}" if baked_program() else f"BACKEND={backend_name!r}"
        raise BootError(f"{source} cannot name the engine program (lowercase letters, "
                        f"digits, _ and - only, not {', '.join(sorted(RESERVED_PROGRAMS))})")
    return name


def model_log(engine: str) -> Path:
    """MODEL_LOG, where the engine's output goes and the worker reads; empty counts as unset."""
    value = single_line("MODEL_LOG", os.environ.get("MODEL_LOG", ""))
    if not value:
        value = f"/var/log/portal/{engine}.log"
        os.environ["MODEL_LOG"] = value  # the worker must read the same file
    path = Path(value)
    if not path.is_absolute():
        raise BootError(f"MODEL_LOG={value!r} must be an absolute path")
    return path


def engine_argv() -> list[str]:
    """The engine's command: BAKERY_ENGINE_CMD with ${VAR} tokens filled, plus the ARGS variable split.

    A model variable becomes exactly one argument, byte for byte; the ARGS variable is split like a
    POSIX shell would (quotes group, nothing is expanded), and each piece is passed as it is.
    """
    raw = os.environ.get("BAKERY_ENGINE_CMD", "")
    try:
        template = json.loads(raw)
        if not (isinstance(template, list) and template and all(isinstance(a, str) for a in template)):
            raise ValueError
    except ValueError:
        raise BootError(f"BAKERY_ENGINE_CMD={raw!r} is not a JSON list of strings: rebuild the image") from None
    argv = []
    for arg in template:
        single_line("BAKERY_ENGINE_CMD", arg)
        match = TOKEN.match(arg)
        if match:
            name = match.group(1)
            value = single_line(name, os.environ.get(name, ""))
            if not value:
                raise BootError(f"{name} is not set: the launch template must set it (the model to serve)")
            argv.append(value)
        else:
            argv.append(arg)
    args_var = os.environ.get("BAKERY_ENGINE_ARGS_VAR", "")
    if args_var and not VAR_NAME.match(args_var):
        raise BootError(f"BAKERY_ENGINE_ARGS_VAR={args_var!r} is not a variable name: rebuild the image")
    extra = single_line(args_var, os.environ.get(args_var, "")) if args_var else ""
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


def write_engine_file(argv: list[str], log: Path, path: Path | None = None) -> Path:
    """Write the engine's argv and log file as JSON for launch.py (root-only: it is the engine's command).

    ensure_ascii keeps any byte the environment held (as surrogate escapes) exact through the file.
    """
    path = path or ENGINE_FILE
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        json.dump({"argv": argv, "log": str(log)}, out, ensure_ascii=True)
    tmp.replace(path)
    return path


def _ini_path(path: Path | str) -> str:
    text = str(path)
    if not INI_PATH.match(text):
        raise BootError(f"the path {text!r} cannot go into supervisord's configuration "
                        f"(letters, digits and ._/+- only): install bakery elsewhere or set BAKERY_RUN_DIR")
    return text


def _worker_path() -> None:
    """Let the entry point import the worker's stdlib-only modules (config, stages)."""
    if str(WORKER_DIR) not in sys.path:
        sys.path.insert(0, str(WORKER_DIR))


def drain_seconds() -> float:
    """BAKERY_DRAIN_TIMEOUT, read by the worker's own row and rule (workers/openai/config.py): the worker's
    stopwaitsecs must cover it."""
    _worker_path()
    from workers.openai import config

    name = "BAKERY_DRAIN_TIMEOUT"
    errors: list[str] = []
    seconds = config.read({name: single_line(name, os.environ.get(name, ""))}, name, errors=errors)
    if errors:
        raise BootError(errors[0])
    return seconds


def supervisor_config(engine: str, serverless: bool, drain: float = DEFAULT_DRAIN) -> str:
    """The supervisord configuration for this boot: fixed commands, our paths, strict program names.

    Stop order: supervisord stops programs in reverse priority order, each to its end before the
    next, so on SIGTERM the worker (priority 200) stops first, draining its requests in flight for up
    to `drain` seconds (its stopwaitsecs leaves 2 s more before a SIGKILL), and the engine (priority
    100) is stopped only after that, while no request needs it any more.
    """
    if not PROGRAM_NAME.match(engine) or engine in RESERVED_PROGRAMS:
        raise BootError(f"{engine!r} is not a valid engine program name")
    python = _ini_path(VENV_PYTHON)
    # -I: the launcher and the listener run on the worker's Python, which a launch template's
    # PYTHONPATH/PYTHONHOME (meant for the engine) must not reach; the engine still inherits them.
    program = f"""
[program:{engine}]
command={python} -I {_ini_path(BOOT_DIR / "launch.py")} {_ini_path(ENGINE_FILE)}
; launch.py sends the engine's output to MODEL_LOG itself; only its own failure lines come here
stdout_logfile=/dev/stdout
stdout_logfile_maxbytes=0
redirect_stderr=true
autorestart=false
startsecs=0
startretries=0
priority=100
stopwaitsecs=30
"""
    worker = f"""
[program:worker]
command=/bin/sh {_ini_path(WORKER_DIR / "start_server.sh")}
stdout_logfile=/dev/stdout
stdout_logfile_maxbytes=0
redirect_stderr=true
autorestart=false
startsecs=0
startretries=0
priority=200
stopwaitsecs={math.ceil(drain) + WORKER_STOP_MARGIN}
"""
    return f"""[supervisord]
nodaemon=true
user=root
; in the foreground supervisord already logs to stdout: a logfile would print every line twice
logfile=/dev/null
logfile_maxbytes=0
pidfile={_ini_path(RUN_DIR / "supervisord.pid")}

; watch.py asks supervisord (over this socket) for a dead program's exit status, which the
; PROCESS_STATE_EXITED event itself does not carry.
[unix_http_server]
file={_ini_path(SOCKET)}
chmod=0700

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl=unix://{_ini_path(SOCKET)}
{program}{worker if serverless else ""}
[eventlistener:bakery-watch]
command={python} -I {_ini_path(BOOT_DIR / "watch.py")}
events=PROCESS_STATE_EXITED,PROCESS_STATE_FATAL
stdout_logfile=NONE
stderr_logfile=/dev/stderr
stderr_logfile_maxbytes=0
"""


# supervisor.getState as one XML-RPC call over HTTP/1.0 (the server closes after its answer).
STATE_CALL = (b"<?xml version='1.0'?><methodCall><methodName>supervisor.getState</methodName>"
              b"<params></params></methodCall>")
STATE_REQUEST = (b"POST /RPC2 HTTP/1.0\r\nContent-Type: text/xml\r\nContent-Length: %d\r\n\r\n"
                 % len(STATE_CALL)) + STATE_CALL


def _ask_state(sock: Path, timeout: float) -> bytes:
    """supervisord's raw answer to getState over its control socket; raises OSError until it listens."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(str(sock))
        conn.sendall(STATE_REQUEST)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
        return answer


def wake(child: subprocess.Popen, sock: Path, timeout: float = 5.0) -> bool:
    """Ask supervisord for its state as soon as its control socket answers; True once it has.

    supervisord spawns its programs only after its main loop's first poll, which waits up to 1 s
    for an event: this call is that event, so the engine and the worker start ~1 s sooner. It is
    only a speed-up: if supervisord does not answer in time, it still starts them after that poll.
    The call is written by hand on a plain socket: supervisor's own client (xmlrpc, http.client,
    email) costs PID 1 ~0.1 s of CPU to import, taken from supervisord's start on a busy machine.
    """
    deadline = time.monotonic() + timeout
    while child.poll() is None and time.monotonic() < deadline:
        try:
            answer = _ask_state(sock, max(deadline - time.monotonic(), 0.01))
        except OSError:  # the socket is not there or not listening yet
            time.sleep(0.005)
            continue
        return b"<string>RUNNING</string>" in answer
    return False


def watch_stages(log: Path) -> None:
    """Stamp the engine's load stages as its log shows them (workers/openai/stages.py), from before it
    starts: the worker may start after the engine has loaded, and its start must not pass for the
    engine's. Lines go to the container's log; a failure here never stops the boot."""
    try:
        _worker_path()
        from workers.openai import stages

        stages.start_watch(log, os.environ, lambda line: print(line, flush=True))
    except Exception as exc:  # noqa: BLE001 - a report, not a reason to stop the boot
        print(f"bakery: the load's stages are not stamped: {exc}", file=sys.stderr, flush=True)


def main() -> int:
    """Boot the container; returns the exit status of the program that died first."""
    try:
        # Every launch variable is checked before anything is written or started.
        serverless = flag("SERVERLESS")
        engine = engine_name(backend())
        log = model_log(engine)
        argv = engine_argv()
        config_text = supervisor_config(engine, serverless, drain_seconds() if serverless else DEFAULT_DRAIN)
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        lock = open(RUN_DIR / "entrypoint.lock", "w")  # noqa: SIM115 - held for the process lifetime
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BootError("the entry point is already running in this container: one engine, one worker") from None
        rotate(log)
    except BootError as exc:
        print(f"bakery: {exc}", file=sys.stderr, flush=True)
        return 2
    status_file = RUN_DIR / "exit-status"
    status_file.unlink(missing_ok=True)
    (RUN_DIR / READY_MARK).unlink(missing_ok=True)  # the health check never counts an earlier boot's
    write_engine_file(argv, log)
    config = RUN_DIR / "supervisord.conf"
    config.write_text(config_text, encoding="utf-8")
    mode = "serverless: engine + worker on :3000" if serverless else "engine only (SERVERLESS is not true)"
    print(f"bakery: starting {engine} ({mode}); engine output -> {log}", flush=True)
    os.environ["BAKERY_ENGINE_PROGRAM"] = engine
    supervisord = str(Path(VENV_PYTHON).with_name("supervisord"))
    child = subprocess.Popen([supervisord, "-c", str(config)])
    # Started while supervisord imports (~0.15 s before it spawns the engine), so it takes nothing
    # from the boot and is reading the log well before the engine's first line.
    watch_stages(log)

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    wake(child, SOCKET)
    code = child.wait()
    if status_file.exists():
        return int(status_file.read_text().strip() or 1)
    return code


if __name__ == "__main__":
    sys.exit(main())
