"""The model an engine's local base serves, as a path on this host: what `build.py --model` can bake
for that engine in tests and benches (SmolLM2 as GGUF for llama.cpp, as a safetensors directory for
the real vLLM)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import docker

from bakery.bases.make import ensure_base, smollm2_model_path
from bakery.spec.engine_spec import EngineSpec


def local_model(client: docker.DockerClient, spec: EngineSpec, tmp: Path) -> Path:
    """SmolLM2's GGUF from its wheel for a GGUF engine; else the model directory the engine's local base
    holds (base.local_model), copied out of it into `tmp` (streamed to disk, never held in memory)."""
    if spec.engine.model_format == "gguf":
        return smollm2_model_path()
    source = spec.base.local_model or ""
    if not source:
        raise ValueError(f"images/{spec.name}.yaml: base.local_model is not set, so its base holds no model")
    container = client.containers.create(ensure_base(spec.base.local), command=["true"])
    try:
        chunks, _ = container.get_archive(source)
        archive = tmp / "model.tar"
        with archive.open("wb") as out:
            for chunk in chunks:
                out.write(chunk)
        with tarfile.open(archive) as tar:
            tar.extractall(tmp / "extracted", filter="data")
        archive.unlink()
    finally:
        container.remove(force=True)
    return tmp / "extracted" / Path(source).name
