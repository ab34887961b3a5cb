"""build.py --images-dir / --templates-dir: an engine defined outside this repository, beside a team's
launch templates, renders and builds with the repository's skeleton; bad directories are one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bakery.build import verify
from bakery.spec.engine_spec import IMAGES_DIR, IMAGES_DIR_VAR, REPO_ROOT, load_engine
from tests.unit.dockerfile_model import env_of, instructions


def build_py(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO_ROOT / "build.py"), *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.fixture
def team(tmp_path: Path) -> Path:
    """A team's directory: specs/echo.yaml and templates/echo.Dockerfile.j2, nothing in the repo."""
    data = yaml.safe_load((IMAGES_DIR / "sglang.yaml").read_text())
    data.update(name="echo", description="an echo engine kept by a team")
    data.pop("upstream")
    data["engine"].update(command=["echo-server", "${ECHO_MODEL}", "--port", "18000"], model_var="ECHO_MODEL",
                          args_var="ECHO_ARGS")
    data["bake"]["env"].update(BACKEND="sglang", MODEL_LOG="/var/log/portal/echo.log",
                               MODEL_ERROR_LOG_MSGS=["INFO exited: echo", "echo: fatal"])
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "echo.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "echo.Dockerfile.j2").write_text(
        '{% extends "base.Dockerfile.j2" %}\n{% block engine %}\nRUN echo-server --version\n{% endblock %}\n')
    return tmp_path


def test_an_outside_engine_renders_with_its_own_template(team: Path) -> None:
    proc = build_py("--images-dir", str(team / "specs"), "--templates-dir", str(team / "templates"),
                    "--engine", "echo", "--render-only")
    assert proc.returncode == 0, proc.stderr
    assert ("RUN", "echo-server --version") in instructions(proc.stdout)  # the team's block
    env = env_of(proc.stdout)
    assert (env["BAKERY_ENGINE_PROGRAM"], env["MODEL_LOG"]) == ("echo", "/var/log/portal/echo.log")
    listed = build_py("--images-dir", str(team / "specs"), "--list")
    assert listed.returncode == 0 and listed.stdout.split()[0] == "echo", listed.stdout


def test_outside_specs_are_named_by_their_path(team: Path) -> None:
    spec_file = team / "specs" / "echo.yaml"
    spec_file.write_text(spec_file.read_text().replace("model_var: ECHO_MODEL", "model_var: OTHER_MODEL"))
    proc = build_py("--images-dir", str(team / "specs"), "--engine", "echo", "--render-only")
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"build.py: {spec_file}: engine: "), proc.stderr


def test_without_templates_dir_the_template_is_missing_and_the_message_says_where(team: Path) -> None:
    proc = build_py("--images-dir", str(team / "specs"), "--engine", "echo", "--render-only")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"build.py: {team}/specs/echo.yaml: template: templates/echo.Dockerfile.j2 does "
                                   "not exist; create it (it may just extend base.Dockerfile.j2) or set template: "
                                   "to an existing one")


@pytest.mark.parametrize(("option", "message"), [
    ("--images-dir", "not a directory (it holds the <engine>.yaml specs)"),
    ("--templates-dir", "not a directory"),
])
def test_a_missing_directory_is_one_line_naming_it(tmp_path: Path, option: str, message: str) -> None:
    missing = tmp_path / "nope"
    proc = build_py(option, str(missing), "--engine", "llama", "--render-only")
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"build.py: {option} {missing}: {message}"


def test_an_empty_images_dir_names_it(tmp_path: Path) -> None:
    proc = build_py("--images-dir", str(tmp_path), "--engine", "llama", "--render-only")
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"build.py: unknown engine 'llama': it holds no <engine>.yaml (files in {tmp_path}/)"


def test_the_gate_is_told_where_the_spec_is(team: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict = {}

    class FakeGate:
        def __init__(self, cmd, env=None, **_kw) -> None:
            seen.update(cmd=cmd, env=env)
            self.stdout, self.returncode = iter(()), 1

        def wait(self) -> int:
            return 1

    monkeypatch.setattr(verify.subprocess, "Popen", FakeGate)
    verify.run_gate("sha256:" + "a" * 64, "echo", images_dir=team / "specs")
    assert seen["env"][IMAGES_DIR_VAR] == str((team / "specs").resolve())
    # What the gate's conftest does with it: load_engine(name) with no directory reads that one.
    monkeypatch.setenv(IMAGES_DIR_VAR, seen["env"][IMAGES_DIR_VAR])
    assert load_engine("echo").spec_path == f"{team}/specs/echo.yaml"
