"""How `make test` spreads the suite over two processes (pytest-xdist, `-n 2 --dist loadgroup`).

Every test that talks to the Docker engine shares one group, so they run one after another in one
process, exactly as in a serial run: they build and tag the same images, share the gate's session
fixtures, and their timings were set for one gate at a time. Every other test module is a group of
its own (its module fixtures, e.g. a shared worker, are made once), so the host-only tests (the
worker on loopback, the unit tests) run in the second process meanwhile. A plain `pytest` run,
without -n, ignores the groups.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
DOCKER_GROUP = "docker"
# What talks to the Docker engine: the image tests and the base-image tests.
DOCKER_TESTS = (TESTS / "image", TESTS / "bases" / "test_images.py", TESTS / "bases" / "test_vllm_differential.py")


def uses_docker(path: Path) -> bool:
    """Whether the test file at `path` talks to the Docker engine."""
    return any(path == place or place in path.parents for place in DOCKER_TESTS)


# tryfirst: xdist's worker turns these marks into the scheduling scope (a nodeid suffix) in its own
# modifyitems hook, which otherwise runs before this one and sees no mark; every test then becomes
# its own unit and Docker tests run in both processes at once.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath)).resolve()
        group = DOCKER_GROUP if uses_docker(path) else str(path.relative_to(TESTS))
        item.add_marker(pytest.mark.xdist_group(group))
