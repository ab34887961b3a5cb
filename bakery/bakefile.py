"""A `docker buildx bake` file for the chosen engines: the same definitions on any BuildKit builder.

`build.py --bake-file DIR/docker-bake.json` lays out, next to the file:

    DIR/docker-bake.json            JSON bake file: one target per engine and platform, one group per engine
    DIR/contexts/<engine>-<arch>/   each target's complete build context (Dockerfile, worker/, context/,
                                    wheels/ for that platform: nothing inside the build touches the network)

Paths in the file are relative to DIR, so the directory can be copied or archived as a whole and
built elsewhere: run bake from DIR (`cd DIR && docker buildx bake --load vllm`). A target is one
platform (`vllm-amd64`, `vllm-arm64`), because each platform's context carries that platform's
wheels and its worker-python stage starts FROM a Debian image of that architecture; the engine's
group (`vllm`) builds all of them, and `default` builds every engine.

Each target carries one **candidate** tag, never a release tag: release tags come only from the
verification gate (bakery.release / build.py). Cache settings are not in the file (they depend on
the builder: the default `docker` driver exports none); `python -m bakery.bakefile ci` writes an
override file with them, and with named contexts for the locally made images a docker-container,
remote or kubernetes builder cannot see (see README, "Bake file"). With `--pin-bases` it also pins
each registry base to the digest it resolves to now (a named context `docker-image://ref@sha256:...`,
so the build cannot drift from it) and labels the image with that digest
(`org.opencontainers.image.base.digest`), which `bakery.release verify` records.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform as host
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bakery import __version__
from bakery.errors import BakeryError, BuildError, InputError
from bakery.render import RenderOptions, render, write_context
from bakery.spec import EngineSpec
from bakery.tags import arch, candidate_tag, check_repository

LOCAL_PREFIX = "bakery-local/"  # images made on the build machine by bakery.bases
BASE_DIGEST_LABEL = "org.opencontainers.image.base.digest"  # OCI's annotation for the base's digest
BASE_NAME_LABEL = "org.opencontainers.image.base.name"
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# BuildKit's reproducible-builds build arg: the image config's `created` and its history times. Without
# it each export stamps the time it ran, so two buildx runs of one cached build differ in their config.
EPOCH_ARG = "SOURCE_DATE_EPOCH"
_FROM = re.compile(r"^FROM\s+(?:--platform=\S+\s+)?(?P<ref>\S+)(?:\s+AS\s+(?P<alias>\S+))?\s*$",
                   re.MULTILINE | re.IGNORECASE)
_MACHINES = {"x86_64": "linux/amd64", "amd64": "linux/amd64", "aarch64": "linux/arm64", "arm64": "linux/arm64"}


def host_platform() -> str:
    """The Docker platform of this machine: the only one its local bases exist for."""
    machine = host.machine().lower()
    if machine not in _MACHINES:
        raise InputError(f"this machine's architecture {machine!r} has no local bases (amd64 and arm64 do)")
    return _MACHINES[machine]


@dataclass(frozen=True)
class TargetPlan:
    """One bake target: an engine on one platform, from one base."""

    spec: EngineSpec
    platform: str
    variant: str  # "local" or "production"
    base_image: str

    @property
    def name(self) -> str:
        return f"{self.spec.name}-{arch(self.platform)}"

    @property
    def context(self) -> str:
        return f"contexts/{self.name}"


def plan_targets(specs: list[EngineSpec], *, local: bool) -> list[TargetPlan]:
    """The targets a bake file holds: every production platform, or this machine's for local bases."""
    plans = []
    for spec in specs:
        if local:
            if not spec.base.local:
                raise InputError(f"{spec.spec_path}: base.local is not set, so --local has no base to use")
            from bakery.base_catalogue import BASES  # names only: no Docker needed to write the file

            plans.append(TargetPlan(spec, host_platform(), "local", BASES[spec.base.local].ref))
        else:
            plans.extend(TargetPlan(spec, plat, "production", spec.base.image) for plat in spec.base.platforms)
    return plans


def bake_labels(plan: TargetPlan) -> dict[str, str]:
    """Labels the bake file adds on top of the Dockerfile's own (which name engine, version, base)."""
    return {"ai.bakery.variant": plan.variant, "ai.bakery.target": plan.name, "ai.bakery.bakery-version": __version__}


def bake_args(build_args: dict[str, str]) -> dict[str, str]:
    """The bake file's build args: bakery's own, plus SOURCE_DATE_EPOCH at the `created` label's time.

    BuildKit takes SOURCE_DATE_EPOCH for the config's `created` and history times (since 0.11), so
    the release job's second buildx run (the push with provenance, every layer from cache) yields the
    config the gate verified, and the config's time is the label's. A `created` value that is not an
    ISO time (tests pass "now") gets no epoch; the provenance push refuses such a bake file.
    """
    args = dict(build_args)
    created = args.get("BAKERY_CREATED", "")
    if EPOCH_ARG not in args:
        try:
            when = dt.datetime.fromisoformat(created.replace("Z", "+00:00"))
        except ValueError:
            return args
        if when.tzinfo is not None:
            args[EPOCH_ARG] = str(int(when.timestamp()))
    return args


def bake_definition(plans: list[TargetPlan], *, repository: str, build_args: dict[str, str]) -> dict[str, Any]:
    """The bake file's content (JSON-able): groups and targets, paths relative to the file's directory."""
    repository = check_repository(repository)
    targets: dict[str, Any] = {}
    groups: dict[str, Any] = {}
    for plan in plans:
        targets[plan.name] = {
            "context": plan.context,
            "dockerfile": "Dockerfile",
            "args": bake_args(build_args),
            "tags": [candidate_tag(plan.spec, plan.platform, repository=repository, variant=plan.variant,
                                   revision=build_args.get("BAKERY_REVISION", "unknown"))],
            "labels": bake_labels(plan),
            "platforms": [plan.platform],
        }
        groups.setdefault(plan.spec.name, {"targets": []})["targets"].append(plan.name)
    clash = sorted(set(groups) & set(targets))
    if clash:
        raise InputError(f"engine name(s) {', '.join(clash)} clash with a target name; rename the engine")
    return {"group": {"default": {"targets": sorted(groups)}, **dict(sorted(groups.items()))}, "target": targets}


def write_bake_file(specs: list[EngineSpec], path: Path, *, local: bool = False, repository: str = "bakery",
                    wheelhouse: Callable[[str], Path] | None = None,
                    build_args: dict[str, str] | None = None, quiet: bool = False,
                    templates_dir: Path | None = None) -> Path:
    """Write the bake file at `path` (must end in .json) and every target's context next to it;
    `templates_dir` is searched before the repository's templates/."""
    path = Path(path)
    if path.suffix != ".json":
        raise InputError(f"--bake-file {path}: the bake file is JSON; give it a .json name (e.g. docker-bake.json)")
    if path.exists() and path.is_dir():
        raise InputError(f"--bake-file {path}: is a directory; give a file path such as {path}/docker-bake.json")
    check_repository(repository)
    plans = plan_targets(specs, local=local)
    if wheelhouse is None:
        from bakery.wheelhouse import wheelhouse as platform_wheelhouse

        wheelhouse = platform_wheelhouse
    if build_args is None:
        from bakery.builder import build_args as current_build_args

        build_args = current_build_args()
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    for plan in plans:
        rendered = render(plan.spec, RenderOptions(base_image=plan.base_image, templates_dir=templates_dir))
        write_context(rendered, directory / plan.context, wheelhouse(plan.platform))
    definition = bake_definition(plans, repository=repository, build_args=build_args)
    path.write_text(json.dumps(definition, indent=2) + "\n", encoding="utf-8")
    if not quiet:
        names = ", ".join(plan.name for plan in plans)
        print(f"wrote {path} (targets: {names}); build with: cd {directory} && docker buildx bake --load "
              f"{' '.join(sorted({p.spec.name for p in plans}))}", file=sys.stderr)
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


def engine_of(target_name: str) -> str:
    """The engine of a target named `<engine>-<arch>`."""
    return target_name.rpartition("-")[0]


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


def registry_digest(ref: str) -> str:
    """The digest `ref` resolves to in its registry now (the index digest for a multi-platform image),
    asked through the Docker engine's distribution API."""
    import docker.errors

    from bakery.docker_engine import client

    try:
        digest = client().images.get_registry_data(ref).id
    except docker.errors.APIError as exc:
        raise BuildError(f"cannot resolve the digest of {ref}: {exc.explanation or exc}") from None
    if not DIGEST.match(str(digest)):
        raise BuildError(f"the registry answered {digest!r} as the digest of {ref}: not a sha256 digest")
    return str(digest)


def base_pins(bake: dict[str, Any], bake_dir: Path, name: str,
              resolve: Callable[[str], str] = registry_digest) -> tuple[dict[str, str], dict[str, str]]:
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
    registry_digest); each registry base becomes a named context pinned to its digest and the image
    gets the BASE_DIGEST_LABEL of its base (a base the spec already pins keeps its own digest).
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
    from bakery.docker_engine import client

    for ref in refs:
        repo, _, tag = f"{registry.rstrip('/')}/{ref}".rpartition(":")
        image = client().images.get(ref)
        image.tag(repo, tag)
        for event in client().api.push(repo, tag=tag, stream=True, decode=True):
            if "error" in event:
                raise BakeryError(f"push of {repo}:{tag} failed: {event['error'].strip()}")
        progress(f"pushed {ref} as {repo}:{tag}")


def main(argv: list[str] | None = None) -> int:
    """`python -m bakery.bakefile ci ...`: prepare a written bake file for a non-docker builder."""
    parser = argparse.ArgumentParser(prog="python -m bakery.bakefile", description=__doc__.splitlines()[0])
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
    try:
        bake = load_bake_file(args.bake_file)
        bake_dir = args.bake_file.parent
        if args.registry:
            refs = list(dict.fromkeys(ref for name in args.target
                                      for ref in local_images(bake_dir, target_of(bake, name, args.bake_file))))
            push_local_images(refs, args.registry, lambda m: print(f"[bakery.bakefile] {m}", file=sys.stderr))
        override = ci_override(bake, bake_dir, args.target, registry=args.registry, cache=args.cache,
                               scope=args.scope, pin_bases=registry_digest if args.pin_bases else None)
        args.out.write_text(json.dumps(override, indent=2) + "\n", encoding="utf-8")
    except BakeryError as exc:
        print(f"bakery.bakefile: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())

