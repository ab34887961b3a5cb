"""An engine on a team's own base passes the gate: a spec kept outside the repository, with no local
base, built with `build.py --base-image REF` as the README shows.

Without `--base-model` the gate runs every check that needs no model and reports the others as not
run (never as errors); with `--base-model`, naming the model that base serves, they run too. The
team's base here is the vLLM stand-in base (made by bakery.bases), and `zeta` has no worker adapter:
the generic worker serves it from what its image bakes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from bakery.bases import make as bases
from bakery.spec.base_catalogue import BASES
from bakery.spec.engine_spec import REPO_ROOT
from tests.zeta import STANDIN_MODEL, zeta_spec

TEAM_BASE = "vllm-standin"
TEAM_MODEL = STANDIN_MODEL  # the model the team's base serves
# No local base: no base.local and none of the keys only a local base has.
SPEC = zeta_spec("zeta, an engine on a team's own base", {})


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory, docker_client) -> tuple[Path, str]:
    """The spec directory and the team's base ref (present on this engine, as a team's base would be)."""
    images = tmp_path_factory.mktemp("team") / "images"
    images.mkdir()
    (images / "zeta.yaml").write_text(yaml.safe_dump(SPEC, sort_keys=False))
    bases.ensure_base("debian")
    bases.ensure_base(TEAM_BASE)
    return images, BASES[TEAM_BASE].ref


def build(images: Path, base: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    """build.py on the team's spec and base, gate included; (exit code, JSON summary, stderr)."""
    done = subprocess.run([sys.executable, str(REPO_ROOT / "build.py"), "--images-dir", str(images), "--engine",
                           "zeta", "--base-image", base, *extra, "--json"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=1800, check=False)
    summary = json.loads(done.stdout)
    assert "engines" in summary, f"build.py exited {done.returncode}: {summary}\n{done.stderr[-3000:]}"
    return done.returncode, summary, done.stderr


@pytest.mark.serve
def test_without_its_model_the_checks_needing_one_are_reported_not_run(team: tuple[Path, str]) -> None:
    code, summary, err = build(*team)
    engine = summary["engines"][0]
    assert code == 0 and engine["verified"], f"{engine.get('failed_checks')}\n{err[-4000:]}"
    assert engine["variant"] == "custom" and engine["checks_run"] >= 5, engine
    not_run = {name.split("[")[0] for name in engine["checks_not_run"]}
    assert {"test_worker_reports_ready", "test_signed_completion_and_chat_through_worker"} <= not_run, \
        engine["checks_not_run"]
    assert "checks not run: this check needs the model the base serves" in err, err[-2000:]
    assert "--base-model" in err


@pytest.mark.serve
def test_with_its_model_named_every_check_runs(team: tuple[Path, str]) -> None:
    code, summary, err = build(*team, "--base-model", TEAM_MODEL)
    engine = summary["engines"][0]
    assert code == 0 and engine["verified"], f"{engine.get('failed_checks')}\n{err[-4000:]}"
    # Only what the spec gives nothing to check with is left: zeta names no base.local_route, no
    # base.local_fail_load (how loading fails there) and no base.local_long_answer; and the image bakes no
    # model (build.py --model), so the model checks do not apply.
    assert {name.split("[")[0] for name in engine["checks_not_run"]} == {
        "test_local_route_served_signed", "test_engine_load_failure_reported",
        "test_docker_stop_drains_on_the_signed_path", "test_model_labels_match_manifest",
        "test_model_files_pass_sha256sum", "test_engine_serves_the_baked_model"}, engine
    assert engine["checks_run"] >= 25, engine

