"""Build-side measurements of bench/run.py: image sizes, full build vs rebuilds, render, gate, CI parts.

- Sizes: `docker image inspect` Size of the image minus that of its base (what the worker adds, all
  layers), plus `du` inside the image of the worker venv, the bundled Python and the worker code.
- Full build: the engine image's Dockerfile built with `nocache=True` (every stage of its own: the
  bundled-Python stage, the venv stage, the image) on present bases, from the same context.
- Rebuilds, each right after a full build, with the layer cache: (a) a one-line change in the worker
  (a comment appended to app/core.py in a copy of the context; the repo is never edited),
  (b) a one-value bake change (the spec's MODEL_INFO_LOG_MSGS changed, rendered again), both with the
  full build's build args (one checkout); (c) the worker change as a new commit would build it (its
  revision and created labels changed too: one more step). For each,
  the classic builder's output says per step whether it came from cache (`---> Using cache`): every
  step before the changed one must, and the changed one must not.
- Render: `python build.py --all --render-only --out DIR` as a fresh process.
- Gate: `bakery.build.verify.run_gate(image, engine, variant="local")` on a present image.
"""

from __future__ import annotations

import contextlib
import copy
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors

from bakery.build.builder import build_args
from bakery.build.verify import run_gate
from bakery.host.wheelhouse import wheelhouse
from bakery.model.manifest import BakedModel
from bakery.recipe.render import RenderOptions, render, write_context
from bakery.spec.engine_spec import REPO_ROOT, EngineSpec, parse_spec

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_LAYER = re.compile(r"^---> ([0-9a-f]{12})$")
WORKER_CHANGE_FILE = "worker/app/core.py"


@dataclass
class Step:
    """One Dockerfile step of a classic build: its instruction and whether it came from the cache."""

    number: int
    instruction: str
    cached: bool = False
    image: str = ""  # the layer (image id) the step produced or reused
    seconds: float = 0.0  # from this step's start to the next one's (or the end of the build)


@dataclass
class Build:
    """A finished build: image id, seconds, and its steps."""

    image_id: str
    seconds: float
    steps: list[Step] = field(default_factory=list)

    def made(self) -> list[str]:
        """Image ids this build created (never one reused from the cache: those may be others')."""
        return [s.image for s in self.steps if s.image and not s.cached] + [self.image_id]

    def summary(self, changed: str) -> dict[str, Any]:
        """Cache use around the first step whose instruction starts with `changed`."""
        runnable = [s for s in self.steps if not s.instruction.upper().startswith("FROM ")]
        first = next((i for i, s in enumerate(runnable) if s.instruction.startswith(changed)), None)
        before = runnable[:first] if first is not None else runnable
        return {"steps": len(runnable), "cached": sum(s.cached for s in runnable),
                "before_changed": len(before), "before_changed_cached": sum(s.cached for s in before),
                "changed_step": runnable[first].instruction[:60] if first is not None else None,
                "changed_rebuilt": first is not None and not runnable[first].cached,
                "rebuilt": [f"{s.instruction[:40]} ({s.seconds:.1f} s)" for s in runnable if not s.cached]}


def build(client: docker.DockerClient, context: Path, *, nocache: bool,
          buildargs: dict[str, str] | None = None) -> Build:
    """A classic `docker build` of `context` (untagged), timed, with per-step cache use."""
    steps: list[Step] = []
    image_id = ""
    started = mark = time.monotonic()
    stream = client.api.build(path=str(context), buildargs=buildargs or build_args(), rm=True, forcerm=True, pull=False,
                              nocache=nocache, decode=True)
    for chunk in stream:
        if "error" in chunk:
            raise RuntimeError(f"bench build failed: {chunk['error'].strip()}")
        for raw in _ANSI.sub("", chunk.get("stream", "")).splitlines():
            line = raw.strip()
            match = _STEP.match(line)
            if match:
                now = time.monotonic()
                if steps:
                    steps[-1].seconds = now - mark
                mark = now
                steps.append(Step(int(match.group(1)), match.group(3)))
            elif line == "---> Using cache" and steps:
                steps[-1].cached = True
            elif (layer := _LAYER.match(line)) and steps:
                steps[-1].image = layer.group(1)
        image_id = (chunk.get("aux") or {}).get("ID", image_id)
    if not image_id:
        raise RuntimeError("bench build ended without an image id")
    if steps:
        steps[-1].seconds = time.monotonic() - mark
    return Build(image_id=image_id, seconds=time.monotonic() - started, steps=steps)


def remove_images(client: docker.DockerClient, image_ids: list[str]) -> None:
    """Remove images and layers this bench created (untagged, never a base, never a layer it took
    from the cache), newest first; Docker refuses any still used by a container or a child image."""
    for image_id in reversed(image_ids):
        with contextlib.suppress(docker.errors.APIError):
            client.images.remove(image_id, noprune=False)


def bake_changed(spec: EngineSpec) -> EngineSpec:
    """The spec with one baked value changed (MODEL_INFO_LOG_MSGS gets one more line)."""
    data = copy.deepcopy(spec.model_dump(mode="python", exclude_none=True))
    info = list(data["bake"]["env"].get("MODEL_INFO_LOG_MSGS") or [])
    data["bake"]["env"]["MODEL_INFO_LOG_MSGS"] = [*info, "bakery bench: one more info line"]
    return parse_spec(data, f"images/{spec.name}.yaml (bench: bake change)")


class Builds:
    """Build contexts in a private directory (never the shared cache/contexts/<engine>)."""

    def __init__(self, client: docker.DockerClient, spec: EngineSpec, base_ref: str) -> None:
        self.client = client
        self.spec = spec
        self.base_ref = base_ref
        self.tmp = Path(tempfile.mkdtemp(prefix="bakery-bench-build-"))
        self.kept: list[str] = []  # the image the boot tests and the gate use: removed by close()

    def context(self, name: str, spec: EngineSpec | None = None, model: BakedModel | None = None) -> Path:
        """A build context for `spec` (default: the engine's own), with `model` baked if given, under this
        bench's directory."""
        rendered = render(spec or self.spec, RenderOptions(base_image=self.base_ref, model=model))
        return write_context(rendered, self.tmp / name, wheelhouse())

    def image(self) -> str:
        """The engine image as build.py makes it (layer cache allowed): what the boot tests run."""
        result = build(self.client, self.context("image"), nocache=False)
        self.kept += result.made()
        return result.image_id

    def full_and_rebuilds(self) -> dict[str, Any]:
        """One full (no-cache) build, then the worker-change and the bake-change rebuilds and the
        worker change as a new commit; the images they made are removed before returning (a
        no-cache build leaves a whole new layer chain)."""
        args = build_args()
        original = self.context("original")
        full = build(self.client, original, nocache=True, buildargs=args)
        made = full.made()
        worker_ctx = self.tmp / "worker-change"
        if worker_ctx.exists():
            shutil.rmtree(worker_ctx)
        shutil.copytree(original, worker_ctx)
        with open(worker_ctx / WORKER_CHANGE_FILE, "a", encoding="utf-8") as handle:
            handle.write(f"# bakery bench: a one-line worker change ({time.time_ns()})\n")
        worker = build(self.client, worker_ctx, nocache=False, buildargs=args)
        made += worker.made()
        bake = build(self.client, self.context("bake-change", bake_changed(self.spec)), nocache=False, buildargs=args)
        made += bake.made()
        with open(worker_ctx / WORKER_CHANGE_FILE, "a", encoding="utf-8") as handle:
            handle.write("# bakery bench: committed\n")
        commit_args = {"BAKERY_REVISION": f"{args['BAKERY_REVISION']}-bench", "BAKERY_CREATED": "2099-01-01T00:00:00Z"}
        committed = build(self.client, worker_ctx, nocache=False, buildargs=commit_args)
        made += committed.made()
        remove_images(self.client, made)
        return {"full": full.seconds, "worker": worker.seconds, "bake": bake.seconds, "commit": committed.seconds,
                "full_steps": full.summary("COPY worker/"),
                "worker_steps": worker.summary("COPY worker/"),
                "bake_steps": bake.summary("ENV BACKEND="),
                "commit_steps": committed.summary("LABEL ")}

    def close(self) -> None:
        remove_images(self.client, self.kept)
        self.kept.clear()
        shutil.rmtree(self.tmp, ignore_errors=True)


def sizes(client: docker.DockerClient, image_id: str, base_ref: str) -> dict[str, float]:
    """MB (10^6 bytes) the worker adds to `base_ref`, and what /opt/bakery's parts weigh inside
    (`du -sb`: apparent sizes, as image sizes count them; `pyc`: the byte-compiled files in it)."""
    base = client.images.get(base_ref).attrs["Size"]
    image = client.images.get(image_id).attrs["Size"]
    script = ("for p in /opt/bakery /opt/bakery/venv /opt/bakery/python /opt/bakery/worker /opt/bakery/tools; do "
              "[ -e $p ] && echo \"$p $(du -sb $p | cut -f1)\"; done; "
              "echo \"pyc $(find /opt/bakery -name '*.pyc' -exec du -cb {} + | awk '/total$/{s+=$1} END{print s+0}')\"")
    out = client.containers.run(image_id, ["-c", script], entrypoint="/bin/sh", remove=True).decode()
    parts = {}
    for line in out.splitlines():
        name, _, size = line.rpartition(" ")
        if size.isdigit():
            parts[name] = int(size) / 1e6
    return {"base": base / 1e6, "image": image / 1e6, "added": (image - base) / 1e6, **parts}


def render_seconds(out_dir: Path) -> float:
    """Seconds for `python build.py --all --render-only --out DIR` as a fresh process."""
    started = time.monotonic()
    subprocess.run([sys.executable, str(REPO_ROOT / "build.py"), "--all", "--render-only", "--out", str(out_dir)],
                   cwd=REPO_ROOT, check=True, capture_output=True)
    return time.monotonic() - started


def gate_seconds(image_id: str, engine: str, say: Callable[[str], None]) -> float:
    """Seconds for the gate on a present image; raises if it does not pass (a bench of a broken image
    would measure nothing useful)."""
    result = run_gate(image_id, engine, variant="local", quiet=True)
    if not result.passed:
        say(result.output[-3000:])
        raise RuntimeError(f"the gate failed on {image_id[:19]}: {', '.join(result.failed)}")
    return result.seconds
