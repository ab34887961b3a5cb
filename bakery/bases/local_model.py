"""The model an engine's local base serves, as a path on this host: what `build.py --model` can bake
for that engine in tests and benches (SmolLM2 as GGUF for llama.cpp, as a safetensors directory for
the real vLLM)."""

from __future__ import annotations

from pathlib import Path

from bakery.bases.make import ensure_base, smollm2_model_path
from bakery.docker import engine as docker_engine
from bakery.spec.engine_spec import EngineSpec


def local_model(spec: EngineSpec, tmp: Path) -> Path:
    """SmolLM2's GGUF from its wheel for a GGUF engine; else the model directory the engine's local base
    holds (base.local_model), copied out of it into `tmp` (through a file, never held in memory)."""
    if spec.engine.model_format == "gguf":
        return smollm2_model_path()
    if not spec.base.local_model:
        raise ValueError(f"images/{spec.name}.yaml: base.local_model is not set, so its base holds no model")
    return docker_engine.copy_from_image(ensure_base(spec.base.local), spec.base.local_model, tmp)
