"""Host-side cache of everything an image build needs from the network (wheels, models, rootfs).

Images are built without network inside `docker build`; this module prepares the inputs on the host
(where PyPI is reachable) and keeps them under one cache directory so a second build is offline.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bakery.errors import BuildError


def cache_dir() -> Path:
    """Return the cache root (`$BAKERY_CACHE`, default `~/.cache/bakery`), creating it if needed."""
    root = Path(os.environ.get("BAKERY_CACHE") or Path.home() / ".cache" / "bakery")
    root.mkdir(parents=True, exist_ok=True)
    return root


def pip_download(
    args: list[str],
    dest: Path,
    *,
    python_version: str | None = None,
    platforms: tuple[str, ...] = (),
) -> Path:
    """Download wheels into `dest` with the host's pip (`args` are requirement args, e.g. `-r file`).

    With `python_version`/`platforms`, wheels are chosen for that target instead of the host, so an
    image whose Python differs from the host's still gets matching binaries.
    """
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet",
           "--dest", str(dest)]
    if python_version or platforms:
        cmd += ["--only-binary", ":all:"]
        if python_version:
            cmd += ["--python-version", python_version]
        for plat in platforms:
            cmd += ["--platform", plat]
    cmd += args
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BuildError(f"pip download {' '.join(args)} failed: {last}")
    return dest
