"""The committed rendered/<engine>/Dockerfile files are exactly what the specs and templates render;
a change that was not re-rendered fails here, naming the file and the command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bakery.recipe import rendered
from bakery.spec.engine_spec import REPO_ROOT, available_engines


def test_committed_dockerfiles_are_current() -> None:
    problems = rendered.stale()
    assert not problems, "\n".join(str(p) for p in problems)
    tracked = subprocess.run(["git", "ls-files", "rendered"], cwd=REPO_ROOT, capture_output=True, text=True,
                             check=False).stdout.split()
    if tracked:  # in a git checkout: committed, not just present in the work tree
        assert sorted(tracked) == [f"rendered/{name}/Dockerfile" for name in available_engines()]


def test_every_committed_file_says_it_is_generated() -> None:
    # The committed files (a missing one is test_committed_dockerfiles_are_current's to name, alone).
    committed = sorted(rendered.RENDERED_DIR.glob("*/Dockerfile"))
    assert committed
    for path in committed:
        first = path.read_text().splitlines()[0]
        assert first.startswith("# GENERATED") and "do not edit" in first and "make render" in first


def test_a_change_not_re_rendered_is_named_with_the_command(tmp_path: Path) -> None:
    copy = tmp_path / "rendered"
    rendered.regenerate(copy)  # what `make render` writes, so only the planted defects below are stale
    edited = copy / "vllm" / "Dockerfile"
    edited.write_text(edited.read_text().replace("EXPOSE 3000", "EXPOSE 3001"))
    (copy / "sglang" / "Dockerfile").unlink()
    (copy / "tgi").mkdir()
    messages = [str(p) for p in rendered.stale(copy)]
    assert messages == [
        f"{copy}/sglang/Dockerfile: missing (engine sglang has no committed Dockerfile); "
        "run `make render (python -m bakery.recipe.rendered)` and commit it",
        f"{copy}/vllm/Dockerfile: out of date with images/vllm.yaml and templates/; "
        "run `make render (python -m bakery.recipe.rendered)` and commit it",
        f"{copy}/tgi: belongs to no engine in images/; "
        "run `make render (python -m bakery.recipe.rendered)` and commit it",
    ]
    check = subprocess.run([sys.executable, "-m", "bakery.recipe.rendered", "--check", "--dir", str(copy)],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert check.returncode == 1 and check.stderr.count("bakery.recipe.rendered: ") == 3, check.stderr
    rendered.regenerate(copy)
    assert rendered.stale(copy) == []
    assert not (copy / "tgi").exists()
