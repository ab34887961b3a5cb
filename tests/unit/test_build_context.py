"""The build context holds the files git tracks plus what the build generates, and nothing else.

tests/image/test_build_context.py builds a real image from such a context and looks inside it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bakery.errors import InputError
from bakery.recipe import render as render_mod
from bakery.recipe.render import context_files, render, write_context
from bakery.spec.engine_spec import REPO_ROOT, load_engine
from bakery.tracked import tracked_files

FAKE_SECRET = "HF_TOKEN=hf_" + "FakeTokenForTheContextTest0123"


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env={"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(root),
                        "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"})


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A small git checkout shaped like the repository, with untracked files planted in it."""
    root = tmp_path / "repo"
    tracked = {
        "worker/start_server.sh": "#!/bin/sh\n",
        "worker/requirements.txt": "vastai-sdk==1.9.1\n",
        "worker/lock.py": "# dev tool\n",
        "worker/app/core.py": "X = 1\n",
        "worker/tests/test_x.py": "def test(): pass\n",
        "templates/context/make-venv.sh": "#!/bin/sh\n",
        "templates/context/bundle-python.sh": "#!/bin/sh\n",
        "README.md": "not in the context\n",
    }
    for path, text in tracked.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "fixture")
    staged = root / "worker/app/staged.py"  # added, not yet committed: the project's
    staged.write_text("Y = 2\n")
    git(root, "add", str(staged))
    (root / "worker/.env").write_text(FAKE_SECRET + "\n")  # the stray file of issue 12
    (root / "worker/app/scratch.py").write_text("untracked\n")
    (root / "worker/app/__pycache__").mkdir()
    (root / "worker/app/__pycache__/core.cpython-311.pyc").write_bytes(b"\0")
    (root / "templates/context/notes.txt").write_text(FAKE_SECRET + "\n")
    monkeypatch.setattr(render_mod, "REPO_ROOT", root)
    return root


def test_context_holds_tracked_files_and_generated_ones_only(checkout: Path, tmp_path: Path) -> None:
    wheels = tmp_path / "wheelhouse"
    wheels.mkdir()
    (wheels / "pip-25.3-py3-none-any.whl").write_bytes(b"wheel")
    context = write_context(render(load_engine("vllm")), tmp_path / "context", wheels)
    files = sorted(str(p.relative_to(context)) for p in context.rglob("*") if p.is_file())
    assert files == [
        "Dockerfile",
        "context/bundle-python.sh",
        "context/make-venv.sh",
        "wheels/pip-25.3-py3-none-any.whl",
        "worker/app/core.py",
        "worker/app/staged.py",
        "worker/requirements.txt",
        "worker/start_server.sh",
    ]
    for path in context.rglob("*"):
        if path.is_file():
            assert FAKE_SECRET.encode() not in path.read_bytes(), path


def test_a_tracked_file_deleted_in_the_working_tree_is_left_out(checkout: Path) -> None:
    (checkout / "worker/app/core.py").unlink()
    assert "worker/app/core.py" not in context_files()
    assert "worker/start_server.sh" in context_files()


def test_outside_a_git_checkout_the_context_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bare = tmp_path / "export"
    (bare / "worker").mkdir(parents=True)
    (bare / "worker/.env").write_text(FAKE_SECRET)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    monkeypatch.setattr(render_mod, "REPO_ROOT", bare)
    with pytest.raises(InputError, match="builds from a git checkout") as info:
        context_files()
    assert "\n" not in str(info.value)


def test_the_repository_context_is_its_tracked_worker(tmp_path: Path) -> None:
    """On the real checkout: an untracked worker/.env planted now is not in the context, and every
    tracked worker file the image needs is."""
    planted = REPO_ROOT / "worker" / ".env"
    if planted.exists():
        planted = REPO_ROOT / "worker" / f".env.planted-{tmp_path.name}"
    planted.write_text(FAKE_SECRET + "\n")
    try:
        files = context_files()
    finally:
        planted.unlink()
    assert str(planted.relative_to(REPO_ROOT)) not in files
    tracked = tracked_files(REPO_ROOT, "worker")
    assert "worker/boot/entrypoint.py" in files and "worker/app/core.py" in files
    assert "templates/context/make-venv.sh" in files
    assert set(files) == {p for p in tracked if p != "worker/lock.py" and "/tests/" not in p} | set(
        tracked_files(REPO_ROOT, "templates/context"))
