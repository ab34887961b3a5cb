"""One source of truth per fact: each baked value agrees with the worker's own default for it,
or the spec declares why it differs (spec `notes`)."""

from __future__ import annotations

import importlib
import sys

import pytest

from bakery.spec import REPO_ROOT, available_engines, load_engine

sys.path.insert(0, str(REPO_ROOT / "worker"))
core = importlib.import_module("workers.openai.core")


@pytest.mark.parametrize("engine", available_engines())
def test_baked_values_match_worker_defaults(engine: str) -> None:
    spec = load_engine(engine)
    defaults = importlib.import_module(f"workers.{spec.bake.env['BACKEND']}.worker").DEFAULTS
    env = spec.bake.env
    assert defaults.engine == engine
    pairs = {
        "MODEL_LOG": (env["MODEL_LOG"], defaults.model_log),
        "MODEL_LOAD_LOG_MSG": (env["MODEL_LOAD_LOG_MSG"], list(defaults.load_lines)),
        "MODEL_ERROR_LOG_MSGS": (env["MODEL_ERROR_LOG_MSGS"], list(defaults.error_lines)),
        "MODEL_INFO_LOG_MSGS": (env["MODEL_INFO_LOG_MSGS"], list(defaults.info_lines)),
        "MODEL_HEALTH_ENDPOINT": (env["MODEL_HEALTH_ENDPOINT"], defaults.health_endpoint),
    }
    undeclared = {name: pair for name, pair in pairs.items() if pair[0] != pair[1] and name not in spec.notes}
    assert not undeclared, f"baked value differs from the worker default without a note in the spec: {undeclared}"


@pytest.mark.parametrize("engine", available_engines())
def test_declared_differences_still_contain_the_upstream_lines(engine: str) -> None:
    # A declared difference may add lines; it must never drop one the worker would have matched.
    spec = load_engine(engine)
    defaults = importlib.import_module(f"workers.{spec.bake.env['BACKEND']}.worker").DEFAULTS
    assert set(defaults.error_lines) <= set(spec.bake.env["MODEL_ERROR_LOG_MSGS"])


def test_worker_reads_the_baked_list_encoding_back() -> None:
    from bakery.render import baked_env

    for engine in available_engines():
        spec = load_engine(engine)
        for name in ("MODEL_LOAD_LOG_MSG", "MODEL_ERROR_LOG_MSGS", "MODEL_INFO_LOG_MSGS"):
            assert core.parse_lines(baked_env(spec)[name]) == spec.bake.env[name]
