"""One test for every place that still states an engine fact outside `images/<engine>.yaml`.

The specs are the source (bakery.spec.engine_facts); each check below names the file, the fact and both
values when they drift apart, so a fifth engine, or a changed spec, shows exactly what else to touch.
Replaces tests/unit/test_bake_agrees_with_worker.py's per-adapter check with one for every engine.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

from bakery.spec import engine_facts
from bakery.spec.engine_facts import EngineFacts, all_facts, backend_aliases, model_id_vars
from bakery.spec.engine_spec import EXIT_LINE, REPO_ROOT, available_engines, load_engine

WORKER_DIR = REPO_ROOT / "worker"
sys.path.insert(0, str(WORKER_DIR))
FACTS = all_facts()

# Code that must carry no engine name: it reads engines from the specs (or from what the image bakes).
ENGINE_AGNOSTIC = ("bakery", "worker/boot", "worker/workers/openai", "tests/image/launch.py",
                   "tests/image/conftest.py", "tests/image/test_gate.py")
# Engine names still written there, each with the edit that removes it. The test fails when a new one
# appears and when one of these is gone (then delete its entry): the list only shrinks.
PENDING: dict[tuple[str, str], str] = {}


def _adapter(backend: str):
    return importlib.import_module(f"workers.{backend}.worker")


def _assigned_literals(path: Path) -> dict[str, object]:
    """Module-level NAME = <literal> assignments of a file, read without importing it."""
    values: dict[str, object] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return values


@pytest.mark.parametrize("engine", available_engines())
def test_worker_adapter_agrees_with_the_spec(engine: str) -> None:
    facts = FACTS[engine]
    spec = load_engine(engine)
    path = engine_facts.adapter_path(WORKER_DIR, facts.backend)
    if not path.is_file():
        # No adapter: the generic worker serves the engine from what its image bakes, and
        # start_server.sh picks it only for the image's own program (so a misspelt BACKEND still fails).
        assert facts.backend == facts.program, \
            f"images/{engine}.yaml: bake.env.BACKEND={facts.backend!r} names no adapter ({path}) and is not the " \
            f"engine's name {facts.program!r}, which the generic worker serves: set BACKEND: {facts.program} or add " \
            "the adapter"
        return
    defaults = _adapter(facts.backend).DEFAULTS
    where = f"{path.relative_to(REPO_ROOT)} DEFAULTS"
    assert defaults.engine == facts.name, f"{where}.engine={defaults.engine!r}, images/{engine}.yaml: name={engine!r}"
    pairs = {
        "MODEL_LOG": (facts.model_log, defaults.model_log),
        "MODEL_LOAD_LOG_MSG": (facts.load_lines, tuple(defaults.load_lines)),
        "MODEL_ERROR_LOG_MSGS": (facts.error_lines, tuple(defaults.error_lines)),
        "MODEL_INFO_LOG_MSGS": (facts.info_lines, tuple(defaults.info_lines)),
        "MODEL_HEALTH_ENDPOINT": (facts.health_endpoint, defaults.health_endpoint),
    }
    drift = {name: f"spec {baked!r} != worker {own!r}" for name, (baked, own) in pairs.items()
             if baked != own and name not in spec.notes}
    assert not drift, f"{where} differs from images/{engine}.yaml without a note there: {drift}"
    # A declared difference may add lines; it must never drop one the worker itself would match.
    dropped = set(defaults.error_lines) - set(facts.error_lines)
    assert not dropped, f"images/{engine}.yaml: MODEL_ERROR_LOG_MSGS drops {sorted(dropped)} of {where}"
    assert facts.exit_line in defaults.error_lines, f"{where}.error_lines lacks {facts.exit_line!r}"


@pytest.mark.parametrize("engine", [e for e in available_engines() if FACTS[e].aliases])
def test_alias_adapters_are_the_engine_itself(engine: str) -> None:
    facts = FACTS[engine]
    for alias in facts.aliases:
        path = engine_facts.adapter_path(WORKER_DIR, alias)
        assert path.is_file(), f"images/{engine}.yaml: aliases: {alias!r} has no adapter {path}"
        assert _adapter(alias).DEFAULTS is _adapter(facts.backend).DEFAULTS, \
            f"{path.relative_to(REPO_ROOT)} must import workers.{facts.backend}.worker's DEFAULTS, not copy them"


def test_every_adapter_serves_a_spec() -> None:
    served = {f.backend for f in FACTS.values()} | {a for f in FACTS.values() for a in f.aliases}
    adapters = {p.parent.name for p in (WORKER_DIR / "workers").glob("*/worker.py")}
    assert adapters - served == set(), f"worker adapters no spec names (BACKEND or aliases): {adapters - served}"


def test_aliases_are_unique_across_specs() -> None:
    seen: dict[str, str] = {}
    for facts in FACTS.values():
        for alias in facts.aliases:
            assert alias not in seen, f"aliases: {alias!r} is claimed by images/{seen[alias]}.yaml and " \
                                      f"images/{facts.name}.yaml"
            seen[alias] = facts.name
    assert backend_aliases() == seen


# Upstream's precedence for the served model id (pyworker #88; docs/engines.md): a fact of upstream's
# worker, not of images/, so a fourth engine adds nothing to it.
UPSTREAM_MODEL_ID_VARS = ("MODEL_NAME", "VLLM_MODEL", "SGLANG_MODEL", "LLAMA_MODEL")


def test_worker_model_id_variables_reach_every_specs_model_variable() -> None:
    core = importlib.import_module("workers.openai.core")
    assert core.MODEL_ID_VARS == UPSTREAM_MODEL_ID_VARS, \
        f"worker/workers/openai/core.py MODEL_ID_VARS={core.MODEL_ID_VARS}, upstream's are {UPSTREAM_MODEL_ID_VARS}"
    assert model_id_vars()[0] == "MODEL_NAME"
    for facts in FACTS.values():
        # What the image bakes (bakery.render: BAKERY_MODEL_VAR = engine.model_var) is what the worker reads,
        # right after MODEL_NAME, so every engine's own variable names its model, adapter or not.
        looked_up = core.model_id_vars({engine_facts.MODEL_VAR_VAR: facts.model_var})
        assert looked_up[:2] == ("MODEL_NAME", facts.model_var), \
            f"images/{facts.name}.yaml engine.model_var={facts.model_var!r}: the worker looks up {looked_up}"


def test_entry_point_aliases_are_the_specs() -> None:
    entry = _assigned_literals(WORKER_DIR / "boot" / "entrypoint.py")
    if "ALIASES" in entry:  # until the entry point reads the baked BAKERY_ENGINE_PROGRAM
        assert entry["ALIASES"] == backend_aliases(), \
            f"worker/boot/entrypoint.py ALIASES={entry['ALIASES']}; the specs' aliases give {backend_aliases()}"


def test_exit_line_is_the_one_the_entry_point_writes() -> None:
    watch = (WORKER_DIR / "boot" / "watch.py").read_text(encoding="utf-8")
    prefix = EXIT_LINE.split("{", 1)[0]
    assert f'f"{prefix}{{name}}' in watch, (
        f"worker/boot/watch.py no longer writes {EXIT_LINE!r}: bakery.spec.engine_spec.EXIT_LINE and every spec "
        "must follow")


@pytest.mark.parametrize("engine", [e for e in available_engines() if FACTS[e].local_base])
def test_gate_launches_the_local_base_with_the_spec_model(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from bakery.build.verify import GATE_BASE_VAR
    from tests.image.launch import gate_model

    facts: EngineFacts = FACTS[engine]
    monkeypatch.setenv(GATE_BASE_VAR, "local")
    launch = _assigned_literals(REPO_ROOT / "tests" / "image" / "launch.py")
    if "LOCAL_MODELS" in launch:  # until tests/image/launch.py uses engine_facts.launch_env()
        served = launch["LOCAL_MODELS"].get(engine, launch["STANDIN_MODEL"])  # type: ignore[union-attr]
        assert served == facts.local_model, \
            f"tests/image/launch.py serves {served!r} on {engine}'s local base; " \
            f"images/{engine}.yaml: base.local_model is {facts.local_model!r}"
    assert facts.launch_env(gate_model(load_engine(engine))) == {facts.model_var: facts.local_model}
    from bakery.spec.base_catalogue import BASES

    assert facts.local_base in BASES, f"images/{engine}.yaml: base.local {facts.local_base!r} is not in the catalogue"
    serves = BASES[facts.local_base].serves
    if serves is not None:  # a base with a model file of its own: the spec must launch that one
        assert facts.local_model == serves, \
            f"bakery/spec/base_catalogue.py: {facts.local_base} serves {serves!r}; " \
            f"images/{engine}.yaml: base.local_model is {facts.local_model!r}"
    assert facts.fail_load_env, f"images/{engine}.yaml: base.local_fail_load gives no launch change"


def _engine_names_in(path: Path, names: set[str]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            found.add(node.value)
    return found


def test_no_engine_name_in_engine_agnostic_code() -> None:
    names = set(FACTS) | {a for f in FACTS.values() for a in f.aliases}
    found: set[tuple[str, str]] = set()
    for root in ENGINE_AGNOSTIC:
        top = REPO_ROOT / root
        for path in [top] if top.is_file() else sorted(top.rglob("*.py")):
            rel = str(path.relative_to(REPO_ROOT))
            found |= {(rel, name) for name in _engine_names_in(path, names)}
    new = {f"{path}: {name!r}" for path, name in found - set(PENDING)}
    assert not new, ("engine names written in engine-agnostic code (read them from bakery.spec.engine_facts): "
                     f"{sorted(new)}")
    gone = {f"{path}: {name!r}" for path, name in set(PENDING) - found}
    assert not gone, f"gone from the code, so drop their PENDING entries in {Path(__file__).name}: {sorted(gone)}"


def test_the_engine_name_check_can_fail(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text('ENGINE = "vllm"\nOTHER = "vllm-standin"\n')
    assert _engine_names_in(planted, set(FACTS)) == {"vllm"}


def test_route_switches_are_the_workers() -> None:
    # The gate's non-default route launch sets these names; the worker must read the very same.
    routes = importlib.import_module("workers.openai.routes")
    ours = (engine_facts.ROUTES_VAR, engine_facts.BENCHMARK_ROUTE_VAR)
    assert ours == (routes.ROUTES_VAR, routes.BENCHMARK_ROUTE_VAR)


def test_local_route_launch_serves_and_benchmarks_only_that_route() -> None:
    with_route = [item for item in FACTS.values() if item.local_route is not None]
    assert with_route, "no spec sets base.local_route: the gate proves no non-default route"
    for item in with_route:
        env = item.route_env()
        assert env[engine_facts.ROUTES_VAR] == env[engine_facts.BENCHMARK_ROUTE_VAR] == item.local_route.route
        assert item.local_route.env.items() <= env.items()
