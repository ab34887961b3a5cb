"""How `make test` spreads the suite over two processes (pytest-xdist, `-n 2 --dist loadgroup`).

Every test that talks to the Docker engine shares one group, so they run one after another in one
process, exactly as in a serial run: they build and tag the same images and share the gate's session
fixtures. The one exception is an engine on a heavy local base (spec `base.local_launches`: the real
vLLM, whose base takes ~10 min to make and whose engine ~45 s to load): its tests (its gate and its
differential test) are a second Docker group, so its long waits overlap the other engines' gates in
the other process instead of adding to them. The two groups share no image, tag or container: each
engine's image, base and launches are its own, and the bases they share are made under a file lock
(`bakery.bases.make`). Every other test module is a group of its own (its module fixtures, e.g. a
shared worker, are made once) and runs in whichever process is free. A plain `pytest` run, without
-n, ignores the groups.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
DOCKER_GROUP = "docker"
# What talks to the Docker engine: the image tests and the base-image tests.
DOCKER_TESTS = (TESTS / "image", TESTS / "bases" / "test_images.py", TESTS / "bases" / "test_vllm_differential.py")
# Docker test files about one engine only, and that engine (so they join its group when it is heavy).
ONE_ENGINE_TESTS = {TESTS / "bases" / "test_vllm_differential.py": "vllm"}


def uses_docker(path: Path) -> bool:
    """Whether the test file at `path` talks to the Docker engine."""
    return any(path == place or place in path.parents for place in DOCKER_TESTS)


# tryfirst: xdist's worker turns these marks into the scheduling scope (a nodeid suffix) in its own
# modifyitems hook, which otherwise runs before this one and sees no mark; every test then becomes
# its own unit and Docker tests run in both processes at once.
@functools.cache
def heavy(engine: str) -> bool:
    """Whether `engine` (a spec in images/) runs on a heavy local base (spec `base.local_launches`)."""
    from bakery.errors import InputError
    from bakery.spec.engine_spec import load_engine

    try:
        return load_engine(engine).base.local_launches is not None
    except InputError:  # not an engine of images/ (a test's own name): not heavy
        return False


def group_of(item: pytest.Item) -> str:
    """The xdist group of one test: its engine's Docker group, the shared Docker group, or its module."""
    path = Path(str(item.fspath)).resolve()
    if not uses_docker(path):
        return str(path.relative_to(TESTS))
    callspec = getattr(item, "callspec", None)
    engine = ONE_ENGINE_TESTS.get(path) or (callspec.params.get("engine") if callspec else None)
    return f"{DOCKER_GROUP}-{engine}" if isinstance(engine, str) and heavy(engine) else DOCKER_GROUP


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group_of(item)))


# ---- time to ready: every gate launch of the suite, printed at its end --------------------------
# The gate appends each ready launch's split to $BAKERY_GATE_STAGES (tests/image/stages.py); build.py
# sets it per gate run and prints them. For the suite's own gates, the controller names one file
# before its workers start (they inherit it) and prints what they wrote in the terminal summary, so
# CI's log shows where each launch's time to ready went.
STAGES_VAR = "BAKERY_GATE_STAGES"


def pytest_configure(config: pytest.Config) -> None:
    import os
    import tempfile

    if not os.environ.get(STAGES_VAR) and not hasattr(config, "workerinput"):
        handle, path = tempfile.mkstemp(prefix="bakery-stages-", suffix=".jsonl")
        os.close(handle)
        os.environ[STAGES_VAR] = path
        config.stash[_STAGES_KEY] = path


_STAGES_KEY = pytest.StashKey[str]()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    import json
    import os

    path = config.stash.get(_STAGES_KEY, None)
    if not path:
        return
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    finally:
        os.unlink(path)
    if lines:
        from bakery.build.verify import describe_split

        terminalreporter.section("time to ready by stage (gate launches)")
        for line in lines:
            terminalreporter.write_line(describe_split(json.loads(line)))
