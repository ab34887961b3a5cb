"""spec → render → build → verify → tag / push, for each chosen engine, with progress output."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from bakery import bases
from bakery.builder import build_image, git_revision
from bakery.docker_engine import require_image
from bakery.publish import push_verified, tag_verified
from bakery.render import DEFAULT_RUNTIME_IMAGE, RenderOptions, render
from bakery.spec import EngineSpec
from bakery.tags import release_tags
from bakery.verify import run_gate


def _say(quiet: bool, engine: str):
    def progress(message: str) -> None:
        if not quiet:
            print(f"[{engine}] {message}", file=sys.stderr, flush=True)
    return progress


def resolve_base(spec: EngineSpec, args: argparse.Namespace, progress) -> tuple[str, str]:
    """Return (base image ref, variant) for this build, making a local base when asked."""
    if args.base_image:
        require_image(args.base_image, "load or build it first (docker load / docker build)")
        return args.base_image, "custom"
    if args.local:
        ref = bases.ensure_base(spec.base.local, progress=progress)
        return ref, "local"
    require_image(spec.base.image, "this machine reaches no registry; use --local to build on the base "
                                   "made here, or --base-image REF")
    return spec.base.image, "production"


def run_engine(spec: EngineSpec, args: argparse.Namespace) -> dict[str, Any]:
    """Build and verify one engine; returns its summary (never raises for a failed gate)."""
    progress = _say(args.quiet, spec.name)
    started = time.monotonic()
    base, variant = resolve_base(spec, args, progress)
    bases.ensure_base("debian", progress=progress)  # the bundled-Python stage builds from it
    rendered = render(spec, RenderOptions(base_image=base, runtime_image=DEFAULT_RUNTIME_IMAGE,
                                          templates_dir=getattr(args, "templates_dir", None)))
    progress(f"building on {base} ({variant} base)")
    built = build_image(rendered, progress)
    progress(f"built {built.image_id[:19]} ({built.steps} steps, {built.cached_steps} from cache)")
    summary: dict[str, Any] = {"engine": spec.name, "image_id": built.image_id, "base": base,
                               "variant": variant, "tags": [], "pushed": [], "failed_checks": []}
    if args.no_verify:
        progress("--no-verify: not verified, so not tagged")
        summary.update(ok=True, verified=False)
    else:
        progress("verifying (tests/image)")
        gate = run_gate(built.image_id, spec.name, variant=variant, quiet=args.quiet, progress=progress,
                        images_dir=getattr(args, "images_dir", None))
        summary.update(verified=gate.passed, checks_run=gate.ran, failed_checks=gate.failed,
                       gate_seconds=round(gate.seconds, 1))
        if not gate.passed:
            progress(f"GATE FAILED: {', '.join(gate.failed) or 'no check ran'}; image left untagged")
            if not args.quiet:
                sys.stderr.write(gate.output[-4000:])
            summary["ok"] = False
        else:
            tags = release_tags(spec, repository=args.repository, variant=variant, revision=git_revision())
            tag_verified(built.image_id, tags, verified=True)
            summary["tags"] = tags
            progress(f"verified ({gate.ran} checks); tagged {', '.join(tags)}")
            if args.push:
                summary["pushed"] = push_verified(built.image_id, tags, verified=True, progress=progress)
            summary["ok"] = True
    summary["seconds"] = round(time.monotonic() - started, 1)
    return summary


def run_pipeline(specs: list[EngineSpec], args: argparse.Namespace) -> dict[str, Any]:
    """Run every chosen engine; one engine's failure does not stop the others."""
    results = [run_engine(spec, args) for spec in specs]
    for item in results:
        state = "ok" if item["ok"] else "FAILED"
        detail = ", ".join(item["tags"][:1]) if item["ok"] else ", ".join(item["failed_checks"])
        print(f"{item['engine']}: {state} {detail}", file=sys.stderr)
        for pushed in item["pushed"]:  # what was published is the image the gate verified, by digest
            print(f"{item['engine']}: pushed {pushed} (verified image {item['image_id']})", file=sys.stderr)
    return {"ok": all(r["ok"] for r in results), "engines": results}
