"""A `docker buildx bake` file for the chosen engines: the same definitions on any BuildKit builder.

`build.py --bake-file DIR/docker-bake.json` lays out, next to the file:

    DIR/docker-bake.json            JSON bake file: one target per engine, CUDA line and platform, one
                                    group per engine
    DIR/contexts/<target>/          each target's complete build context (Dockerfile, worker/, context/,
                                    wheels/ for that platform: nothing inside the build touches the network)

Paths in the file are relative to DIR, so the directory can be copied or archived as a whole and
built elsewhere: run bake from DIR (`cd DIR && docker buildx bake --load vllm`). A target is one
platform (`vllm-amd64`, `vllm-arm64`), because each platform's context carries that platform's
wheels and its worker-python stage starts FROM a Debian image of that architecture; the engine's
group (`vllm`) builds all of them, and `default` builds every engine. An engine with CUDA lines (spec
`base.cuda_lines`) has one target per line and platform: the default line's `<engine>-<arch>`, every
other line's `<engine>-cu<major><minor>-<arch>` (`vllm-cu129-amd64`), each on its line's base and baking
its line's driver floor.

The targets are the platforms of the build plans (bakery.recipe.plan) build.py made from the specs and
its flags; `read_target` makes a target's plan again from the file (bakery.release verifies with it).
Each target carries one **candidate** tag, never a release tag: release tags come only from the
verification gate (bakery.release / build.py). Cache settings are not in the file (they depend on
the builder: the default `docker` driver exports none); `python -m bakery.release.bakefile ci` writes an
override file with them, and with named contexts for the locally made images a docker-container,
remote or kubernetes builder cannot see (see docs/bake-file.md). With `--pin-bases` it also pins
each registry base to the digest it resolves to now (a named context `docker-image://ref@sha256:...`,
so the build cannot drift from it) and labels the image with that digest
(`org.opencontainers.image.base.digest`), which `bakery.release verify` records.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bakery import __version__
from bakery.errors import InputError, cli_main
from bakery.host.relay import relay_program
from bakery.recipe.build_facts import BuildFacts
from bakery.recipe.plan import BuildOptions, BuildPlan, make_plan
from bakery.recipe.render import render, write_context
from bakery.recipe.tags import arch, candidate_prefix
from bakery.spec.cuda import VERSION_LABEL, CudaVariant
from bakery.spec.dockerfile_values import CREATED_ARG, REVISION_ARG
from bakery.spec.engine_spec import EngineSpec, load_engine
from bakery.spec.image_ref import SHA256_DIGEST as DIGEST

LOCAL_PREFIX = "bakery-local/"  # images made on the build machine by bakery.bases
BASE_DIGEST_LABEL = "org.opencontainers.image.base.digest"  # OCI's annotation for the base's digest
BASE_NAME_LABEL = "org.opencontainers.image.base.name"
VARIANT_LABEL = "ai.bakery.variant"
# BuildKit's reproducible-builds build arg: the image config's `created` and its history times. Without
# it each export stamps the time it ran, so two buildx runs of one cached build differ in their config.
EPOCH_ARG = "SOURCE_DATE_EPOCH"
_FROM = re.compile(r"^FROM\s+(?:--platform=\S+\s+)?(?P<ref>\S+)(?:\s+AS\s+(?P<alias>\S+))?\s*$",
                   re.MULTILINE | re.IGNORECASE)


def target_name(spec: EngineSpec, platform: str, cuda: CudaVariant | None = None) -> str:
    """A bake target's name: `<engine>-<arch>` (an engine without CUDA lines, or its default line, as its
    tags), or `<engine>-cu<major><minor>-<arch>` for another CUDA line (engine_of reads it back; bake allows
    no '.' in a name)."""
    line = f"-{cuda.target_part}" if cuda is not None and not cuda.default else ""
    return f"{spec.name}{line}-{arch(platform)}"


@dataclass(frozen=True)
class TargetPlan:
    """One bake target: one platform of a build plan."""

    plan: BuildPlan
    platform: str

    @property
    def name(self) -> str:
        return target_name(self.plan.spec, self.platform, self.plan.cuda)

    @property
    def context(self) -> str:
        return f"contexts/{self.name}"

    @property
    def tag(self) -> str:
        """Its one tag: a candidate, never a release tag."""
        return self.plan.candidate_tag(self.platform)


def plan_targets(plans: list[BuildPlan]) -> list[TargetPlan]:
    """The targets a bake file holds: one per platform of each plan (a production base: the spec's
    platforms; a local one: this machine's)."""
    for plan in plans:
        if plan.variant == "custom":
            raise InputError("--base-image does not go with --bake-file: a bake target builds on the spec's "
                             "base.image, or with --local on base.local")
    return [TargetPlan(plan, platform) for plan in plans for platform in plan.platforms]


def bake_labels(target: TargetPlan) -> dict[str, str]:
    """Labels the bake file adds on top of the Dockerfile's own (which name engine, version, base)."""
    labels = {VARIANT_LABEL: target.plan.variant, "ai.bakery.target": target.name,
              "ai.bakery.bakery-version": __version__}
    if target.plan.cuda is not None:  # read_target reads the line back from it (the Dockerfile has it too)
        labels[VERSION_LABEL] = target.plan.cuda.cuda
    return labels


def bake_args(build_args: dict[str, str]) -> dict[str, str]:
    """The bake file's build args: bakery's own, plus SOURCE_DATE_EPOCH at the `created` label's time.

    BuildKit takes SOURCE_DATE_EPOCH for the config's `created` and history times (since 0.11), so
    the release job's second buildx run (the push with provenance, every layer from cache) yields the
    config the gate verified, and the config's time is the label's. A `created` value that is not an
    ISO time (tests pass "now") gets no epoch; the provenance push refuses such a bake file.
    """
    args = dict(build_args)
    created = args.get(CREATED_ARG, "")
    if EPOCH_ARG not in args:
        try:
            when = dt.datetime.fromisoformat(created.replace("Z", "+00:00"))
        except ValueError:
            return args
        if when.tzinfo is not None:
            args[EPOCH_ARG] = str(int(when.timestamp()))
    return args


def bake_definition(targets: list[TargetPlan]) -> dict[str, Any]:
    """The bake file's content (JSON-able): groups and targets, paths relative to the file's directory."""
    definitions: dict[str, Any] = {}
    groups: dict[str, Any] = {}
    for target in targets:
        definitions[target.name] = {
            "context": target.context,
            "dockerfile": "Dockerfile",
            "args": bake_args(target.plan.facts.build_args()),
            "tags": [target.tag],
            "labels": bake_labels(target),
            "platforms": [target.platform],
        }
        groups.setdefault(target.plan.spec.name, {"targets": []})["targets"].append(target.name)
    clash = sorted(set(groups) & set(definitions))
    if clash:
        raise InputError(f"engine name(s) {', '.join(clash)} clash with a target name; rename the engine")
    return {"group": {"default": {"targets": sorted(groups)}, **dict(sorted(groups.items()))},
            "target": definitions}


def write_bake_file(plans: list[BuildPlan], path: Path, *, wheelhouse: Callable[[str], Path] | None = None,
                    quiet: bool = False) -> Path:
    """Write the bake file of `plans` at `path` (must end in .json) and every target's context next to it."""
    path = Path(path)
    if path.suffix != ".json":
        raise InputError(f"--bake-file {path}: the bake file is JSON; give it a .json name (e.g. docker-bake.json)")
    if path.exists() and path.is_dir():
        raise InputError(f"--bake-file {path}: is a directory; give a file path such as {path}/docker-bake.json")
    targets = plan_targets(plans)
    if wheelhouse is None:
        from bakery.host.wheelhouse import wheelhouse as platform_wheelhouse

        wheelhouse = platform_wheelhouse
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    for target in targets:
        rendered = render(target.plan.spec, target.plan.render)
        write_context(rendered, directory / target.context, wheelhouse(target.platform),
                      relay_program(target.platform))
    definition = bake_definition(targets)
    path.write_text(json.dumps(definition, indent=2) + "\n", encoding="utf-8")
    if not quiet:
        names = ", ".join(target.name for target in targets)
        print(f"wrote {path} (targets: {names}); build with: cd {directory} && docker buildx bake --load "
              f"{' '.join(sorted({t.plan.spec.name for t in targets}))}", file=sys.stderr)
    return path


# ---- reading a bake file back (tests, CI helpers) -------------------------------------------------


def load_bake_file(path: Path) -> dict[str, Any]:
    """Read a bake file written by write_bake_file; InputError when it is not one."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: cannot read the bake file: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("target"), dict):
        raise InputError(f"{path}: not a bake file (no \"target\" mapping)")
    return data


def target_of(bake: dict[str, Any], name: str, path: Path | str = "the bake file") -> dict[str, Any]:
    """One target's definition; InputError naming the targets there are."""
    targets = bake["target"]
    if name not in targets:
        raise InputError(f"{path}: no target {name!r} (targets: {', '.join(sorted(targets))})")
    return targets[name]


def engine_of(name: str, cuda: str | None = None) -> str:
    """The engine of a target named `<engine>-<arch>` or, for CUDA line `cuda`, `<engine>-cu<NNN>-<arch>`
    (target_name's forms)."""
    engine = name.rpartition("-")[0]
    part = "-cu" + cuda.replace(".", "") if cuda else ""
    return engine.removesuffix(part) if part and engine.endswith(part) else engine


def read_target(bake_file: Path, name: str) -> TargetPlan:
    """The plan a bake file's target was written from, made again from the values the file holds
    (engine, platform, variant, revision, created, the tag's repository prefix); InputError when the
    target's tag is not the one that plan gives, i.e. the file is not bakery's for this checkout."""
    definition = target_of(load_bake_file(bake_file), name, bake_file)
    cuda = definition.get("labels", {}).get(VERSION_LABEL)
    spec = load_engine(engine_of(name, cuda))
    args = definition.get("args", {})
    variant = definition.get("labels", {}).get(VARIANT_LABEL, "production")
    candidate = definition["tags"][0]
    options = BuildOptions(local=variant == "local", repository=candidate_prefix(candidate, spec), cuda=cuda)
    facts = BuildFacts(revision=args.get(REVISION_ARG, "unknown"), created=args.get(CREATED_ARG, "unknown"))
    target = TargetPlan(make_plan(spec, options, facts), definition["platforms"][0])
    if target.name != name or target.tag != candidate:
        raise InputError(f"{bake_file}: target {name!r} is tagged {candidate}, but its plan gives {target.name} "
                         f"tagged {target.tag}: write the bake file again with this checkout")
    return target


def local_images(bake_dir: Path, target: dict[str, Any]) -> list[str]:
    """The locally made images (bakery-local/...) a target's Dockerfile starts FROM, in order."""
    dockerfile = Path(bake_dir) / target["context"] / target.get("dockerfile", "Dockerfile")
    refs = re.findall(r"^FROM\s+(\S+)", dockerfile.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return list(dict.fromkeys(ref for ref in refs if ref.startswith(LOCAL_PREFIX)))


def registry_bases(bake_dir: Path, target: dict[str, Any]) -> tuple[list[str], str | None]:
    """The registry images (not local, not an earlier stage) a target's Dockerfile starts FROM, and the
    image's base (its last FROM) when that is one of them."""
    dockerfile = Path(bake_dir) / target["context"] / target.get("dockerfile", "Dockerfile")
    stages: set[str] = set()
    refs: list[str] = []
    last: str | None = None
    for match in _FROM.finditer(dockerfile.read_text(encoding="utf-8")):
        ref = match["ref"]
        external = ref.lower() not in stages and not ref.startswith(LOCAL_PREFIX) and ref != "scratch"
        if external and ref not in refs:
            refs.append(ref)
        last = ref if external else None
        if match["alias"]:
            stages.add(match["alias"].lower())
    return refs, last


def pinned_digest(ref: str) -> str | None:
    """The digest a reference already pins (`name[:tag]@sha256:...`), else None."""
    _, at, digest = ref.rpartition("@")
    return digest if at and DIGEST.match(digest) else None


def base_pins(bake: dict[str, Any], bake_dir: Path, name: str,
              resolve: Callable[[str], str]) -> tuple[dict[str, str], dict[str, str]]:
    """Named contexts that pin a target's registry bases to digests, and the image's base-digest label."""
    contexts: dict[str, str] = {}
    digests: dict[str, str] = {}
    refs, base = registry_bases(bake_dir, target_of(bake, name))
    for ref in refs:
        digests[ref] = pinned_digest(ref) or resolve(ref)
        if not pinned_digest(ref):
            contexts[ref] = f"docker-image://{ref}@{digests[ref]}"
    return contexts, ({BASE_DIGEST_LABEL: digests[base]} if base else {})


def ci_override(bake: dict[str, Any], bake_dir: Path, targets: list[str], *, registry: str | None,
                cache: str | None, scope: str = "bakery",
                pin_bases: Callable[[str], str] | None = None) -> dict[str, Any]:
    """A second bake file that `-f docker-bake.json -f override.json` merges over the first.

    `registry`: where the locally made images were pushed (e.g. localhost:5000); each one becomes a
    named context `docker-image://<registry>/<ref>`, so a docker-container, remote or kubernetes
    builder finds them. `cache`: "gha" for GitHub Actions' cache (scope per target), or a registry
    ref prefix for `type=registry` cache, or None. `pin_bases`: a resolver (ref -> digest, e.g.
    bakery.docker.engine.registry_digest); each registry base becomes a named context pinned to its
    digest and the image gets the BASE_DIGEST_LABEL of its base (a base the spec already pins keeps
    its own digest).
    """
    override: dict[str, Any] = {"target": {}}
    for name in targets:
        target = target_of(bake, name)
        entry: dict[str, Any] = {}
        if registry:
            entry["contexts"] = {ref: f"docker-image://{registry.rstrip('/')}/{ref}"
                                 for ref in local_images(bake_dir, target)}
        if pin_bases:
            contexts, labels = base_pins(bake, bake_dir, name, pin_bases)
            if contexts:
                entry["contexts"] = {**entry.get("contexts", {}), **contexts}
            if labels:
                entry["labels"] = labels
        if cache == "gha":
            entry["cache-from"] = [f"type=gha,scope={scope}-{name}"]
            entry["cache-to"] = [f"type=gha,scope={scope}-{name},mode=max,ignore-error=true"]
        elif cache:
            entry["cache-from"] = [f"type=registry,ref={cache}:{name}"]
            entry["cache-to"] = [f"type=registry,ref={cache}:{name},mode=max,ignore-error=true"]
        override["target"][name] = entry
    return override


def push_local_images(refs: list[str], registry: str, progress: Callable[[str], None]) -> None:
    """Copy locally made images to `registry` (same names under it), so BuildKit can pull them."""
    from bakery.docker.engine import tag_image
    from bakery.docker.push import push

    for ref in refs:
        copy = f"{registry.rstrip('/')}/{ref}"
        tag_image(ref, copy)
        push(copy)
        progress(f"pushed {ref} as {copy}")


@cli_main("bakery.release.bakefile")
def main(argv: list[str] | None = None) -> int:
    """`python -m bakery.release.bakefile ci ...`: prepare a written bake file for a non-docker builder."""
    parser = argparse.ArgumentParser(prog="python -m bakery.release.bakefile", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ci = sub.add_parser("ci", help="push the local images a target needs and write an override bake file")
    ci.add_argument("--bake-file", type=Path, required=True)
    ci.add_argument("--target", action="append", required=True, help="a target of the bake file (repeatable)")
    ci.add_argument("--registry", help="registry the builder can pull from, e.g. localhost:5000")
    ci.add_argument("--cache", help="'gha', or a registry repository for type=registry cache")
    ci.add_argument("--scope", default="bakery", help="cache scope prefix (default: bakery)")
    ci.add_argument("--pin-bases", action="store_true",
                    help="pin each registry base to the digest it resolves to now, and label the image with it")
    ci.add_argument("--out", type=Path, required=True, help="where to write the override (JSON)")
    args = parser.parse_args(argv)
    bake = load_bake_file(args.bake_file)
    bake_dir = args.bake_file.parent
    if args.registry:
        refs = list(dict.fromkeys(ref for name in args.target
                                  for ref in local_images(bake_dir, target_of(bake, name, args.bake_file))))
        push_local_images(refs, args.registry, lambda m: print(f"[bakery.release.bakefile] {m}", file=sys.stderr))
    resolve: Callable[[str], str] | None = None
    if args.pin_bases:
        from bakery.docker.engine import registry_digest

        resolve = registry_digest
    override = ci_override(bake, bake_dir, args.target, registry=args.registry, cache=args.cache,
                           scope=args.scope, pin_bases=resolve)
    args.out.write_text(json.dumps(override, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

