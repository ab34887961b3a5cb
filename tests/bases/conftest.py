"""Fixtures for tests/bases: the Docker engine (required under CI), the bases, containers, stand-ins.

Docker tests: under CI=true a missing or unreachable Docker engine FAILS (a check that did not run is
not a pass); elsewhere those tests skip. Containers are started detached, addressed by id, and
removed at teardown.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from bakery.paths import BASES_DIR, REPO_ROOT
from tests.ports import free_port

STANDIN_DIR = BASES_DIR / "standin"
IN_CI = os.environ.get("CI") == "true"


# ---------------------------------------------------------------------------------------------------
# Docker


@pytest.fixture(scope="session")
def docker_client() -> Any:
    """A reachable Docker engine: missing Docker fails under CI=true, skips elsewhere."""
    try:
        import docker

        client = docker.from_env(timeout=600)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - ImportError or any connection failure means "no Docker"
        message = f"the Docker engine is not reachable ({exc.__class__.__name__}: {exc})"
        if IN_CI:
            pytest.fail(f"{message}: Docker is required under CI=true", pytrace=False)
        pytest.skip(message)
    return client


def _base(name: str) -> Callable[[Any], str]:
    def fixture(docker_client: Any) -> str:
        from bakery.bases.make import ensure_base

        return ensure_base(name)

    return fixture


debian_image = pytest.fixture(scope="session")(_base("debian"))
nopython_image = pytest.fixture(scope="session")(_base("debian-nopython"))
vllm_image = pytest.fixture(scope="session")(_base("vllm-standin"))
sglang_image = pytest.fixture(scope="session")(_base("sglang-standin"))
llama_image = pytest.fixture(scope="session")(_base("llama-cpp"))


@pytest.fixture
def containers(docker_client: Any) -> Iterator[Callable[..., Any]]:
    """Start detached containers (`run(image, command, **kwargs)`); all are removed at teardown."""
    started: list[Any] = []

    def run(image: str, command: list[str] | None = None, **kwargs: Any) -> Any:
        container = docker_client.containers.run(image, command, detach=True, **kwargs)
        started.append(container)
        return container

    yield run
    for container in started:
        with contextlib.suppress(Exception):
            container.remove(force=True)


def sh(container: Any, script: str) -> tuple[int, str]:
    """Run `/bin/sh -c script` in a running container: (exit code, stdout+stderr)."""
    code, out = container.exec_run(["/bin/sh", "-c", script])
    return code, out.decode(errors="replace")


def logs(container: Any) -> str:
    return container.logs(stdout=True, stderr=True).decode(errors="replace")


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------------
# Stand-in processes on the host


@dataclass
class StandinProc:
    """A stand-in running on the host; `lines` collects its output (stderr merged into stdout, so in
    the order it was written: the stand-in writes each line whole and flushes it)."""

    proc: subprocess.Popen[str]
    port: int
    lines: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def text(self) -> str:
        with self.lock:
            return "\n".join(self.lines)

    def wait_line(self, needle: str, timeout: float = 15.0) -> None:
        def seen() -> bool:
            if needle in self.text:
                return True
            if self.proc.poll() is not None:
                time.sleep(0.2)  # let the readers drain
                if needle in self.text:
                    return True
                raise AssertionError(f"exited {self.proc.returncode} before {needle!r}:\n{self.text}")
            return False

        wait_for(seen, timeout, f"{needle!r} in the stand-in's output", interval=0.05)

    def wait_exit(self, timeout: float = 15.0) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s:\n{self.text}") from None
        time.sleep(0.1)
        return code

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
def standin() -> Iterator[Callable[..., StandinProc]]:
    """Start a stand-in on the host: `standin(argv, env=None, port=None)` with argv like
    ["vllm", "serve", "m"] (run_standin.py's syntax) or ["-m", "vllm.entrypoints.openai.api_server", ...].
    `{port}` in argv is replaced by a free port. Processes are stopped at teardown."""
    procs: list[StandinProc] = []

    def start(argv: list[str], env: dict[str, str] | None = None, port: int | None = None) -> StandinProc:
        port = port or free_port()
        args = [a.replace("{port}", str(port)) for a in argv]
        cmd = [sys.executable, *args] if args[0] == "-m" else [sys.executable,
                                                               str(STANDIN_DIR / "run_standin.py"), *args]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("STANDIN_")}
        full_env.update({"PYTHONPATH": str(STANDIN_DIR), "STANDIN_LOAD_SECONDS": "0.3",
                         **(env or {})})
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=full_env, cwd=REPO_ROOT)
        sp = StandinProc(proc, port)

        def reader(stream: Any) -> None:
            for line in stream:
                with sp.lock:
                    sp.lines.append(line.rstrip("\n"))

        threading.Thread(target=reader, args=(proc.stdout,), daemon=True).start()
        procs.append(sp)
        return sp

    yield start
    for sp in procs:
        if sp.proc.poll() is None:
            sp.proc.send_signal(signal.SIGTERM)
            try:
                sp.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                sp.proc.kill()
                sp.proc.wait()
