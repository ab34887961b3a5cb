"""Fixtures for the worker's host tests (helpers live in tests/worker/helpers.py).

Session resources (the lean worker venv, the real llama.cpp venv and model) are built through
bakery.host.downloads and cached under the bakery cache; when one cannot be made the tests error out
(no skip hides a missing dependency).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bakery.host import downloads as worker_env
from tests.worker.helpers import Proc, ReportServer


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker used here (pyproject.toml belongs to the whole repo)."""
    config.addinivalue_line("markers", "slow: runs real worker processes (seconds each); still runs by default")


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """A list to register processes in; all are stopped at the end of the test."""
    started: list[Proc] = []
    yield started
    for proc in reversed(started):
        proc.stop()


@pytest.fixture(scope="session")
def worker_venv() -> Path:
    """The lean worker venv (exactly worker/requirements.txt), built offline from the wheelhouse."""
    return worker_env.host_worker_venv()


@pytest.fixture(scope="session")
def worker_python(worker_venv: Path) -> Path:
    """The worker venv's Python (what WORKER_PYTHON points at)."""
    return worker_venv / "bin" / "python"


@pytest.fixture(scope="session")
def pubkey_pem(worker_python: Path) -> str:
    """A real RSA public key (PEM) for the report server's /pubkey/, made with the venv's pycryptodome."""
    code = "from Crypto.PublicKey import RSA; print(RSA.generate(1024).publickey().export_key().decode())"
    return subprocess.run([str(worker_python), "-c", code], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def report_server(pubkey_pem: str) -> Iterator[ReportServer]:
    """A fresh report server for one test."""
    server = ReportServer(pubkey_pem)
    yield server
    server.close()


@pytest.fixture(scope="session")
def llama_python() -> Path:
    """Python of a venv with the real llama.cpp server (xllamacpp)."""
    return worker_env.xllamacpp_python()


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The real SmolLM2-135M-Instruct GGUF model file."""
    return worker_env.smollm2_model_path()
