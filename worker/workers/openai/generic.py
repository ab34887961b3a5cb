"""The worker of an engine that has no adapter of its own (no workers/<BACKEND>/worker.py).

Its defaults are the values its image bakes: the program name (BAKERY_ENGINE_PROGRAM), the log file
and the log grammar (MODEL_LOG, MODEL_LOAD_LOG_MSG, MODEL_ERROR_LOG_MSGS); the core takes the model
id from the variable BAKERY_MODEL_VAR names when MODEL_NAME is unset, as for every engine.
start_server.sh runs it only when BACKEND names that program, so a misspelt BACKEND still fails loudly.
Outside an image the variables are missing: it exits 2 with one line naming what to set.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from app.core import run
from app.output import line_out
from app.worker_config import DEFAULT_HEALTH_ENDPOINT, DEFAULT_INFO_LINES, EngineDefaults, parse_lines
from config import table

REQUIRED = ("BAKERY_ENGINE_PROGRAM", "MODEL_LOG", "MODEL_LOAD_LOG_MSG", "MODEL_ERROR_LOG_MSGS")
EXIT_CONFIG = 2


class MissingBake(Exception):
    """The environment lacks what an image would have baked."""


def _get(env: Mapping[str, str], name: str) -> str:
    return table.text(env, name) or ""


def defaults_from_env(env: Mapping[str, str]) -> EngineDefaults:
    """The engine's defaults, from what its image bakes; MissingBake names every missing variable."""
    missing = [name for name in REQUIRED if not _get(env, name)]
    if missing:
        backend = _get(env, "BACKEND") or "?"
        raise MissingBake(f"BACKEND={backend} has no worker adapter (workers/{backend}/worker.py), so the worker "
                          f"runs on the values an image bakes; set {', '.join(missing)} (see images/<engine>.yaml)")
    info = parse_lines(env["MODEL_INFO_LOG_MSGS"]) if _get(env, "MODEL_INFO_LOG_MSGS") else list(DEFAULT_INFO_LINES)
    return EngineDefaults(
        engine=_get(env, "BAKERY_ENGINE_PROGRAM"),
        model_log=_get(env, "MODEL_LOG"),
        load_lines=tuple(parse_lines(env["MODEL_LOAD_LOG_MSG"])),
        error_lines=tuple(parse_lines(env["MODEL_ERROR_LOG_MSGS"])),
        info_lines=tuple(info),
        health_endpoint=_get(env, "MODEL_HEALTH_ENDPOINT") or DEFAULT_HEALTH_ENDPOINT,
    )


def main() -> None:
    """Run the shared core with the baked values as the engine's defaults."""
    try:
        defaults = defaults_from_env(table.snapshot())
    except MissingBake as exc:
        line_out(sys.stderr, f"bakery-worker: error: {exc}")
        raise SystemExit(EXIT_CONFIG) from None
    run(defaults)


if __name__ == "__main__":
    main()
