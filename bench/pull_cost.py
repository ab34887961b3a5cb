"""What an engine image costs to pull, layer by layer, and what a host holding one release pulls for the next.

    python bench/pull_cost.py [--engine llama] [--model PATH] [--json]

A registry is what a host pulls from, so this pushes to one: Debian's `docker-registry` (the CNCF
distribution registry) on a free loopback port, from a temporary storage directory
(tests/image/real_registry.py). Three builds of the engine image on its local base, with the layer
cache, from build contexts of the bench's own (bench/build_bench.py's `Builds`; the repository is
never edited):
- `release`: the image as build.py makes it;
- `worker change`: one line appended to a worker module (what a worker-only release changes);
- `bake change`: one baked value changed (one more MODEL_INFO_LOG_MSGS line).
Each is pushed to the same repository; a layer whose digest the registry already holds is not
uploaded again, so the bytes of a push's new layers (their compressed sizes, from the manifest) are the
bytes a host that holds the release must pull for it. Each layer is named by the Dockerfile step that
made it (the image config's history, empty layers skipped). Prints the per-layer table, then the
bytes each change re-pushes against the release's total. With `--model PATH` all three bake that model
(build.py --model) into its own layer, and the bench also says whether a change re-pushes it (it must
not: the layer sits below every worker and bake step).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import docker  # noqa: E402
from build_bench import WORKER_CHANGE_FILE, Builds, bake_changed, build, remove_images  # noqa: E402

from bakery.bases import make as bases  # noqa: E402
from bakery.model import manifest as baked  # noqa: E402
from bakery.model.source import find_model  # noqa: E402
from bakery.spec.engine_spec import load_engine  # noqa: E402
from tests.image.real_registry import push_as, running_registry, skopeo_config, skopeo_raw  # noqa: E402

MB = 1e6


def layers(ref: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The pushed image's layers, in order (digest, compressed size, the step that made each), and its
    config blob (digest, size): a change that adds no layer still pulls a new config."""
    manifest, _ = skopeo_raw(ref) or ({}, "")
    steps = [entry.get("created_by") or "(the base's root file system: docker import)"
             for entry in skopeo_config(ref).get("history", []) if not entry.get("empty_layer")]
    config = manifest.get("config") or {}
    return ([{"digest": layer["digest"], "bytes": int(layer["size"]), "step": step}
             for layer, step in zip(manifest.get("layers", []), steps, strict=True)],
            {"digest": config.get("digest"), "bytes": int(config.get("size") or 0)})


def short_step(created_by: str) -> str:
    """A history entry as the Dockerfile step it came from, on one short line."""
    text = " ".join(created_by.replace("/bin/sh -c #(nop) ", "").split())
    return text if len(text) <= 90 else text[:87] + "..."


def measure(engine: str, model_path: Path | None = None) -> dict[str, Any]:
    """Build the three images (with the model at `model_path` baked, if given), push them, and return the
    per-layer table and each change's new bytes."""
    client = docker.from_env(timeout=1800)
    spec = load_engine(engine)
    model = baked.bake(find_model(model_path, spec)) if model_path is not None else None
    bases.ensure_base("debian")
    base_ref = bases.ensure_base(spec.base.local)
    builds = Builds(client, spec, base_ref)
    made: list[str] = []
    storage = Path(tempfile.mkdtemp(prefix="bakery-bench-registry-"))
    try:
        release_ctx = builds.context("release", model=model)
        release = build(client, release_ctx, nocache=False)
        worker_ctx = builds.tmp / "worker-change"
        shutil.copytree(release_ctx, worker_ctx)
        with open(worker_ctx / WORKER_CHANGE_FILE, "a", encoding="utf-8") as handle:
            handle.write(f"# bakery bench: a one-line worker change ({time.time_ns()})\n")
        worker = build(client, worker_ctx, nocache=False)
        bake = build(client, builds.context("bake-change", bake_changed(spec), model=model), nocache=False)
        made += release.made() + worker.made() + bake.made()
        with running_registry(storage) as registry:
            repository = f"{registry.host}/bakery-bench/{engine}"
            pushed: dict[str, list[dict[str, Any]]] = {}
            configs: dict[str, dict[str, Any]] = {}
            for name, image_id in (("release", release.image_id), ("worker change", worker.image_id),
                                   ("bake change", bake.image_id)):
                ref = f"{repository}:{name.replace(' ', '-')}"
                push_as(client, image_id, ref)
                pushed[name], configs[name] = layers(ref)
                with contextlib.suppress(docker.errors.APIError):
                    client.images.remove(ref, noprune=True)
        held = {layer["digest"] for layer in pushed["release"]}
        total = sum(layer["bytes"] for layer in pushed["release"])
        changes = {}
        for name in ("worker change", "bake change"):
            new = [layer for layer in pushed[name] if layer["digest"] not in held]
            config = configs[name]["bytes"] if configs[name]["digest"] != configs["release"]["digest"] else 0
            changes[name] = {"layers": len(new), "bytes": sum(layer["bytes"] for layer in new) + config,
                             "config_bytes": config, "steps": [short_step(layer["step"]) for layer in new],
                             "model_layer_repushed": any(baked.BAKED_DIR in layer["step"] for layer in new)}
        model_layers = [layer for layer in pushed["release"] if baked.BAKED_DIR in layer["step"]]
        return {"engine": engine, "base": base_ref, "release_bytes": total,
                "layers": [{**layer, "step": short_step(layer["step"])} for layer in pushed["release"]],
                "changes": changes, "model": model.labels() if model is not None else None,
                "model_layer_bytes": sum(layer["bytes"] for layer in model_layers)}
    finally:
        remove_images(client, made)
        builds.close()
        shutil.rmtree(storage, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="llama", help="the engine whose image is measured (default llama)")
    parser.add_argument("--model", type=Path, metavar="PATH",
                        help="bake this model into all three builds (build.py --model) and report its layer")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    result = measure(args.engine, args.model)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"pull cost of the {result['engine']} image on {result['base']} (compressed, as pushed):")
    print(f"{'MB':>9}  step")
    for layer in result["layers"]:
        print(f"{layer['bytes'] / MB:9.2f}  {layer['step']}")
    print(f"{result['release_bytes'] / MB:9.2f}  total: what a host holding none of it pulls")
    for name, change in result["changes"].items():
        share = change["bytes"] / result["release_bytes"] if result["release_bytes"] else 0.0
        print(f"{name}: {change['layers']} new layer(s) and a {change['config_bytes']:,}-byte config, "
              f"{change['bytes'] / MB:.3f} MB ({share:.2%} of the release) for a host holding the release"
              + (f": {'; '.join(change['steps'])}" if change["steps"] else ""))
        if result["model"]:
            print(f"  the model's layer ({result['model_layer_bytes'] / MB:.2f} MB): "
                  + ("RE-PUSHED" if change["model_layer_repushed"] else "not re-pushed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
