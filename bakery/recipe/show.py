"""`build.py --show`: an engine's resolved configuration, for launch-template authors."""

from __future__ import annotations

from typing import Any

from bakery.model.manifest import BakedModel
from bakery.recipe.plan import BuildOptions, baked_model, cuda_line
from bakery.recipe.render import baked_env
from bakery.recipe.tags import release_tags
from bakery.spec.cuda import DRIVER_SOURCE, MIN_DRIVER_VAR, VERSION_VAR, CudaVariant
from bakery.spec.engine_spec import EngineSpec

# Variables a launch template sets (never baked), with why.
LAUNCH_VARIABLES = (
    ("SERVERLESS", "true to start the worker on :3000 beside the engine (unset: the engine runs alone)"),
)
PLATFORM_VARIABLES = ("CONTAINER_ID", "REPORT_ADDR", "WORKER_PORT", "VAST_TCP_PORT_3000", "PUBLIC_IPADDR")


def cuda_lines(spec: EngineSpec, repository: str = "bakery") -> list[dict[str, Any]]:
    """Each CUDA line of `spec` (the default first): its version, base, driver floor and release tags."""
    return [{"cuda": line.cuda, "default": line.default, "base": line.image, "min_driver": line.min_driver,
             "driver_source": DRIVER_SOURCE,
             "tags": release_tags(spec, repository=repository, cuda=line)} for line in spec.base.cuda_variants]


def _cuda_text(spec: EngineSpec, shown: CudaVariant | None) -> list[str]:
    if shown is None:
        return ["  CUDA lines:      none (no driver floor; the image is built once)"]
    lines = ["  CUDA lines (one image each; the floor from bakery/spec/cuda.py, NVIDIA's compatibility table):"]
    for item in cuda_lines(spec):
        mark = "  <- shown below" if item["cuda"] == shown.cuda else ""
        lines.append(f"    {item['cuda']:5} driver >= {item['min_driver']}  {item['base']:40} "
                     f"tags {', '.join(t for t in _short_tags(item['tags']))}"
                     f"{' (default)' if item['default'] else ''}{mark}")
    return lines


def _short_tags(tags: list[str]) -> list[str]:
    """The tags a template names (the version ones, `latest`), without repository and bakery pins."""
    return [tag.rpartition(":")[2] for tag in tags if "-bakery" not in tag]


def show_json(spec: EngineSpec, options: BuildOptions) -> dict[str, Any]:
    """--show --json: one engine's resolved configuration, with its CUDA lines and their floors."""
    model = baked_model(spec, options)
    shown = cuda_line(spec, options.cuda)
    env = baked_env(spec, model, options.cuda)
    return {"engine": spec.name, "version": spec.version, "description": spec.description,
            "production_base": shown.image if shown else spec.base.image, "local_base": spec.base.local,
            "cuda": shown.cuda if shown else None, "min_driver": shown.min_driver if shown else None,
            "cuda_lines": cuda_lines(spec, options.repository),
            "env": env, "expose": list(spec.bake.expose),
            "launch_must_set": ([] if model else [spec.engine.model_var]) + [name for name, _ in LAUNCH_VARIABLES],
            "platform_sets": list(PLATFORM_VARIABLES)}


def show(spec: EngineSpec, model: BakedModel | None = None, cuda: str | None = None) -> str:
    """Render the --show report for one engine as text (with the model --model bakes, if any; the CUDA line
    `cuda` names, None: the default one)."""
    shown = cuda_line(spec, cuda)
    lines = [f"engine {spec.name}: {spec.description} ({spec.version})",
             f"  production base: {shown.image if shown else spec.base.image}",
             f"  local base:      {spec.base.local or '-'}",
             *_cuda_text(spec, shown),
             "",
             "baked (a launch template inherits these and may override any of them with -e / template env):"]
    if model is not None:
        lines[3:3] = [f"  baked model:     {model.name} ({model.source.format}, {len(model.hashes)} files, "
                      f"{model.size} bytes) from {model.source.given}",
                      f"                   at {model.image_path}, digest sha256:{model.digest}, manifest "
                      f"/models/baked/{model.manifest_name}; tags carry -{model.tag_variant}"]
    for name, value in baked_env(spec, model, cuda).items():
        source = f"{spec.spec_path} bake.env.{name}"
        if model is not None and name == spec.engine.model_var:
            source = "--model (the baked model)"
        elif name in (VERSION_VAR, MIN_DRIVER_VAR):
            source = (f"{spec.spec_path} base.cuda_lines and bakery/spec/cuda.py (the entry point refuses an "
                      "older driver)")
        elif name.startswith("BAKERY_"):
            source = f"{spec.spec_path} {'name' if name == 'BAKERY_ENGINE_PROGRAM' else 'engine'}"
        lines.append(f"  {name}={value}")
        lines.append(f"      from {source}" + (f"; {spec.notes[name]}" if name in spec.notes else ""))
    lines.append(f"  EXPOSE {' '.join(str(p) for p in spec.bake.expose)}")
    lines.append("")
    lines.append("a launch template must set:")
    if model is None:
        lines.append(f"  {spec.engine.model_var}  the model the engine serves (also the worker's model id)")
    for name, why in LAUNCH_VARIABLES:
        lines.append(f"  {name}  {why}")
    lines.append("optional:")
    if model is not None:
        lines.append(f"  {spec.engine.model_var}  another model than the baked one (default {model.image_path})")
    lines.append(f"  {spec.engine.args_var}  extra engine arguments (shell-split, appended)")
    lines.append("  MODEL_NAME  the served-model id, when it differs from the model variable")
    lines.append("set by the platform at launch (never baked): " + ", ".join(PLATFORM_VARIABLES))
    return "\n".join(lines)
