"""The worker of an engine that has no adapter of its own (no workers/<BACKEND>/worker.py).

It runs as an adapter would, named by the program the image bakes (BAKERY_ENGINE_PROGRAM); the engine's
facts come baked, as for every engine. start_server.sh runs it only when BACKEND names that program, so a
misspelt BACKEND still fails loudly; outside an image it exits 2 naming what to set.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from app.core import run
from app.output import EXIT_CONFIG, line_out
from app.worker_config import BAKED_FACTS, EngineDefaults
from config import table

PROGRAM_VAR = "BAKERY_ENGINE_PROGRAM"
REQUIRED = (PROGRAM_VAR, *BAKED_FACTS)


class MissingBake(Exception):
    """The environment lacks what an image would have baked."""


def defaults_from_env(env: Mapping[str, str]) -> EngineDefaults:
    """The engine's defaults: its program's name, as its image bakes it; MissingBake names every baked
    variable that is not set (outside an image, the one line to read)."""
    missing = [name for name in REQUIRED if not table.text(env, name)]
    if missing:
        backend = table.text(env, "BACKEND") or "?"
        raise MissingBake(f"BACKEND={backend} has no worker adapter (workers/{backend}/worker.py), so the worker "
                          f"runs on the values an image bakes; set {', '.join(missing)} (see images/<engine>.yaml)")
    return EngineDefaults(engine=table.text(env, PROGRAM_VAR) or "")


def main() -> None:
    """Run the shared core for the baked program."""
    try:
        defaults = defaults_from_env(table.snapshot())
    except MissingBake as exc:
        line_out(sys.stderr, f"bakery-worker: error: {exc}")
        raise SystemExit(EXIT_CONFIG) from None
    run(defaults)


if __name__ == "__main__":
    main()
