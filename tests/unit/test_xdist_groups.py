"""`make test` relies on `--dist loadgroup` keeping every Docker test in one process, apart from a heavy
engine's, which share a second one (tests/conftest.py).
When pytest and pytest-xdist disagree on node ids (pytest 9.2 with xdist 3.8, pytest-dev/pytest-xdist
#1386), or when the hook that adds the marks runs after xdist's own (which reads them: hence
tryfirst), the marks are silently ignored and the Docker tests run in both processes at once, racing
on shared tags. This runs the installed pytest and xdist on a tiny suite grouped by tests/conftest.py's
own hook (pointed at the tiny suite's folders), and fails when the grouping no longer holds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bakery.paths import REPO_ROOT

# The suite's own hook, with its notion of "the tests" and "the Docker tests" moved to the tiny suite.
CONFTEST = '''
from pathlib import Path

import tests.conftest as suite

suite.TESTS = Path(__file__).resolve().parent
suite.DOCKER_TESTS = (suite.TESTS / "grouped",)
pytest_collection_modifyitems = suite.pytest_collection_modifyitems
'''

RECORDING_TEST = '''
import os
import pytest

@pytest.mark.parametrize("n", range(4))
def test_records_its_process(n):
    with open({log!r}, "a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
'''

# A gate-like module: the same checks for a light engine (llama) and a heavy one (vllm: base.local_launches).
ENGINE_TEST = '''
import os
import pytest

@pytest.mark.parametrize("n", range(4))
@pytest.mark.parametrize("engine", ["llama", "vllm"])
def test_records_its_engine_process(engine, n):
    with open({log!r} + "-" + engine, "a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
'''


def test_one_group_runs_in_one_process(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for folder, module in (("grouped", "test_a.py"), ("grouped", "test_b.py"), ("loose", "test_c.py"),
                           ("loose", "test_d.py")):
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / module).write_text(RECORDING_TEST.format(log=str(tmp_path / f"{folder}.log")))
    (tmp_path / "grouped" / "test_e.py").write_text(ENGINE_TEST.format(log=str(tmp_path / "engine.log")))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup",
                          "--no-loadscope-reorder", "-p", "no:cacheprovider", "-p", "no:randomly", str(tmp_path)],
                         check=False, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    grouped = (tmp_path / "grouped.log").read_text().split()
    loose = (tmp_path / "loose.log").read_text().split()
    light = (tmp_path / "engine.log-llama").read_text().split()
    heavy = (tmp_path / "engine.log-vllm").read_text().split()
    assert len(grouped) == 8 and len(loose) == 8 and len(light) == 4 and len(heavy) == 4, (grouped, loose)
    assert len(set(grouped + light)) == 1, \
        f"the 12 shared-group tests ran in {sorted(set(grouped + light))}: loadgroup ignored the marks"
    assert len(set(heavy)) == 1, f"the heavy engine's 4 tests ran in {sorted(set(heavy))}: not one group"
    # Two processes, two Docker groups queued first: the heavy engine's waits overlap the others' tests.
    assert set(heavy) != set(grouped), f"the heavy engine's tests ran in the shared group's process {heavy}"
