"""Every shell script the project ships or runs passes shellcheck (a directive-looking comment once hid
the rest of scripts/setup-host from it)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from bakery.spec.engine_spec import REPO_ROOT
from bakery.tracked import tracked_files


def shell_scripts() -> list[str]:
    """Tracked files whose first line names sh or bash."""
    found = []
    for path in tracked_files(REPO_ROOT, "."):
        full = REPO_ROOT / path
        if full.is_file() and not full.is_symlink():
            with full.open("rb") as handle:
                first = handle.readline(120)
            if first.startswith(b"#!") and (first.rstrip().endswith((b"/sh", b"/bash", b" sh", b" bash"))):
                found.append(path)
    return sorted(found)


def test_the_shell_scripts_are_found() -> None:
    scripts = shell_scripts()
    assert {"scripts/setup-host", "worker/start_server.sh", "templates/context/make-venv.sh"} <= set(scripts)


def test_shell_scripts_pass_shellcheck() -> None:
    if shutil.which("shellcheck") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("shellcheck is missing: scripts/setup-host installs it")
        pytest.skip("shellcheck is not installed (scripts/setup-host installs it)")
    result = subprocess.run(["shellcheck", "--format=gcc", *shell_scripts()], cwd=REPO_ROOT,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
