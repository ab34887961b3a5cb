"""The host tools the tests run for real (scripts/setup-host installs each): found, or the test stops.

A missing tool fails the test under CI=true (CI installs everything, so a missing one is a broken
machine, never a reason to skip) and skips it elsewhere, with the command that installs it.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

SETUP = "run scripts/setup-host as root"


def missing(message: str) -> None:
    """Fail under CI=true, skip elsewhere."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message}; CI=true needs it")
    pytest.skip(message)


def require_tool(name: str, package: str | None = None) -> str:
    """The path of the program `name` (from the Debian package `package`, default `name`)."""
    path = shutil.which(name)
    if path is None:
        missing(f"{name} is not installed: {SETUP} (it installs the Debian package {package or name})")
    return str(path)


def require_buildx() -> list[str]:
    """`["docker", "buildx"]`, once `docker buildx version` runs (the docker-buildx CLI plugin)."""
    docker = require_tool("docker", "docker.io")
    proc = subprocess.run([docker, "buildx", "version"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        missing(f"docker buildx is not installed: {SETUP} (it installs docker-buildx from Debian 13)")
    return [docker, "buildx"]
