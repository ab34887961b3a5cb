"""`build.py --show`: an engine's resolved configuration, for launch-template authors."""

from __future__ import annotations

from bakery.model.manifest import BakedModel
from bakery.recipe.render import baked_env
from bakery.spec.engine_spec import EngineSpec

# Variables a launch template sets (never baked), with why.
LAUNCH_VARIABLES = (
    ("SERVERLESS", "true to start the worker on :3000 beside the engine (unset: the engine runs alone)"),
)
PLATFORM_VARIABLES = ("CONTAINER_ID", "REPORT_ADDR", "WORKER_PORT", "VAST_TCP_PORT_3000", "PUBLIC_IPADDR")


def show(spec: EngineSpec, model: BakedModel | None = None) -> str:
    """Render the --show report for one engine as text (with the model --model bakes, if any)."""
    lines = [f"engine {spec.name}: {spec.description} ({spec.version})",
             f"  production base: {spec.base.image}",
             f"  local base:      {spec.base.local or '-'}",
             "",
             "baked (a launch template inherits these and may override any of them with -e / template env):"]
    if model is not None:
        lines[3:3] = [f"  baked model:     {model.name} ({model.source.format}, {len(model.hashes)} files, "
                      f"{model.size} bytes) from {model.source.given}",
                      f"                   at {model.image_path}, digest sha256:{model.digest}, manifest "
                      f"/models/baked/{model.manifest_name}; tags carry -{model.tag_variant}"]
    for name, value in baked_env(spec, model).items():
        source = f"{spec.spec_path} bake.env.{name}"
        if model is not None and name == spec.engine.model_var:
            source = "--model (the baked model)"
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
