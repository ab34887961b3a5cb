"""The host's NVIDIA driver against the image's CUDA floor: read before the engine starts (issue 54).

An image of a CUDA line bakes BAKERY_CUDA_VERSION and BAKERY_CUDA_MIN_DRIVER (from bakery/spec/cuda.py,
NVIDIA's compatibility table). On a host whose driver is older, the engine would fail only after its
imports, with the CUDA runtime's own message; the entry point refuses first, in one line. The driver is read
from /proc/driver/nvidia/version, else from nvidia-smi where one is present. A host whose driver it cannot
read (a CPU host, no driver file) is never refused: the line says what was found.
Standard library only: the entry point runs it before anything else.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

# The kernel module's banner: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  ..." (the
# proprietary module) or "... Open Kernel Module for x86_64  580.65.06  Release Build ..." (the open one).
_VERSION = re.compile(r"NVRM version:.*?Kernel Module(?: for \S+)?\s+(?P<version>[0-9]+(?:\.[0-9]+){1,2})\b")


_SMI_VERSION = re.compile(r"^[0-9]+(?:\.[0-9]+){1,2}$")  # `nvidia-smi --query-gpu=driver_version`: 580.65.06
SMI_TIMEOUT = 10.0  # seconds nvidia-smi may take (it can hang on a wedged GPU): then the host is not refused


def parse_version(text: str) -> str | None:
    """The driver version the banner of /proc/driver/nvidia/version states, or None when it states none."""
    match = _VERSION.search(text)
    return match["version"] if match else None


def read_version(path: Path, smi: str | None = None) -> tuple[str | None, str]:
    """(the driver version or None, what was found), read from the driver's version file at `path`; where
    that file is missing, from `nvidia-smi` when one is on PATH (`smi`: its path, for tests)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")[:4096]
    except FileNotFoundError:
        smi = smi or shutil.which("nvidia-smi")
        if smi:
            return ask_smi(smi, f"no {path}")
        return None, f"no {path} and no nvidia-smi (no NVIDIA driver visible: a CPU host, or no GPU given to " \
                     "the container)"
    except OSError as exc:
        return None, f"{path} cannot be read ({exc.strerror or exc})"
    version = parse_version(text)
    if version is None:
        return None, f"{path} states no driver version"
    return version, f"NVIDIA driver {version} ({path})"


def ask_smi(smi: str, before: str) -> tuple[str | None, str]:
    """The driver version `nvidia-smi` states (bounded: SMI_TIMEOUT), or None and why not."""
    try:
        done = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=SMI_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{before}; {smi} did not answer ({type(exc).__name__})"
    first = next((line.strip() for line in done.stdout.splitlines() if line.strip()), "")
    if done.returncode != 0 or not _SMI_VERSION.match(first):
        return None, f"{before}; {smi} states no driver version (exit {done.returncode}: {first[:80]!r})"
    return first, f"NVIDIA driver {first} ({smi}; {before})"


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
