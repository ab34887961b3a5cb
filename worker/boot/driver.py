"""The host's NVIDIA driver against the image's CUDA floor: read before the engine starts (issue 54).

An image of a CUDA line bakes BAKERY_CUDA_VERSION and BAKERY_CUDA_MIN_DRIVER (from bakery/spec/cuda.py,
NVIDIA's compatibility table). On a host whose driver is older, the engine would fail only after its
imports, with the CUDA runtime's own message; the entry point refuses first, in one line. A host whose
driver it cannot read (a CPU host, no driver file) is never refused: the line says what was found.
Standard library only: the entry point runs it before anything else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# The kernel module's banner: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  ..." (the
# proprietary module) or "... Open Kernel Module for x86_64  580.65.06  Release Build ..." (the open one).
_VERSION = re.compile(r"NVRM version:.*?Kernel Module(?: for \S+)?\s+(?P<version>[0-9]+(?:\.[0-9]+){1,2})\b")


def parse_version(text: str) -> str | None:
    """The driver version the banner of /proc/driver/nvidia/version states, or None when it states none."""
    match = _VERSION.search(text)
    return match["version"] if match else None


def read_version(path: Path) -> tuple[str | None, str]:
    """(the driver version or None, what was found), read from the driver's version file at `path`."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")[:4096]
    except FileNotFoundError:
        return None, f"no {path} (no NVIDIA driver visible: a CPU host, or no GPU given to the container)"
    except OSError as exc:
        return None, f"{path} cannot be read ({exc.strerror or exc})"
    version = parse_version(text)
    if version is None:
        return None, f"{path} states no driver version"
    return version, f"NVIDIA driver {version} ({path})"


@dataclass(frozen=True)
class Verdict:
    """Whether the engine may start, and the one line that says why."""

    start: bool
    line: str


def decide(version: str | None, found: str, cuda: str | None, floor: int | None) -> Verdict:
    """The boot's decision: refuse only a driver read and below the floor; everything else starts."""
    if cuda is None or floor is None:
        return Verdict(True, f"bakery: driver check: this image has no CUDA line; {found}")
    if version is None:
        return Verdict(True, f"bakery: driver check: {found}; CUDA {cuda} needs a driver >= {floor}, not checked: "
                             "starting the engine")
    major = int(version.split(".")[0])
    if major < floor:
        return Verdict(False, f"bakery: refused: NVIDIA driver {version} is below {floor}, the minimum of this image's "
                              f"CUDA {cuda} line; the engine is not started. Run this engine's image of an older "
                              f"CUDA line (build.py --show lists each line's floor) or a host with a driver >= {floor}")
    return Verdict(True, f"bakery: driver check: {found} meets CUDA {cuda}'s minimum {floor}")
