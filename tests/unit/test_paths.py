"""bakery.paths: the repository's directories and the cache are defined once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bakery import artifacts, paths

# Modules still computing their own root, each with the edit that removes it (the list only shrinks).
PENDING = {"bakery/worker_env.py": "REPO_ROOT/WORKER_DIR: import them from bakery.paths"}


def test_cache_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(paths.CACHE_VAR, str(tmp_path / "cache"))
    assert paths.cache_path("contexts", "vllm") == tmp_path / "cache" / "contexts" / "vllm"
    assert (tmp_path / "cache").is_dir()
    # bakery.artifacts keeps its own cache_dir until it imports this one: they must agree meanwhile.
    assert artifacts.cache_dir() == paths.cache_dir()
    with pytest.raises(ValueError, match="unknown cache directory 'context'"):
        paths.cache_path("context")


def test_the_repository_root_is_computed_in_one_place() -> None:
    own_root = re.compile(r"Path\(__file__\)\.resolve\(\)\.parents?\b")
    found = {str(p.relative_to(paths.REPO_ROOT)) for p in (paths.REPO_ROOT / "bakery").glob("*.py")
             if own_root.search(p.read_text(encoding="utf-8"))}
    assert found - set(PENDING) == {"bakery/paths.py"}, f"compute the root only in bakery/paths.py: {found}"
    assert set(PENDING) <= found, f"gone, so drop their PENDING entries: {set(PENDING) - found}"
