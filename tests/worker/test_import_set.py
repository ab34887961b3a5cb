"""The lean install is enough: a venv of exactly worker/requirements.txt (--no-deps) runs the worker.

For each CPython the images use (3.10, 3.11 = the host, 3.12 = vLLM's), a venv is built offline from
the wheelhouse with --no-deps --require-hashes and nothing else (not even pip). In it:
- every module the worker uses at run time imports (tests/worker/import_probe.py), and vastai did
  not silently turn its serverless names into None;
- the worker path runs end to end (benchmark, requests, status reports, an error line) with no
  "No module named" anywhere, which catches what the SDK imports lazily while serving;
- the installed set is exactly the lock, and within the 80 MB budget.
A 3.10 or 3.12 interpreter missing on this machine skips that version, except under CI=true.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest

from bakery.host import downloads as worker_env
from tests.worker.helpers import HERE, SDK_READY, WORKER_DIR, Harness, baked_facts, post_enveloped

pytestmark = pytest.mark.slow
PROBE = HERE / "import_probe.py"
BUDGET_MB = 80


@cache
def interpreter(version: str) -> Path | None:
    """A CPython `version` on this machine (pyenv's, at $PYENV_ROOT or ~/.pyenv, then PATH), or None."""
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    candidates = sorted(pyenv.glob(f"versions/{version}.*/bin/python{version}"), reverse=True)
    on_path = shutil.which(f"python{version}")
    candidates += [Path(on_path)] if on_path else []
    for candidate in candidates:
        probe = subprocess.run([str(candidate), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True, check=False)
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    return None


@pytest.fixture(scope="module", params=["3.10", "3.11", "3.12"])
def lean_venv(request: pytest.FixtureRequest) -> tuple[str, Path]:
    """(version, venv) built from exactly requirements.txt."""
    version = request.param
    python = interpreter(version)
    if python is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CPython {version} is not installed: the import-set test needs it")
        pytest.skip(f"CPython {version} is not installed here")
    return version, worker_env.host_worker_venv(python)


def locked_names(version: str) -> set[str]:
    """Normalised names of the requirements that apply to CPython `version`."""
    return {re.sub(r"[-_.]+", "-", line.split("==")[0]).lower() for line in worker_env.requirement_lines(version)}


def run_probe(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run import_probe.py in `venv` with only the worker directory on PYTHONPATH."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(WORKER_DIR), "PYTHONNOUSERSITE": "1",
           **baked_facts("vllm")}  # the image's engine facts (any engine's: the probe starts none)
    return subprocess.run([str(venv / "bin" / "python"), str(PROBE), *args], capture_output=True, text=True,
                          env=env, timeout=120, check=False)


def test_installed_set_is_exactly_the_lock(lean_venv: tuple[str, Path]) -> None:
    """Nothing but the locked distributions is installed (no pip, no transitive extras)."""
    version, venv = lean_venv
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import importlib.metadata as m, json; print(json.dumps([d.metadata['Name'] for d in "
                          "m.distributions()]))"], capture_output=True, text=True, check=True)
    installed = {re.sub(r"[-_.]+", "-", name).lower() for name in json.loads(out.stdout)}
    assert installed == locked_names(version)


def test_worker_modules_import(lean_venv: tuple[str, Path]) -> None:
    """Everything the worker imports at run time imports; the loaded set is within the lock."""
    version, venv = lean_venv
    result = run_probe(venv)
    assert result.returncode == 0, result.stderr
    loaded = {re.sub(r"[-_.]+", "-", name).lower() for name in json.loads(result.stdout)["loaded"]}
    assert loaded <= locked_names(version)
    # (vastai itself has no top_level.txt, so Python 3.10 cannot map its modules to it)
    assert {"aiohttp", "anyio", "pycryptodome", "psutil", "requests", "msgspec"} <= loaded
    if version >= "3.12":
        assert "setuptools" in loaded  # distutils, for vastai's backend module


@pytest.mark.parametrize("blocked", ["psutil", "Crypto", "anyio", "dateutil", "requests"])
def test_probe_notices_a_missing_dependency(worker_venv: Path, blocked: str) -> None:
    """The probe fails when one of the locked distributions' modules is missing (so it can fail)."""
    result = run_probe(worker_venv, "--block", blocked)
    assert result.returncode == 1
    assert "ImportError" in result.stderr


def test_worker_path_runs_in_the_lean_venv(lean_venv: tuple[str, Path], harness: Harness) -> None:
    """Benchmark, both routes, status reports and error handling: no ImportError anywhere."""
    _, venv = lean_venv
    engine = harness.standin("vllm")
    served = harness.worker("vllm", engine, python=venv / "bin" / "python", MODEL_NAME="standin-model")
    worker, port, log, report_server = served.worker, served.port, engine.log, harness.reports
    worker.wait_for(SDK_READY, timeout=60)
    for route, payload in (("/v1/completions", {"prompt": "hi", "max_tokens": 4}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        status, body, _ = post_enveloped(port, route, payload)
        assert status == 200, body
    # The engine's exit line (after load, another error line counts only when /health fails too:
    # late_errors), so the error path runs with the stand-in still answering.
    with log.open("a") as handle:
        handle.write("INFO exited: vllm (exit status 1; not expected)\n")
    report_server.wait_status(lambda s: s.get("error_msg") == "INFO exited: vllm")
    report_server.wait_status(lambda s: s.get("max_perf", 0) > 0 or s.get("cur_perf", 0) > 0)
    for marker in ("No module named", "ImportError", "ModuleNotFoundError"):
        assert marker not in worker.text


def test_lean_install_fits_the_budget(lean_venv: tuple[str, Path]) -> None:
    """The installed distributions add at most 80 MB (the perf issue's budget for the worker)."""
    _, venv = lean_venv
    site = next((venv / "lib").glob("python3.*/site-packages"))
    total = sum(p.stat().st_size for p in site.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    assert total < BUDGET_MB * 1024 * 1024, f"{total / 2**20:.1f} MB"
