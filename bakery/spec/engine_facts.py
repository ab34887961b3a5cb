"""Every engine fact code and tests need, derived from the specs (`images/<engine>.yaml`) and nowhere else.

The gate, the entry point's checks and the worker tests read engines through this module instead of
naming them: a fifth engine is one more YAML file, and `tests/unit/test_engine_facts_agree.py` names any
place that still states a fact differently. Host-side only (the image carries the baked values, see
`baked_facts`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from bakery.spec.engine_spec import EXIT_LINE, EngineSpec, LocalLongAnswer, LocalRoute, available_engines, load_engine

# The variable every engine's model id may also come from, before the engine's own (upstream's name).
MODEL_NAME_VAR = "MODEL_NAME"
# What the image bakes so the entry point and the worker need no table of engines (bakery.recipe.render).
PROGRAM_VAR = "BAKERY_ENGINE_PROGRAM"
MODEL_VAR_VAR = "BAKERY_MODEL_VAR"
# The worker's route switches (worker/config/routes.py ROUTES_VAR, BENCHMARK_ROUTE_VAR).
ROUTES_VAR = "OPENAI_ROUTES"
BENCHMARK_ROUTE_VAR = "BENCHMARK_ROUTE"
# Where the worker adapters live, relative to the repository's worker/ directory.
ADAPTERS_DIR = "workers"


@dataclass(frozen=True)
class EngineFacts:
    """One engine's facts, each derived from its spec."""

    name: str
    program: str  # supervisord's program name: what `INFO exited: <program>` and `stopped: <program>` carry
    exit_line: str  # the line bakery's entry point writes into MODEL_LOG when the engine exits
    backend: str  # the baked BACKEND: the worker adapter workers/<backend>/worker.py
    aliases: tuple[str, ...]  # other BACKEND values meaning this engine (openai for vllm)
    model_var: str  # the launch variable holding the model
    args_var: str  # the launch variable holding extra engine arguments
    model_log: str
    load_lines: tuple[str, ...]
    error_lines: tuple[str, ...]
    info_lines: tuple[str, ...]
    health_endpoint: str
    local_base: str | None  # bakery.bases catalogue name
    local_model: str | None  # the model that local base serves
    # Launch overrides that make loading fail, one per way (base.local_fail_load); the first is fail_load_env.
    fail_load_envs: tuple[dict[str, str], ...] = ()
    local_env: dict[str, str] = field(default_factory=dict)  # every local launch's extra variables (base.local_env)
    shm_size: str | None = None  # the local base's /dev/shm (base.local_shm_size)
    max_launches: int | None = None  # gate containers of the local base at once (base.local_launches)
    local_route: LocalRoute | None = None  # a non-default route the local base serves (base.local_route)
    long_answer: LocalLongAnswer | None = None  # a streamed answer in flight for seconds (base.local_long_answer)

    @property
    def fail_load_env(self) -> dict[str, str]:
        """The first way loading fails (empty when the spec names none)."""
        return self.fail_load_envs[0] if self.fail_load_envs else {}

    def launch_env(self, model: str | None) -> dict[str, str]:
        """The engine part of a launch: the model variable set to `model` (the model the base serves),
        nothing when no model is known (a team's own base without --base-model)."""
        return {self.model_var: model} if model else {}

    def route_env(self) -> dict[str, str]:
        """The launch overrides that serve and benchmark only base.local_route's route, with its extra variables."""
        if self.local_route is None:
            raise ValueError(f"images/{self.name}.yaml: base.local_route is not set")
        route = self.local_route.route
        return {ROUTES_VAR: route, BENCHMARK_ROUTE_VAR: route, **self.local_route.env}


def facts(spec: EngineSpec) -> EngineFacts:
    """The facts of one loaded spec."""
    env = spec.bake.env
    fail_envs = []
    for fail in spec.base.fail_loads:
        fail_env = dict(fail.env)
        if fail.model is not None:
            fail_env[spec.engine.model_var] = fail.model
        fail_envs.append(fail_env)
    return EngineFacts(
        name=spec.name,
        program=spec.name,
        exit_line=EXIT_LINE.format(name=spec.name),
        backend=str(env["BACKEND"]),
        aliases=tuple(spec.aliases),
        model_var=spec.engine.model_var,
        args_var=spec.engine.args_var,
        model_log=str(env["MODEL_LOG"]),
        load_lines=tuple(env["MODEL_LOAD_LOG_MSG"]),
        error_lines=tuple(env["MODEL_ERROR_LOG_MSGS"]),
        info_lines=tuple(env["MODEL_INFO_LOG_MSGS"]),
        health_endpoint=str(env["MODEL_HEALTH_ENDPOINT"]),
        local_base=spec.base.local,
        local_model=spec.base.local_model,
        fail_load_envs=tuple(fail_envs),
        local_env=dict(spec.base.local_env),
        shm_size=spec.base.local_shm_size,
        max_launches=spec.base.local_launches,
        local_route=spec.base.local_route,
        long_answer=spec.base.local_long_answer,
    )


def all_facts(images_dir: Path | None = None) -> dict[str, EngineFacts]:
    """Every engine's facts, by name, in name order."""
    return {name: facts(load_engine(name, images_dir)) for name in available_engines(images_dir)}


def engine_facts(name: str, images_dir: Path | None = None) -> EngineFacts:
    """One engine's facts; an unknown name is an InputError listing the valid ones."""
    return facts(load_engine(name, images_dir))


def model_id_vars(images_dir: Path | None = None) -> tuple[str, ...]:
    """Where a worker outside an image looks for the served model id, in order: MODEL_NAME, then each
    engine's model variable (engines in name order, each variable once)."""
    names = [MODEL_NAME_VAR]
    for item in all_facts(images_dir).values():
        if item.model_var not in names:
            names.append(item.model_var)
    return tuple(names)


def backend_programs(images_dir: Path | None = None) -> dict[str, str]:
    """Every BACKEND value an image may be launched with -> the engine program it runs (aliases included)."""
    table: dict[str, str] = {}
    for item in all_facts(images_dir).values():
        table.setdefault(item.backend, item.program)
        for alias in item.aliases:
            table[alias] = item.program
    return table


def backend_aliases(images_dir: Path | None = None) -> dict[str, str]:
    """BACKEND aliases -> the engine they mean (today {"openai": "vllm"})."""
    return {alias: item.name for item in all_facts(images_dir).values() for alias in item.aliases}


def baked_facts(spec: EngineSpec) -> dict[str, str]:
    """The facts an image bakes beside its bake.env, so nothing inside it needs a table of engines."""
    return {PROGRAM_VAR: spec.name, MODEL_VAR_VAR: spec.engine.model_var}


def adapter_path(worker_dir: Path, backend: str) -> Path:
    """The worker adapter a BACKEND runs (workers/<backend>/worker.py under the worker directory)."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", backend):
        raise ValueError(f"{backend!r} is not a BACKEND name")
    return worker_dir / ADAPTERS_DIR / backend / "worker.py"
