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
from tests.worker.helpers import Harness, ReportServer


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker used here (pyproject.toml belongs to the whole repo)."""
    config.addinivalue_line("markers", "slow: runs real worker processes (seconds each); still runs by default")


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
def harness(tmp_path: Path, worker_python: Path, pubkey_pem: str) -> Iterator[Harness]:
    """The test's engines, report servers and workers (helpers.Harness), all stopped at its end.

    `harness.serve("vllm", harness.standin("vllm"))` starts a stand-in, a worker in front of it
    reporting to `harness.reports`, and waits until it is loaded; `harness.worker(...)` only starts one.
    """
    with Harness(tmp_path, worker_python, pubkey_pem) as started:
        yield started


@pytest.fixture
def report_server(harness: Harness) -> ReportServer:
    """The test's default report server (harness.reports), closed with the harness."""
    return harness.reports


@pytest.fixture(scope="session")
def llama_python() -> Path:
    """Python of a venv with the real llama.cpp server (xllamacpp)."""
    return worker_env.xllamacpp_python()


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The real SmolLM2-135M-Instruct GGUF model file."""
    return worker_env.smollm2_model_path()
