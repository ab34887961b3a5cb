"""The real entry point (on the lean worker venv's Python) starts the engine from an argv.

A test engine (argv_engine.py) records /proc/self/cmdline: the model and args variables must reach
it byte for byte, whatever they hold (quotes, `;`, `#`, `%`, spaces, unicode, a non-UTF-8 byte).
Control characters in a launch variable and a BACKEND that names no worker are refused before
anything starts (one line, exit 2). The engine's exit status, its output in MODEL_LOG, the
`INFO exited: <engine>` line and SIGTERM work on the engine the entry point spawned.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.image import stages
from tests.worker.helpers import HERE, WORKER_DIR

ENTRYPOINT = WORKER_DIR / "boot" / "entrypoint.py"
ARGV_ENGINE = HERE / "argv_engine.py"

# (LLAMA_MODEL, LLAMA_ARGS, the args as the engine must see them)
NASTY = [
    ("/models/m.gguf", "--chat-template 'x ;y'", [b"--chat-template", b"x ;y"]),
    ("/models/m.gguf", "--chat-template 'x #y' --alias a#b", [b"--chat-template", b"x #y", b"--alias", b"a#b"]),
    ("/models/100% ;sure #1.gguf", "--x '%(here)s' --y 100%", [b"--x", b"%(here)s", b"--y", b"100%"]),
    ("/models/ünï ∂ 模型.gguf", "--name \"it's 'quoted'\" --e '' --u 'ünï 模型'",
     [b"--name", b"it's 'quoted'", b"--e", b"", b"--u", "ünï 模型".encode()]),
    (b"/models/raw\xff\xfe.gguf", b"--b '\xff x'", [b"--b", b"\xff x"]),  # bytes that are not UTF-8
]


@pytest.fixture
def run_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="bk-argv-", dir="/tmp") as run:
        yield Path(run)


def boot_env(run_dir: Path, worker_python: Path, **extra: str | bytes) -> dict[str, str | bytes]:
    """The environment an image's entry point would see, with the test engine as the engine."""
    env: dict[str, str | bytes] = {
        "PATH": os.environ["PATH"],
        "BAKERY_RUN_DIR": str(run_dir),
        "BACKEND": "llama",
        "SERVERLESS": "false",
        "MODEL_LOG": str(run_dir / "log" / "llama.log"),
        "BAKERY_ENGINE_CMD": json.dumps([str(worker_python), str(ARGV_ENGINE), "-m", "${LLAMA_MODEL}"]),
        "BAKERY_ENGINE_ARGS_VAR": "LLAMA_ARGS",
        "LLAMA_MODEL": "/models/m.gguf",
        "LLAMA_ARGS": "",
        "BAKERY_EXIT_GRACE": "0",
        "ARGV_RECORD": str(run_dir / "argv"),
    }
    env.update(extra)
    return env


def boot(worker_python: Path, env: dict[str, str | bytes], timeout: float = 60) -> subprocess.CompletedProcess:
    """Run the entry point to its end."""
    return subprocess.run([str(worker_python), str(ENTRYPOINT)], env=env, capture_output=True,
                          timeout=timeout, check=False)


@contextlib.contextmanager
def booting(worker_python: Path, env: dict[str, str | bytes], run_dir: Path) -> Iterator[subprocess.Popen]:
    """The entry point running in the background, its output in run_dir/out; killed if a check fails first."""
    with open(run_dir / "out", "wb") as out:
        child = subprocess.Popen([str(worker_python), str(ENTRYPOINT)], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield child
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


def stop(child: subprocess.Popen, run_dir: Path) -> None:
    """SIGTERM the entry point, which must stop everything and exit 0."""
    child.send_signal(signal.SIGTERM)
    assert child.wait(40) == 0, (run_dir / "out").read_text()


def expected_cmdline(worker_python: Path, model: str | bytes, args: list[bytes]) -> bytes:
    argv = [os.fsencode(str(worker_python)), os.fsencode(str(ARGV_ENGINE)), b"-m", os.fsencode(model), *args]
    return b"\0".join(argv) + b"\0"


@pytest.mark.slow
@pytest.mark.parametrize("model, args, expected", NASTY, ids=range(len(NASTY)))
def test_launch_values_reach_the_engine_argv_byte_for_byte(worker_python: Path, run_dir: Path,
                                                           model: str | bytes, args: str | bytes,
                                                           expected: list[bytes]) -> None:
    env = boot_env(run_dir, worker_python, LLAMA_MODEL=model, LLAMA_ARGS=args, ARGV_EXIT="3")
    proc = boot(worker_python, env)
    assert (run_dir / "argv").exists(), f"the engine never ran:\n{proc.stdout.decode()}{proc.stderr.decode()}"
    _pid, cmdline = (run_dir / "argv").read_bytes().split(b"\n", 1)
    assert cmdline == expected_cmdline(worker_python, model, expected)
    # The engine's status is the container's, and the worker's error line is in MODEL_LOG.
    assert proc.returncode == 3, proc.stderr.decode()[-2000:]
    log = (run_dir / "log" / "llama.log").read_text()
    assert "argv_engine: recorded my argv\n" in log
    assert "INFO exited: llama (exit status 3; not expected)\n" in log


REFUSED = [
    ("BACKEND", "llama\n[program:evil]\ncommand=/bin/touch /tmp/evil", "control character U+000A"),
    ("BACKEND", "nope", "names no worker"),
    ("BACKEND", "", "names no worker"),
    ("BACKEND", "../llama", "names no worker"),
    ("LLAMA_MODEL", "/models/m.gguf\n[program:evil]", "control character U+000A"),
    ("LLAMA_ARGS", "--chat-template 'a\rb'", "control character U+000D"),
    ("LLAMA_ARGS", "--x \x1b[2J", "control character U+001B"),
    ("MODEL_LOG", "/var/log/x.log\ty", "control character U+0009"),
    ("LLAMA_ARGS", "--alias 'unterminated", "cannot be split"),
]


@pytest.mark.slow
@pytest.mark.parametrize("var, value, reason", REFUSED, ids=[f"{v}-{i}" for i, (v, _, _) in enumerate(REFUSED)])
def test_bad_launch_variables_are_refused_before_anything_starts(worker_python: Path, run_dir: Path, var: str,
                                                                 value: str, reason: str) -> None:
    proc = boot(worker_python, boot_env(run_dir, worker_python, **{var: value}))
    stderr = proc.stderr.decode()
    assert proc.returncode == 2, stderr
    assert stderr.startswith(f"bakery: {var}=") and reason in stderr, stderr
    assert len(stderr.splitlines()) == 1, stderr
    if var == "BACKEND":
        assert "llama, openai, sglang, vllm" in stderr or "control" in stderr
    # Nothing was written or started: no pid file, no engine, no log.
    assert not (run_dir / "llama.pid").exists() and not (run_dir / "worker.pid").exists()
    assert not (run_dir / "argv").exists() and not (run_dir / "log").exists()


@pytest.mark.slow
def test_a_missing_engine_binary_is_reported_and_ends_the_boot(worker_python: Path, run_dir: Path) -> None:
    env = boot_env(run_dir, worker_python, BAKERY_ENGINE_CMD=json.dumps(["/nonexistent/engine x", "${LLAMA_MODEL}"]))
    proc = boot(worker_python, env)
    assert proc.returncode == 127, proc.stderr.decode()[-2000:]
    log = (run_dir / "log" / "llama.log").read_text()
    assert "bakery: cannot start the engine '/nonexistent/engine x': No such file or directory" in log
    assert "INFO exited: llama (exit status 127; not expected)" in log


@pytest.mark.slow
def test_sigterm_stops_the_engine_whose_pid_holds_the_exact_argv(worker_python: Path, run_dir: Path) -> None:
    env = boot_env(run_dir, worker_python, LLAMA_ARGS="--chat-template 'x ;y'", ARGV_SLEEP="1")
    with booting(worker_python, env, run_dir) as child:
        deadline = time.monotonic() + 30
        while not (run_dir / "argv").exists() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
        assert (run_dir / "argv").exists(), (run_dir / "out").read_text()
        pid, _ = (run_dir / "argv").read_bytes().split(b"\n", 1)
        # The entry point's child is the engine itself, and its pid file says so.
        assert (run_dir / "llama.pid").read_text() == f"{int(pid)}\n"
        live = Path(f"/proc/{int(pid)}/cmdline").read_bytes()
        assert live == expected_cmdline(worker_python, "/models/m.gguf", [b"--chat-template", b"x ;y"])
        stop(child, run_dir)
    output = (run_dir / "out").read_text()
    assert f"bakery: spawned: 'llama' with pid {int(pid)}" in output, output
    assert "bakery: stopped: llama (exit status 0)" in output, output  # argv_engine exits 0 on SIGTERM
    assert not Path(f"/proc/{int(pid)}").exists()


@pytest.mark.slow
def test_the_entry_point_stamps_the_engines_load_line_when_it_is_written(worker_python: Path, run_dir: Path) -> None:
    # The engine's load stages are stamped by the entry point (logs/stages.py), which reads
    # MODEL_LOG from before the engine starts, not by a worker that may start after the engine loaded.
    env = boot_env(run_dir, worker_python, ARGV_SLEEP="1", MODEL_LOAD_LOG_MSG='["recorded my argv"]',
                   BAKERY_LOAD_BEGIN_LOG_MSGS='["argv_engine:"]')
    with booting(worker_python, env, run_dir) as child:
        deadline = time.monotonic() + 30
        while "stage engine_ready" not in (run_dir / "out").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        seen_by_test = time.time()
        stop(child, run_dir)
    output = (run_dir / "out").read_text()
    stamps = {m.group(1): float(m.group(2)) for m in stages.STAGE_LINE.finditer(output)}
    assert set(stamps) == {"load_begins", "engine_ready"}, output
    assert "bakery: stage engine_ready at" in output and "argv_engine: recorded my argv" in output, output
    written = (run_dir / "argv").stat().st_mtime  # the engine records its argv just before that line
    assert written - 0.01 <= stamps["load_begins"] <= stamps["engine_ready"] <= seen_by_test, (written, stamps)
