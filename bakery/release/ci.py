"""Publish exactly what was verified: gate a bake-built image, push its digest, assemble the manifest.

The release path, one platform per job, then one manifest job per release (.github/workflows/images.yml):

    docker buildx bake --load <engine>-<arch>           build the target as the bake file defines it
    python -m bakery.release verify --push ...          gate THAT image (by id = config digest); only on a
                                                        pass: tag it <most specific tag>-<arch>, push, and
                                                        write a verified record {image id, pushed digest}
        --provenance --override ci.json                 push with buildx and the builder's provenance
                                                        instead, and record only once the pushed index
                                                        is read back to hold that image (provenance.py)
    python -m bakery.release sbom --record R --out F    the recorded image's SBOM, as the gate checked it
    python -m bakery.release assemble RECORDS...        check every pushed digest's config IS the verified
                                                        image id, then `docker buildx imagetools create`
                                                        the release tags from those digests only
    python -m bakery.release sign --record R --key K    sign exactly the record's verified digest with your
                                                        own cosign key (bakery.release.sign; the workflows
                                                        sign keylessly with the same cosign calls)

Where buildx does not exist (this project's own test machines), `assemble --tool manifest` makes the
same index from the same digests with the Docker CLI's `docker manifest create/push`, and
`--rehearsal` lets a local build (tags `...-local`, never `latest`) go through verify --push and
assemble, so the release path is rehearsed against a real registry before GitHub runs it.

A record exists only for an image whose gate passed, and the manifest is made from records only, so
a digest nobody verified can never reach a release tag. `python -m bakery.release matrix` prints the
GitHub Actions matrix (one job per bake target) from the same plan the bake file is written from.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bakery.docker import cli as docker_cli
from bakery.errors import BuildError, InputError, VerificationError, cli_main
from bakery.recipe.plan import BuildOptions, choose_base, platforms_for
from bakery.recipe.tags import check_repository, has_commit, release_tags, repository_prefix
from bakery.release.bakefile import BASE_DIGEST_LABEL, BASE_NAME_LABEL, pinned_digest, read_target, target_name
from bakery.release.provenance import is_attestation, push_with_provenance, read_back
from bakery.spec.cuda import CudaVariant
from bakery.spec.engine_spec import available_engines, load_engine
from bakery.spec.image_ref import SHA256_DIGEST as DIGEST

# GitHub-hosted runners per platform: the gate runs the image, so each platform builds natively.
RUNNERS = {"linux/amd64": "ubuntu-24.04", "linux/arm64": "ubuntu-24.04-arm"}
RECORD_VERSION = 1
GATE_OUTPUT_TAIL = 8000  # characters of a failed gate's output shown before the error (its failures)


@dataclass
class VerifiedRecord:
    """What one platform job proves: this image id passed the gate, and (release) this digest was pushed."""

    engine: str
    target: str
    platform: str
    variant: str
    repository: str  # <prefix>/<engine>
    revision: str
    image_id: str  # sha256 of the image config: what the gate ran
    checks_run: int
    tags: list[str] = field(default_factory=list)
    pushed_ref: str = ""  # the per-platform tag pushed
    digest: str = ""  # the pushed manifest's digest (sha256:...)
    version: int = RECORD_VERSION
    base_image: str = ""  # the base the image was built on (its org.opencontainers.image.base.name)
    base_digest: str = ""  # the digest that base resolved to at build time (org.opencontainers.image.base.digest)
    # A push with provenance (bakery.release.provenance): the index buildx pushed (`digest` is the platform
    # manifest inside it) and the attestation manifest in it that carries the builder's provenance.
    index_digest: str = ""
    attestation_digest: str = ""
    cuda: str = ""  # the CUDA line the image is of (spec base.cuda_lines); "": an engine without lines

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.target}.json"
        path.write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def read(cls, path: Path) -> VerifiedRecord:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            return cls(**data)
        except (OSError, json.JSONDecodeError, TypeError) as exc:
            raise InputError(f"{path}: not a verified record: {exc}") from None


# ---- the matrix -----------------------------------------------------------------------------------


def matrix(engines: list[str], *, local: bool) -> dict[str, Any]:
    """GitHub's `strategy.matrix` for the image workflow: one entry per bake target."""
    include = []
    for spec in [load_engine(name) for name in engines]:
        for line in spec.base.cuda_variants or (None,):  # one target per CUDA line and platform
            base = choose_base(spec, BuildOptions(local=local, cuda=line.cuda if line else None))
            include += [{"engine": spec.name, "target": target_name(spec, platform, line), "platform": platform,
                         "runner": RUNNERS[platform], **({"cuda": line.cuda} if line else {})}
                        for platform in platforms_for(spec, base)]
    return {"include": include}


# ---- verify (and push) one bake-built image -------------------------------------------------------


def _say(message: str) -> None:
    print(f"[bakery.release] {message}", file=sys.stderr, flush=True)


def built_image_id(candidate: str, metadata: dict[str, Any] | None, target: str) -> str:
    """The id of the image bake loaded: its candidate tag's image, cross-checked with bake's metadata."""
    from bakery.docker import engine as docker_engine

    image_id = docker_engine.image_id(candidate)
    if image_id is None:
        raise BuildError(f"{candidate} is not on the Docker engine: build the target with "
                         f"`docker buildx bake --load {target}` first")
    if metadata is not None:
        config = (metadata.get(target) or {}).get("containerimage.config.digest")
        if not config:
            _say(f"bake's metadata has no containerimage.config.digest for {target}: using {candidate}'s image")
        elif config != image_id:
            raise BuildError(f"{candidate} is {image_id[:19]}, but bake built {config[:19]}: not the same image")
    return image_id


def built_base(image_id: str, target: str, *, required: bool) -> tuple[str, str]:
    """The base name and digest an image records in its labels; a release (required) must have both,
    and a base the spec pinned by digest must be that digest."""
    from bakery.docker import engine as docker_engine

    labels = docker_engine.image_labels(image_id)
    name, digest = labels.get(BASE_NAME_LABEL, ""), labels.get(BASE_DIGEST_LABEL, "")
    if digest and not DIGEST.match(digest):
        raise BuildError(f"{target}: {image_id[:19]} labels {BASE_DIGEST_LABEL}={digest!r}: not a sha256 digest")
    pinned = pinned_digest(name)
    if pinned and digest and pinned != digest:
        raise BuildError(f"{target}: {image_id[:19]} names the base {name} but records {digest}: not that image")
    digest = digest or pinned or ""
    if required and not digest:
        raise InputError(f"{target}: {image_id[:19]} records no base digest ({BASE_DIGEST_LABEL}): a release must "
                         f"say what it was built on; write the override with `python -m bakery.release.bakefile ci "
                         f"--pin-bases` (or pin the spec's base.image by @sha256:)")
    return name, digest


def verify_target(bake_file: Path, target: str, *, records: Path, push: bool = False,
                  metadata_file: Path | None = None, gate: Callable[..., Any] | None = None,
                  rehearsal: bool = False, provenance_overrides: list[Path] | None = None) -> VerifiedRecord:
    """Gate the image a bake target built; on a pass tag it (and push it), and write its record.

    Raises VerificationError when the gate fails: then nothing is tagged, pushed or recorded.
    Only production builds are pushed, unless `rehearsal` (a local build, whose tags say `-local`).
    `provenance_overrides` (the override bake files the image was built with): push with buildx and
    the builder's provenance instead of `docker push`, and record only once the pushed index is read
    back and its platform manifest's config is the verified image id (bakery.release.provenance).
    """
    from bakery.build.publish import push_verified, tag_verified

    if gate is None:
        from bakery.build.verify import run_gate as gate
    planned = read_target(bake_file, target)  # the plan the target was written from
    plan, platform, candidate = planned.plan, planned.platform, planned.tag
    engine, variant, repository, revision = plan.spec.name, plan.variant, plan.image_repository, plan.facts.revision
    metadata = json.loads(Path(metadata_file).read_text()) if metadata_file else None
    image_id = built_image_id(candidate, metadata, target)
    if push and variant != "production" and not (rehearsal and variant == "local"):
        raise InputError(f"{target} is built on a {variant} base: only production builds are pushed for release "
                         "(--rehearsal pushes a local build, tagged -local)")
    # A local base made here has no registry digest to record; a production release must have one.
    base_image, base_digest = built_base(image_id, target, required=push and variant == "production")
    _say(f"{target}: verifying {image_id[:19]} ({candidate}), gate level {variant}")
    result = gate(image_id, engine, variant=variant, quiet=True, progress=_say)
    if not result.passed:
        sys.stderr.write(f"{target}: the gate's output, its end:\n{result.output[-GATE_OUTPUT_TAIL:]}\n")
        raise VerificationError(f"{target}: the gate failed ({', '.join(result.failed) or 'no check ran'}): "
                                f"{image_id[:19]} is not tagged, pushed or recorded")
    tags = [plan.platform_tag(platform)] if push else list(plan.tags)
    tag_verified(image_id, tags, verified=True)
    record = VerifiedRecord(engine=engine, target=target, platform=platform, variant=variant,
                            repository=repository, revision=revision, image_id=image_id,
                            checks_run=result.ran, tags=tags, base_image=base_image, base_digest=base_digest,
                            cuda=plan.cuda.cuda if plan.cuda else "")
    if push and provenance_overrides is not None:
        pushed_image = push_with_provenance(bake_file, provenance_overrides, target, repository=repository,
                                            platform=platform, image_id=image_id, tag=tags[0], progress=_say)
        record.pushed_ref, record.digest = tags[0], pushed_image.manifest_digest
        record.index_digest, record.attestation_digest = pushed_image.index_digest, pushed_image.attestation_digest
        _say(f"{target}: pushed verified {image_id[:19]} with provenance as {repository}@{record.index_digest}")
    elif push:
        pushed = push_verified(image_id, tags, verified=True, progress=_say)[0]
        record.pushed_ref, record.digest = pushed.ref, pushed.digest
        _say(f"{target}: pushed verified {image_id[:19]} as {repository}@{pushed.digest}")
    path = record.write(records)
    _say(f"{target}: passed {result.ran} checks; record {path}")
    return record


# ---- the multi-arch manifest, from verified records only ------------------------------------------


INSPECT = {"imagetools": docker_cli.imagetools_inspect_raw, "manifest": docker_cli.manifest_inspect}


@dataclass
class ManifestPlan:
    """One engine's release: the tags to create and the verified digests they list."""

    engine: str
    tags: list[str]
    sources: list[str]  # <repository>@<digest>, one per platform
    pinned: str | None = None  # the commit tag: written once, never moved
    cuda: str = ""  # the CUDA line this release is of ("": an engine without lines)

    def holds(self, record: VerifiedRecord) -> bool:
        """Whether `record` is one of this release's images (same engine, same CUDA line)."""
        line = record_line(record)
        return (record.engine, line.cuda if line else "") == (self.engine, self.cuda)

    def command(self) -> list[str]:
        """The `docker buildx imagetools create` call that makes every tag at once (the GitHub path)."""
        return docker_cli.imagetools_create(self.tags, self.sources)

    def manifest_commands(self) -> list[list[str]]:
        """The same index with the Docker CLI: per tag, `docker manifest create` then `push --purge`
        (the CLI keeps a created list locally until it is pushed; --purge drops it afterwards)."""
        return [command for tag in self.tags
                for command in (docker_cli.manifest_create(tag, self.sources), docker_cli.manifest_push(tag))]

    def commands(self, tool: str) -> list[list[str]]:
        """What `tool` (imagetools or manifest) runs to create this plan's tags."""
        return [self.command()] if tool == "imagetools" else self.manifest_commands()


def plan_manifests(records: list[VerifiedRecord], *, allow_partial: bool = False,
                   variant: str = "production") -> list[ManifestPlan]:
    """Group records per engine and check them: production, pushed, one per platform, one revision.

    `variant="local"` is the rehearsal: local records only, and their tags carry `-local`.
    """
    if not records:
        raise InputError("no verified records: nothing passed the gate, so nothing is published")
    by_engine: dict[tuple[str, str], list[VerifiedRecord]] = {}
    lines: dict[tuple[str, str], CudaVariant | None] = {}
    for record in records:
        if record.version != RECORD_VERSION:
            raise InputError(f"{record.target}: record version {record.version}, expected {RECORD_VERSION}")
        if record.variant != variant:
            expected = "only production images are released" if variant == "production" else \
                f"this release takes {variant} builds only"
            raise InputError(f"{record.target}: built on a {record.variant} base; {expected}")
        if not record.digest.startswith("sha256:") or not record.image_id.startswith("sha256:"):
            raise InputError(f"{record.target}: the record has no pushed digest; it was not pushed")
        line = record_line(record)
        key = (record.engine, line.cuda if line else "")
        lines[key] = line
        by_engine.setdefault(key, []).append(record)
    plans = []
    for (engine, cuda_version), group in sorted(by_engine.items()):
        spec = load_engine(engine)
        line = lines[(engine, cuda_version)]
        platforms = [r.platform for r in group]
        if len(set(platforms)) != len(platforms):
            raise InputError(f"{engine}: two records for one platform ({', '.join(sorted(platforms))})")
        missing = sorted(set(spec.base.platforms) - set(platforms))
        if missing and not allow_partial:
            raise InputError(f"{engine}: no verified image for {', '.join(missing)}: a release lists every platform "
                             f"of images/{engine}.yaml (or pass --allow-partial)")
        for attr in ("repository", "revision"):
            values = {getattr(r, attr) for r in group}
            if len(values) != 1:
                raise InputError(f"{engine}: records disagree on {attr}: {', '.join(sorted(values))}")
        repository, revision = group[0].repository, group[0].revision
        check_repository(repository)
        tags = release_tags(spec, repository=repository_prefix(repository, spec), variant=variant, revision=revision,
                            cuda=line)
        ordered = sorted(group, key=lambda r: r.platform)
        pinned = tags[0] if has_commit(revision) else None
        # A record pushed with provenance lists its index, so the release index carries each platform's
        # attestation manifest too (imagetools create merges the entries of index sources).
        plans.append(ManifestPlan(engine, tags, [f"{repository}@{r.index_digest or r.digest}" for r in ordered],
                                  pinned, cuda_version))
    return plans


def record_line(record: VerifiedRecord) -> CudaVariant | None:
    """The CUDA line a record's image is of, as the spec has it now (a record naming none: the default
    line, which is what an image of an engine's default target is); InputError for a line the spec lost."""
    try:
        return load_engine(record.engine).base.cuda_variant(record.cuda or None)
    except ValueError as exc:
        raise InputError(f"{record.target}: {exc}") from None


def check_sources(records: list[VerifiedRecord], inspect: Callable[[str], dict[str, Any] | None]) -> None:
    """Each pushed digest must be a single-platform image whose config digest IS the verified image id,
    and the per-platform tag the gate's job pushed must still hold it (a moved tag means someone
    published over the verified image after the gate ran)."""
    for record in records:
        ref = f"{record.repository}@{record.digest}"
        if record.index_digest:
            pushed = read_back(record.repository, record.index_digest, platform=record.platform,
                               image_id=record.image_id, inspect=inspect)
            if (pushed.manifest_digest, pushed.attestation_digest) != (record.digest, record.attestation_digest):
                raise VerificationError(f"{record.repository}@{record.index_digest} lists {pushed.manifest_digest} and "
                                        f"{pushed.attestation_digest}, not the recorded {record.digest} and "
                                        f"{record.attestation_digest}; refusing to publish it")
        manifest = inspect(ref)
        if manifest is None:
            raise VerificationError(f"{ref} is not in the registry")
        config = (manifest.get("config") or {}).get("digest")
        if config != record.image_id:
            raise VerificationError(f"{ref} holds config {config}, not the verified image {record.image_id}: "
                                    "refusing to publish it")
        if record.pushed_ref:
            # A provenance push tagged its index (a carbon copy); a plain push tagged the manifest.
            expected = inspect(f"{record.repository}@{record.index_digest}") if record.index_digest else manifest
            at_tag = inspect(record.pushed_ref)
            if at_tag != expected:
                held = record.index_digest or record.digest
                raise VerificationError(f"{record.pushed_ref} no longer holds the verified {held} (it holds "
                                        f"{_describe(at_tag)}): moved after the gate ran; refusing to publish")


def _holds(found: dict[str, Any] | None, group: list[VerifiedRecord]) -> bool:
    """True when `found` (a tag's raw index or manifest) is exactly the verified images of `group`.

    An index must list exactly the verified digests; a plain manifest (imagetools copies a single
    source as is when it does not prefer an index) must hold the one verified image id as its config.
    """
    if found is None:
        return False
    if "manifests" in found:
        attested = {d.get("digest") for d in found["manifests"] if is_attestation(d)}
        return index_entries(found) == {r.digest: r.platform for r in group} and \
            all(r.attestation_digest in attested for r in group if r.attestation_digest)
    return len(group) == 1 and (found.get("config") or {}).get("digest") == group[0].image_id


def index_entries(index: dict[str, Any]) -> dict[str, str]:
    """{digest: "os/arch"} of the images a manifest list or OCI index lists: what both tools must agree on.

    A CPU variant (arm64's `v8`) is left out: the records name platforms as `linux/arm64`. Attestation
    manifests (platform unknown/unknown, bakery.release.provenance) are not images and are left out too.
    """
    return {str(m.get("digest")): "/".join(str((m.get("platform") or {}).get(k)) for k in ("os", "architecture"))
            for m in index.get("manifests", []) if not is_attestation(m)}


def _describe(found: dict[str, Any] | None) -> str:
    if found is None:
        return "nothing"
    if "manifests" in found:
        return ", ".join(sorted(str(m.get("digest")) for m in found["manifests"]))
    return f"config {(found.get('config') or {}).get('digest')}"


def assemble(records: list[VerifiedRecord], *, dry_run: bool = False, allow_partial: bool = False,
             inspect: Callable[[str], dict[str, Any] | None] | None = None,
             run: Callable[[list[str]], None] | None = None, tool: str = "imagetools",
             variant: str = "production") -> list[ManifestPlan]:
    """Create each engine's release tags as a manifest list of its verified digests, and check the result.

    `tool` is `imagetools` (buildx, the GitHub path) or `manifest` (the Docker CLI, where buildx is
    missing); both list exactly the records' digests. `inspect` reads a ref (default: the tool's own).
    """
    if tool not in INSPECT:
        raise InputError(f"--tool {tool}: use one of {', '.join(INSPECT)}")
    plans = plan_manifests(records, allow_partial=allow_partial, variant=variant)
    if tool == "manifest" and any(r.index_digest for r in records):
        raise InputError("--tool manifest: `docker manifest create` takes no index as a source, and these records "
                         "were pushed with provenance as indexes; assemble them with --tool imagetools")
    if tool == "manifest" and inspect is None:
        docker_cli.forget_local_lists([tag for plan in plans for tag in plan.tags])
    inspect = inspect or INSPECT[tool]
    check_sources(records, inspect)
    for plan in plans:
        group = [r for r in records if plan.holds(r)]
        existing = inspect(plan.pinned) if plan.pinned else None
        if existing is not None and not _holds(existing, group):
            raise VerificationError(f"{plan.pinned} already exists with other images: a commit tag is never moved")
        for command in plan.commands(tool):
            _say(f"{plan.engine}: " + " ".join(command))
        if dry_run:
            continue
        for command in plan.commands(tool):
            (run or docker_cli.run)(command)
        for tag in plan.tags:
            created = inspect(tag)
            if not _holds(created, group):
                raise VerificationError(f"{tag} holds {_describe(created)}, not the verified "
                                        f"{', '.join(sorted(r.digest for r in group))}")
        _say(f"{plan.engine}: published {', '.join(plan.tags)} from {len(plan.sources)} verified digest(s)")
    return plans


# ---- the SBOM published with a release ------------------------------------------------------------


def write_sbom(out: Path, *, record: Path | None = None, image: str | None = None) -> dict[str, Any]:
    """Write the SBOM of the image a verified record names (or of `image`) to `out`, as the image holds
    it; refuses (VerificationError) an image without /opt/bakery/sbom.cdx.json or with an invalid one."""
    from bakery.release.sbom import export_sbom

    if record is not None:
        image = VerifiedRecord.read(record).image_id
    if not image:
        raise InputError("give --record FILE or --image REF: the verified image whose SBOM to write")
    written = export_sbom(image, out)
    label = image[:19] if image.startswith("sha256:") else image
    _say(f"{label}: wrote its SBOM {out} (CycloneDX {written['specVersion']}, {written['components']} components, "
         f"{written['sha256']})")
    return written


# ---- command line ---------------------------------------------------------------------------------


@cli_main("bakery.release")
def main(argv: list[str] | None = None) -> int:
    """`python -m bakery.release matrix|verify|assemble|sbom|sign`; exit 0 ok, 1 failed gate/build, 2 bad input."""
    parser = argparse.ArgumentParser(prog="python -m bakery.release", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    mx = sub.add_parser("matrix", help="print the GitHub Actions matrix (JSON) of bake targets")
    mx.add_argument("--engine", action="append", default=[], help="an engine (repeatable; default: all)")
    mx.add_argument("--local", action="store_true", help="the targets of a --local bake file")
    vf = sub.add_parser("verify", help="gate the image a bake target built; tag, push and record it on a pass")
    vf.add_argument("--bake-file", type=Path, required=True)
    vf.add_argument("--target", required=True)
    vf.add_argument("--metadata-file", type=Path, help="bake's --metadata-file, to cross-check the image id")
    vf.add_argument("--push", action="store_true", help="push the verified image (production targets)")
    vf.add_argument("--records", type=Path, required=True, help="directory for the verified record")
    vf.add_argument("--rehearsal", action="store_true",
                    help="with --push: also push a local build (its tags carry -local), to rehearse a release")
    vf.add_argument("--provenance", action="store_true",
                    help="with --push: push with `docker buildx bake` and the builder's provenance attestation "
                         "(needs buildx), read the pushed index back and record it only if its config is the "
                         "verified image id")
    vf.add_argument("--override", action="append", type=Path, default=[],
                    help="with --provenance: an override bake file the image was built with (repeatable, in order)")
    sb = sub.add_parser("sbom", help="write a verified image's SBOM (/opt/bakery/sbom.cdx.json) to a file; "
                                     "refuses an image without one or with one that is not CycloneDX JSON")
    which = sb.add_mutually_exclusive_group(required=True)
    which.add_argument("--record", type=Path, help="a verified record: the image it names (by id)")
    which.add_argument("--image", help="an image id or tag on the local Docker engine")
    sb.add_argument("--out", type=Path, required=True, help="where to write the SBOM (JSON)")
    asm = sub.add_parser("assemble", help="create release tags from verified records only")
    asm.add_argument("records", nargs="+", type=Path, help="record files or directories of them")
    asm.add_argument("--dry-run", action="store_true", help="check and print the commands, create nothing")
    asm.add_argument("--allow-partial", action="store_true", help="release even if a platform has no record")
    asm.add_argument("--tool", choices=sorted(INSPECT), default="imagetools",
                     help="imagetools: docker buildx imagetools (default, GitHub); manifest: docker manifest "
                          "create/push, where buildx is missing")
    asm.add_argument("--rehearsal", action="store_true",
                     help="assemble local records (tags ...-local) to rehearse a release on this machine")
    sg = sub.add_parser("sign", help="sign the verified digest of a record (or of build.py --push --json) with "
                                     "cosign, after checking the registry still holds the verified image there")
    source = sg.add_mutually_exclusive_group(required=True)
    source.add_argument("--record", type=Path, help="a verified record (bakery.release verify --push)")
    source.add_argument("--summary", type=Path, help="build.py --push --json's summary: what it pushed")
    sg.add_argument("--key", help="a cosign private key (its password in $COSIGN_PASSWORD); default: keyless")
    sg.add_argument("--sbom", type=Path, help="also attest this CycloneDX SBOM (python -m bakery.release sbom)")
    sg.add_argument("--offline", action="store_true",
                    help="upload nothing to Sigstore's transparency log (--tlog-upload=false)")
    sg.add_argument("--tool", choices=sorted(INSPECT), default="imagetools", help="how to read the registry")
    args = parser.parse_args(argv)
    if args.command == "sign":
        from bakery.release.sign import sign_verified, summary_records

        records = [VerifiedRecord.read(args.record)] if args.record else summary_records(args.summary)
        if args.sbom and len(records) != 1:
            raise InputError("--sbom goes with one signed image; this summary pushed several: sign each record")
        for ref in sign_verified(records, key=args.key, offline=args.offline, inspect=INSPECT[args.tool],
                                 sboms={records[0].target: args.sbom} if args.sbom else {}):
            print(ref)
    elif args.command == "matrix":
        print(json.dumps(matrix(args.engine or available_engines(), local=args.local)))
    elif args.command == "verify":
        if (args.provenance or args.override) and not (args.push and args.provenance):
            raise InputError("--provenance is a way to --push, and --override goes with --provenance: "
                             "use --push --provenance [--override FILE ...]")
        verify_target(args.bake_file, args.target, records=args.records, push=args.push,
                      metadata_file=args.metadata_file, rehearsal=args.rehearsal,
                      provenance_overrides=args.override if args.provenance else None)
    elif args.command == "sbom":
        write_sbom(args.out, record=args.record, image=args.image)
    else:
        files = [f for p in args.records for f in (sorted(p.glob("*.json")) if p.is_dir() else [p])]
        assemble([VerifiedRecord.read(f) for f in files], dry_run=args.dry_run, allow_partial=args.allow_partial,
                 tool=args.tool, variant="local" if args.rehearsal else "production")
    return 0

