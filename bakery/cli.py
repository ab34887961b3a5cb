"""Argument parsing and exit codes for build.py (0 ok, 1 build/verification failed, 2 bad input)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bakery import __version__
from bakery.errors import BakeryError, InputError
from bakery.recipe.build_facts import BuildFacts
from bakery.recipe.plan import BuildOptions, baked_model, choose_base, every_line, make_plan
from bakery.recipe.render import check_templates_dir, render
from bakery.recipe.tags import check_repository
from bakery.spec.engine_spec import EngineSpec, available_engines, load_engine
from bakery.spec.image_ref import ReferenceRefused, check_reference

EPILOG = """\
examples:
  python build.py --list                             engines and their base images
  python build.py --engine llama --show              what the llama image bakes, for template authors
  python build.py --all --show --json                the same as JSON, with each CUDA line and its driver floor
  python build.py --engine vllm --cuda 12.9 --local  build vLLM's CUDA 12.9 line (driver >= 525) on the local base
  python build.py --engine llama --render-only       print the rendered Dockerfile
  python build.py --all --render-only --out out/     write out/<engine>/Dockerfile for every engine
  python build.py --engine llama --local             build on this machine's llama.cpp base and verify
  python build.py --engine vllm --base-image REF     build on another base image and verify
  python build.py --all --local --json               build + verify every engine, JSON summary
  python build.py --images-dir ../team/images --templates-dir ../team/templates --engine tgi --local
                                                     an engine whose spec and template live elsewhere
  python build.py --engine llama --push --repository ghcr.io/acme
                                                     verify, then push the verified digest
  python build.py --engine llama --local --model ~/models/SmolLM2-135M-Instruct.Q4_1.gguf
                                                     bake a model into its own layer, below the worker's

exit codes: 0 success, 1 a build or a verification check failed, 2 bad input
"""


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with one line (no usage dump) on bad options."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"build.py: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def make_parser() -> argparse.ArgumentParser:
    """The build.py argument parser."""
    p = _Parser(
        prog="build.py",
        allow_abbrev=False,
        description="Render, build and verify serverless-ready images for OpenAI-compatible engines.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"bakery {__version__}")
    pick = p.add_argument_group("which engines")
    pick.add_argument("--engine", action="append", metavar="NAME", default=[],
                      help="an engine from images/<NAME>.yaml (repeatable), e.g. --engine llama")
    pick.add_argument("--all", action="store_true", help="every engine in images/ (or in --images-dir)")
    pick.add_argument("--images-dir", type=Path, metavar="DIR",
                      help="read <engine>.yaml specs from DIR instead of the repository's images/")
    pick.add_argument("--templates-dir", type=Path, metavar="DIR",
                      help="look for templates in DIR first, then in the repository's templates/ "
                           "(so a template there may extend base.Dockerfile.j2)")
    what = p.add_argument_group("what to do (default: render, build, verify, tag)")
    what.add_argument("--list", action="store_true", help="list engines with their base images")
    what.add_argument("--show", action="store_true",
                      help="print the resolved configuration: each variable, its baked value, its source, "
                           "and what a launch template must still set")
    what.add_argument("--render-only", action="store_true",
                      help="print the rendered Dockerfile (or write one per engine with --out); no Docker")
    what.add_argument("--out", type=Path, metavar="DIR",
                      help="with --render-only: write DIR/<engine>/Dockerfile instead of printing")
    what.add_argument("--bake-file", type=Path, metavar="PATH",
                      help="write a `docker buildx bake` file (JSON) for the chosen engines and exit")
    what.add_argument("--no-verify", action="store_true",
                      help="build only; the image gets no release tag (an unverified image is never tagged)")
    what.add_argument("--push", action="store_true", help="after the gate passes, push the verified image")
    base = p.add_argument_group("where the image comes from")
    base.add_argument("--local", action="store_true",
                      help="build on the base made on this machine (spec base.local: the real llama.cpp, "
                           "or the vLLM/SGLang stand-ins); needs no registry")
    base.add_argument("--base-image", metavar="REF", help="build on this base image instead of the spec's")
    base.add_argument("--base-model", metavar="MODEL",
                      help="with --base-image: the model that base serves (the value of the engine's model "
                           "variable); the gate's checks that need a model run only with it, else are reported "
                           "as not run")
    base.add_argument("--model", type=Path, metavar="PATH",
                      help="bake this model (a file or directory; a Hugging Face cache snapshot, "
                           "models--org--name/snapshots/<rev>/, works too) into the image, in its own layer right "
                           "after FROM, so a worker or bake change never rebuilds or re-pushes it; the engine's "
                           "model variable defaults to it (a launch template may still set another), every tag "
                           "carries -model-<name>-<digest12>, and the gate checks the engine serves exactly it. "
                           "Its format must be the spec's engine.model_format (gguf or safetensors); files that "
                           "look like credentials are refused")
    base.add_argument("--cuda", metavar="VERSION",
                      help="the CUDA line to build or show (spec base.cuda_lines, e.g. 12.9); default: the spec's "
                           "default line; a bake file holds every line unless this names one")
    base.add_argument("--repository", metavar="PREFIX", default="bakery",
                      help="image repository prefix for tags, e.g. ghcr.io/acme (default: bakery)")
    out = p.add_argument_group("output")
    out.add_argument("--quiet", action="store_true", help="print only errors and the final result")
    out.add_argument("--json", action="store_true", help="print a machine-readable JSON summary on stdout")
    return p


def _engines(args: argparse.Namespace) -> list[EngineSpec]:
    names = available_engines(args.images_dir) if args.all else args.engine
    if not names:
        where = f" in {args.images_dir}" if args.images_dir else ""
        raise InputError(f"no engine chosen: pass --engine NAME (one of "
                         f"{', '.join(available_engines(args.images_dir)) or 'none'}{where}) or --all")
    seen: list[str] = []
    for name in names:
        if name not in seen:
            seen.append(name)
    return [load_engine(name, args.images_dir) for name in seen]


def cmd_list(images_dir: Path | None = None) -> int:
    """Print each engine with its production and local base."""
    for name in available_engines(images_dir):
        spec = load_engine(name, images_dir)
        print(f"{spec.name:8} {spec.base.image:45} local: {spec.base.local or '-':15} {spec.description}")
        for line in spec.base.cuda_variants[1:]:
            print(f"{'':8} {line.image:45} CUDA {line.cuda} line (driver >= {line.min_driver})")
    return 0


def cmd_render(specs: list[EngineSpec], options: BuildOptions, *, out: Path | None, quiet: bool) -> int:
    """--render-only: print the Dockerfiles, or write out/<engine>/Dockerfile."""
    for spec in specs:
        model = baked_model(spec, options)
        rendered = render(spec, choose_base(spec, options).render_options(options.templates_dir, model))
        if out:
            target = out / spec.name / "Dockerfile"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(rendered.dockerfile, encoding="utf-8")
            if not quiet:
                print(f"wrote {target}", file=sys.stderr)
        else:
            if len(specs) > 1:
                print(f"# ===== {spec.name} =====")
            sys.stdout.write(rendered.dockerfile)
    return 0


def build_options(args: argparse.Namespace) -> BuildOptions:
    """The typed options of build.py's flags: the only place argparse's namespace is read past parsing."""
    return BuildOptions(local=args.local, base_image=args.base_image, base_model=args.base_model,
                        repository=args.repository,
                        templates_dir=args.templates_dir, images_dir=args.images_dir,
                        verify=not args.no_verify, push=args.push, model=args.model, cuda=args.cuda)


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse option values that could never be used as given, before anything else runs."""
    if args.out and not args.render_only:
        raise InputError("--out goes with --render-only")
    if args.images_dir is not None and not args.images_dir.is_dir():
        raise InputError(f"--images-dir {args.images_dir}: not a directory (it holds the <engine>.yaml specs)")
    if args.templates_dir is not None:
        check_templates_dir(args.templates_dir)
    if args.base_image is not None:
        try:
            check_reference(args.base_image)
        except ReferenceRefused as exc:
            raise InputError(f"--base-image {args.base_image!r}: not a valid image reference: {exc}") from None
    if args.base_model is not None:
        if args.base_image is None:
            raise InputError("--base-model names the model of --base-image's base: give --base-image REF too "
                             "(a local base's model is its spec's base.local_model)")
        if not args.base_model.strip() or not args.base_model.isprintable():
            raise InputError(f"--base-model {args.base_model!r}: give the model's path or id, printable and not blank")
    if args.repository != "bakery":
        check_repository(args.repository)
    if args.model is not None:
        _check_model_arguments(args)


def _check_model_arguments(args: argparse.Namespace) -> None:
    """--model bakes one model from this machine into one engine's image built here: refuse what can't honour it."""
    if args.bake_file:
        raise InputError("--model with --bake-file: a bake file's targets build elsewhere (remote BuildKit), where "
                         "this machine's model is not; build the model image here without --bake-file")
    if args.all or len(set(args.engine)) > 1:
        raise InputError("--model bakes one model into one engine's image (each engine serves its own format): "
                         "give one --engine")
    if args.base_model is not None:
        raise InputError("--model with --base-model: the image serves the baked model, not the base's; drop "
                         "--base-model")


def main(argv: list[str] | None = None) -> int:
    """Run build.py; returns the process exit code."""
    args = make_parser().parse_args(argv)
    try:
        check_arguments(args)
        if args.list:
            return cmd_list(args.images_dir)
        specs = _engines(args)
        options = build_options(args)
        for spec in specs:
            choose_base(spec, options)  # every path (render, bake file, build) names a bad base.local the same way
        if args.show:
            from bakery.recipe.show import show, show_json

            if args.json:
                print(json.dumps([show_json(spec, options) for spec in specs], indent=2))
                return 0
            for spec in specs:
                print(show(spec, baked_model(spec, options), options.cuda))
            return 0
        if args.render_only:
            return cmd_render(specs, options, out=args.out, quiet=args.quiet)
        facts = BuildFacts.of_checkout()  # once: every plan's labels and tags name the same commit
        if args.bake_file:
            from bakery.release.bakefile import write_bake_file

            # One target per CUDA line and platform (only --cuda's line when it names one).
            write_bake_file([plan for spec in specs for plan in every_line(spec, options, facts)], args.bake_file)
            return 0
        plans = [make_plan(spec, options, facts) for spec in specs]
        from bakery.build.pipeline import run_pipeline

        summary = run_pipeline(plans, quiet=args.quiet)
        if args.json:
            print(json.dumps(summary, indent=2))
        return 0 if all(item["ok"] for item in summary["engines"]) else 1
    except BakeryError as exc:
        print(f"build.py: {exc}", file=sys.stderr)
        if args.json:
            print(json.dumps({"ok": False, "error": str(exc), "exit_code": exc.exit_code}))
        return exc.exit_code
    except KeyboardInterrupt:
        print("build.py: interrupted", file=sys.stderr)
        return 130
