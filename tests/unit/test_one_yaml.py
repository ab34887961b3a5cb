"""A fourth engine is one YAML file inside the repository too.

A copy of this checkout gets `images/zeta.yaml` (no worker adapter, no template of its own: the
generic worker and the skeleton template serve it) and nothing else. The unit suite run there fails
exactly once, on the committed render it lacks, naming the command that makes it; after that command
(`make render`, i.e. `python -m bakery.recipe.rendered`) the same suite passes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

from bakery.recipe.rendered import REGENERATE
from bakery.spec.engine_spec import REPO_ROOT
from tests.zeta import STANDIN_MODEL, zeta_spec

ZETA = zeta_spec("zeta, a fourth engine that is one YAML file", {
    "local": "vllm-standin", "local_model": STANDIN_MODEL, "local_fail_load": {"env": {"STANDIN_FAIL_LOAD": "1"}},
    "local_long_answer": {"env": {"STANDIN_TOKEN_DELAY": "0.1", "STANDIN_REPLY_TOKENS": "20"}, "tokens": 20}})


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


def checkout_copy(target: Path) -> Path:
    """This checkout's files (tracked, and new ones not ignored) in a git repository of their own."""
    files = _git(REPO_ROOT, "ls-files", "--cached", "--others", "--exclude-standard", "-z").split("\0")
    for name in filter(None, files):
        source = REPO_ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    _git(target, "init", "-q")
    _git(target, "add", "-A")
    _git(target, "-c", "user.name=bakery-test", "-c", "user.email=test@bakery.invalid", "commit", "-qm", "copy")
    return target


def unit_failures(repo: Path, junit: Path) -> dict[str, str]:
    """Run the copy's unit suite (this file left out); the failed tests with their messages."""
    subprocess.run([sys.executable, "-m", "pytest", "tests/unit", "-q", "-p", "no:cacheprovider",
                    "--deselect", "tests/unit/test_one_yaml.py", f"--junitxml={junit}"], cwd=repo,
                   capture_output=True, text=True, timeout=1200, check=False)
    failed = {}
    for case in ET.parse(junit).getroot().iter("testcase"):  # noqa: S314 - our own pytest's report
        problem = case.find("failure")
        problem = problem if problem is not None else case.find("error")
        if problem is not None:
            failed[case.get("name", "?")] = problem.get("message", "")
    return failed


def test_a_fourth_engine_is_one_yaml_and_its_render(tmp_path: Path) -> None:
    repo = checkout_copy(tmp_path / "repo")
    (repo / "images" / "zeta.yaml").write_text(yaml.safe_dump(ZETA, sort_keys=False))
    assert not (repo / "worker" / "workers" / "zeta").exists()  # no adapter: the generic worker serves it

    failed = unit_failures(repo, tmp_path / "first.xml")
    assert list(failed) == ["test_committed_dockerfiles_are_current"], failed
    message = failed["test_committed_dockerfiles_are_current"]
    assert "rendered/zeta/Dockerfile: missing" in message and REGENERATE in message, message

    subprocess.run([sys.executable, "-m", "bakery.recipe.rendered"], cwd=repo, check=True, capture_output=True,
                   timeout=120)
    _git(repo, "add", "rendered")
    assert unit_failures(repo, tmp_path / "second.xml") == {}
