"""CUDA lines and the NVIDIA driver each one needs: the one table every driver floor is derived from.

Source: NVIDIA, "CUDA Compatibility", Minor Version Compatibility, Table 1 (read 2026-12):
https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html
From CUDA 11 on, a program built with any toolkit of a major release runs on a Linux driver of at least
that major's minimum (13.x >= 580, 12.x >= 525, 11.x >= 450), with a limited feature set below the driver
the toolkit shipped with (PTX JIT, for one, needs the newer driver). The floor is therefore one number
per CUDA major; a minor this table does not list is still refused, so a typo ("12.90") is caught.

An image of a CUDA line bakes its floor (BAKERY_CUDA_MIN_DRIVER) and its version (BAKERY_CUDA_VERSION);
the entry point compares the host's driver with the baked floor, so the image needs no copy of this table.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

DRIVER_SOURCE = "https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html"
# CUDA major -> minimum Linux driver major under minor version compatibility (DRIVER_SOURCE, Table 1).
MIN_DRIVER: Mapping[int, int] = MappingProxyType({11: 450, 12: 525, 13: 580})
# The minors each major has had (11.0-11.8, 12.0-12.9); 13's grows, so it accepts up to 13.9.
LAST_MINOR: Mapping[int, int] = MappingProxyType({11: 8, 12: 9, 13: 9})
CUDA_VERSION = re.compile(r"^(?P<major>[1-9][0-9]*)\.(?P<minor>0|[1-9][0-9]*)$")
# What the image bakes (worker/config/table.py declares both for the entry point).
VERSION_VAR = "BAKERY_CUDA_VERSION"
MIN_DRIVER_VAR = "BAKERY_CUDA_MIN_DRIVER"
# Labels every image of a CUDA line carries (docs/tags.md).
VERSION_LABEL = "ai.bakery.cuda.version"
MIN_DRIVER_LABEL = "ai.bakery.cuda.min_driver"


def known() -> str:
    """The CUDA lines the table holds, for messages (`11.0-11.8, 12.0-12.9, 13.0-13.9`)."""
    return ", ".join(f"{major}.0-{major}.{LAST_MINOR[major]}" for major in sorted(MIN_DRIVER))


def min_driver(cuda: str) -> int:
    """The minimum driver major for CUDA `cuda` (major.minor); ValueError naming the table when unknown."""
    match = CUDA_VERSION.match(cuda)
    if not match:
        raise ValueError(f"{cuda!r} is not a CUDA version: write major.minor, e.g. 12.9")
    major, minor = int(match["major"]), int(match["minor"])
    if major not in MIN_DRIVER or minor > LAST_MINOR[major]:
        raise ValueError(f"CUDA {cuda} is not in bakery's driver table (bakery/spec/cuda.py: {known()}); use one "
                         f"of those, or add its row from {DRIVER_SOURCE}")
    return MIN_DRIVER[major]


@dataclass(frozen=True)
class CudaVariant:
    """One CUDA line of an engine, resolved: its CUDA version, its upstream base, its driver floor."""

    cuda: str  # major.minor
    image: str  # the upstream base of this line (tag-pinned)
    default: bool  # the line the engine's unsuffixed tags (and `latest`) name
    min_driver: int  # derived from MIN_DRIVER

    @property
    def tag_suffix(self) -> str:
        """`cuda12.9`: what every tag of this line carries (docs/tags.md)."""
        return f"cuda{self.cuda}"

    @property
    def target_part(self) -> str:
        """`cu129`: this line in a bake target's name (bake names allow no '.')."""
        return "cu" + self.cuda.replace(".", "")

    def baked_env(self) -> dict[str, str]:
        """The variables an image of this line bakes for the entry point's driver check."""
        return {VERSION_VAR: self.cuda, MIN_DRIVER_VAR: str(self.min_driver)}

    def labels(self) -> dict[str, str]:
        """The labels an image of this line carries."""
        return {VERSION_LABEL: self.cuda, MIN_DRIVER_LABEL: str(self.min_driver)}
