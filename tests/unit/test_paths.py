"""bakery.paths: the repository's directories and the cache are defined once, and only there.

Agreement is not enough (two definitions that agree today drift tomorrow): the checks below read
the code and refuse any second definition of the root or of the cache, and any cache directory that
bypasses `cache_path`'s list of kinds.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from bakery import paths
from bakery.tracked import tracked_files

ROOT = paths.REPO_ROOT
# Python that imports bakery (worker/ is copied into images and never does). bench/ scripts find the
# repository before they can import bakery, so they may locate it; they may not compute the cache.
HOST_CODE = [p for p in tracked_files(ROOT, "bakery", "tests", "bench", "scripts", "build.py")
             if p.endswith(".py") and not p.startswith("tests/worker/") and p != "tests/unit/test_paths.py"]
ROOT_MAY_BE_LOCATED = ("bench/", "scripts/")


def _tree(rel: str) -> ast.AST:
    return ast.parse((ROOT / rel).read_text(encoding="utf-8"), rel)


_CLIMB = re.compile(r"Path\(__file__\)(?:\.resolve\(\))?(?P<parents>(?:\.parent\b)+|\.parents\[(?P<n>\d+)\])")


def _computes_root(rel: str, text: str) -> bool:
    """True when `text` (the file `rel`) climbs from its own path to the repository root."""
    for match in _CLIMB.finditer(text):
        levels = int(match["n"]) + 1 if match["n"] is not None else match["parents"].count(".parent")
        if (ROOT / rel).resolve().parents[levels - 1] == ROOT:
            return True
    return False


def _cache_definitions(tree: ast.AST) -> list[str]:
    """Places that read $BAKERY_CACHE, spell its default, or join a cache directory by hand."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in (paths.CACHE_VAR, ".cache"):
            found.append(f"line {node.lineno}: {node.value!r}")
        if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "cache_dir":
            found.append(f"line {node.lineno}: cache_dir() (use cache_path(kind, ...))")
    return found


def _stores_of_cache_var(tree: ast.AST) -> set[int]:
    """Lines that set os.environ[CACHE_VAR] (a run choosing its cache), which are not definitions."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and ast.unparse(target.slice) in (
                        repr(paths.CACHE_VAR), "paths.CACHE_VAR", "CACHE_VAR"):
                    lines.add(node.lineno)
    return lines


def test_cache_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(paths.CACHE_VAR, str(tmp_path / "cache"))
    assert paths.cache_path("contexts", "vllm") == tmp_path / "cache" / "contexts" / "vllm"
    assert (tmp_path / "cache").is_dir()
    monkeypatch.delenv(paths.CACHE_VAR)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert paths.cache_dir() == tmp_path / "home" / ".cache" / "bakery"
    with pytest.raises(ValueError, match="unknown cache directory 'context'"):
        paths.cache_path("context")


def test_the_repository_root_is_computed_in_one_place() -> None:
    found = {rel for rel in HOST_CODE if not rel.startswith(ROOT_MAY_BE_LOCATED)
             and _computes_root(rel, (ROOT / rel).read_text(encoding="utf-8"))}
    assert found == {"bakery/paths.py"}, f"compute the root only in bakery/paths.py (import REPO_ROOT): {found}"


def test_the_cache_is_defined_in_one_place() -> None:
    found = {}
    for rel in HOST_CODE:
        if rel == "bakery/paths.py":
            continue
        tree = _tree(rel)
        allowed = _stores_of_cache_var(tree)
        hits = [hit for hit in _cache_definitions(tree) if int(hit.split()[1].rstrip(":")) not in allowed]
        if hits:
            found[rel] = hits
    assert not found, f"the cache is bakery.paths' (cache_path(kind, ...)); defined again in: {found}"


def test_every_cache_kind_is_used_and_every_use_is_a_kind() -> None:
    used: dict[str, str] = {}
    for rel in HOST_CODE:
        for node in ast.walk(_tree(rel)):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("cache_path") and node.args \
                    and isinstance(node.args[0], ast.Constant):
                used.setdefault(node.args[0].value, rel)
    unknown, unused = set(used) - paths.CACHE_KINDS, paths.CACHE_KINDS - set(used)
    assert not unknown, f"cache kinds not in bakery.paths.CACHE_KINDS: {unknown}"
    assert not unused, f"CACHE_KINDS nobody uses (drop them): {unused}"


def test_the_checks_can_fail() -> None:
    # A module of bakery/ (one level below the root) and of tests/unit/ (two levels below).
    assert _computes_root("bakery/cli.py", "ROOT = Path(__file__).resolve().parent.parent\n")
    assert _computes_root("tests/unit/test_x.py", "ROOT = Path(__file__).parents[2]\n")
    assert not _computes_root("tests/unit/test_x.py", "HERE = Path(__file__).resolve().parent\n")
    assert not _computes_root("tests/image/launch.py", 'CP = Path(__file__).resolve().parents[1] / "controlplane"\n')
    planted = ast.parse('import os\nC = os.environ.get("BAKERY_CACHE")\nD = artifacts.cache_dir() / "wheels"\n'
                        'E = Path.home() / ".cache" / "bakery"\n')
    assert [re.sub(r":.*", "", hit) for hit in _cache_definitions(planted)] == ["line 2", "line 3", "line 4"]
    assert _stores_of_cache_var(ast.parse('os.environ["BAKERY_CACHE"] = "/tmp/x"\n')) == {1}
