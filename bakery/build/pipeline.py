"""BuildPlan → base → render → build → verify → tag / push, for each planned engine, with progress output."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from bakery.bases import make as bases
from bakery.build.builder import build_image
from bakery.build.publish import push_verified, tag_verified
from bakery.build.verify import describe_split, run_gate
from bakery.docker.engine import require_image
from bakery.recipe.plan import BuildPlan, host_platform
from bakery.recipe.render import render


def _say(quiet: bool, engine: str) -> Callable[[str], None]:
    def progress(message: str) -> None:
        if not quiet:
            print(f"[{engine}] {message}", file=sys.stderr, flush=True)
    return progress


def prepare_base(plan: BuildPlan, progress: Callable[[str], None]) -> str:
    """Make sure the plan's base is on this engine (making a local base when it is one); return its ref."""
    base = plan.base
    if base.local:
        return bases.ensure_base(base.local, progress=progress)
    hint = ("load or build it first (docker load / docker build)" if base.variant == "custom" else
            "this machine reaches no registry; use --local to build on the base made here, or --base-image REF")
    require_image(base.ref, hint)
    return base.ref


def run_engine(plan: BuildPlan, *, quiet: bool = False) -> dict[str, Any]:
    """Build and verify one planned engine; returns its summary (never raises for a failed gate)."""
    spec = plan.spec
    progress = _say(quiet, spec.name)
    started = time.monotonic()
    base = prepare_base(plan, progress)
    bases.ensure_base("debian", progress=progress)  # the bundled-Python stage builds from it
    rendered = render(spec, plan.render)
    if plan.model is not None:
        model = plan.model
        progress(f"baking model {model.name} ({len(model.hashes)} files, {model.size} bytes, digest "
                 f"sha256:{model.digest[:12]}) into its own layer at {model.image_path}")
    progress(f"building on {base} ({plan.variant} base)")
    # This engine builds one image, for this machine's platform (its base exists for that one).
    built = build_image(rendered, progress, host_platform(), buildargs=plan.facts.build_args())
    progress(f"built {built.image_id[:19]} ({built.steps} steps, {built.cached_steps} from cache)")
    summary: dict[str, Any] = {"engine": spec.name, "image_id": built.image_id, "base": base,
                               "variant": plan.variant, "tags": [], "pushed": [], "failed_checks": []}
    if plan.model is not None:
        summary["model"] = plan.model.labels()
    if not plan.verify:
        progress("--no-verify: not verified, so not tagged")
        summary.update(ok=True, verified=False)
    else:
        progress("verifying (tests/image)")
        gate = run_gate(built.image_id, spec.name, variant=plan.variant, quiet=quiet, progress=progress,
                        images_dir=plan.images_dir, model=plan.base.model,
                        baked_digest=f"sha256:{plan.model.digest}" if plan.model is not None else None)
        summary.update(verified=gate.passed, checks_run=gate.ran, failed_checks=gate.failed,
                       checks_not_run=gate.not_run, checks_not_run_reasons=gate.not_run_reasons,
                       gate_seconds=round(gate.seconds, 1), time_to_ready=gate.time_to_ready)
        for split in gate.time_to_ready:
            progress(describe_split(split))
        for reason, count in gate.not_run_reasons.items():
            progress(f"{count} check{'s' if count > 1 else ''} not run: {reason}")
        if not gate.passed:
            progress(f"GATE FAILED: {', '.join(gate.failed) or 'no check ran'}; image left untagged")
            if not quiet:
                sys.stderr.write(gate.output[-4000:])
            summary["ok"] = False
        else:
            tags = list(plan.tags)
            tag_verified(built.image_id, tags, verified=True)
            summary["tags"] = tags
            progress(f"verified ({gate.ran} checks); tagged {', '.join(tags)}")
            if plan.push:
                pushed = push_verified(built.image_id, tags, verified=True, progress=progress)
                summary["pushed"] = [str(item) for item in pushed]
            summary["ok"] = True
    summary["seconds"] = round(time.monotonic() - started, 1)
    return summary


def run_pipeline(plans: list[BuildPlan], *, quiet: bool = False) -> dict[str, Any]:
    """Run every planned engine; one engine's failure does not stop the others."""
    results = [run_engine(plan, quiet=quiet) for plan in plans]
    for item in results:
        state = "ok" if item["ok"] else "FAILED"
        detail = ", ".join(item["tags"][:1]) if item["ok"] else ", ".join(item["failed_checks"])
        print(f"{item['engine']}: {state} {detail}", file=sys.stderr)
        for pushed in item["pushed"]:  # what was published is the image the gate verified, by digest
            print(f"{item['engine']}: pushed {pushed} (verified image {item['image_id']})", file=sys.stderr)
    return {"ok": all(r["ok"] for r in results), "engines": results}
