"""Push the verified image with the builder's provenance, and prove the registry holds that very image.

`docker buildx bake --load` + `docker push` (the plain release path) drops every attestation: the
Docker engine's image store has nowhere to keep them. So a release job, once the gate passed on the
loaded image, runs the same bake target a second time with buildx itself (`bake_push_command`):
the same bake files, so the same builder and layer cache, asking for a provenance attestation
(`attest=type=provenance,mode=max`) and pushing by digest only (no tag is touched yet). Every layer
comes from that builder's cache, and SOURCE_DATE_EPOCH (bakery.release.bakefile.bake_args) pins the
config's timestamps, so the pushed config is the one the gate ran. That is then proved, not assumed:

    read the pushed index back     BuildKit stores attestations as extra manifests in the image index:
                                   each has platform unknown/unknown and the annotations
                                   vnd.docker.reference.type=attestation-manifest and
                                   vnd.docker.reference.digest=<the platform manifest it describes>
    pick the platform manifest     the one runnable manifest of the target's platform (never the
                                   attestation manifest, whatever the order)
    compare its config digest      with the verified image id (= the gate's config digest): refuse
                                   (VerificationError, exit 1, one line) unless they are equal
    check the attestation          an attestation manifest for that platform manifest, with an in-toto
                                   layer whose predicate is SLSA provenance
    only then tag it               the per-platform tag, as a carbon copy of that index
                                   (`imagetools create` with one index source copies it as is)

and only then does bakery.release write the verified record. Where buildx is missing (this
project's test machines) this path is checked by unit tests and actionlint only: see docs/release.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bakery.docker import cli as docker_cli
from bakery.docker.cli import imagetools_inspect_raw as inspect_raw  # the default reader (tests replace it)
from bakery.docker.cli import run as run_command  # the default runner: from the bake file's directory
from bakery.errors import BuildError, InputError, VerificationError
from bakery.release.bakefile import EPOCH_ARG, load_bake_file, target_of
from bakery.spec.image_ref import SHA256_DIGEST as DIGEST

# BuildKit's attestation storage (docs/attestations/attestation-storage.md in moby/buildkit).
REFERENCE_TYPE = "vnd.docker.reference.type"
REFERENCE_DIGEST = "vnd.docker.reference.digest"
ATTESTATION_MANIFEST = "attestation-manifest"
PREDICATE_TYPE = "in-toto.io/predicate-type"
IN_TOTO = "application/vnd.in-toto+json"
# SLSA provenance as BuildKit writes it: v0.2 by default, v1 with `version=v1`.
PROVENANCE_PREDICATES = ("https://slsa.dev/provenance/v0.2", "https://slsa.dev/provenance/v1")
# What the release asks the builder for, and how it pushes: by digest only, tags come after the check.
ATTEST = "type=provenance,mode=max"
PUSH_OUTPUT = "type=image,push-by-digest=true,name-canonical=true,push=true"

Inspect = Callable[[str], "dict[str, Any] | None"]
Run = Callable[[list[str], Path], None]


@dataclass(frozen=True)
class PushedImage:
    """What the registry holds after the provenance push, as read back and checked."""

    repository: str
    index_digest: str  # the index buildx pushed: the platform manifest + its attestation manifest
    manifest_digest: str  # the platform manifest: its config is the verified image id
    config_digest: str
    attestation_digest: str
    predicate_types: tuple[str, ...]


# ---- reading a pushed index -------------------------------------------------------------------------


def is_attestation(descriptor: dict[str, Any]) -> bool:
    """True for an index entry that is an attestation manifest (BuildKit's annotation says so)."""
    return (descriptor.get("annotations") or {}).get(REFERENCE_TYPE) == ATTESTATION_MANIFEST


def descriptor_platform(descriptor: dict[str, Any]) -> str:
    """"os/arch" of an index entry (a CPU variant is left out, as records name platforms linux/arm64)."""
    platform = descriptor.get("platform") or {}
    return f"{platform.get('os')}/{platform.get('architecture')}"


def platform_manifest(index: dict[str, Any], platform: str, where: str) -> dict[str, Any]:
    """The one runnable manifest of `platform` in a pushed single-platform index; VerificationError
    when it is not an index, when it lists no such manifest or another runnable image besides it."""
    if not isinstance(index.get("manifests"), list):
        raise VerificationError(f"{where} is a single manifest, not an index with an attestation manifest: "
                                "the push carried no provenance; refusing to record it")
    runnable = [d for d in index["manifests"] if not is_attestation(d)]
    mine = [d for d in runnable if descriptor_platform(d) == platform]
    if len(mine) != 1 or len(runnable) != 1:
        listed = ", ".join(f"{d.get('digest')} ({descriptor_platform(d)})" for d in runnable) or "none"
        raise VerificationError(f"{where} should list one {platform} image, it lists {listed}; refusing to record it")
    return mine[0]


def attestations_for(index: dict[str, Any], digest: str) -> list[dict[str, Any]]:
    """The attestation manifests of an index that describe the manifest `digest`."""
    return [d for d in index.get("manifests", [])
            if is_attestation(d) and (d.get("annotations") or {}).get(REFERENCE_DIGEST) == digest]


def predicate_types(attestation: dict[str, Any]) -> list[str]:
    """The in-toto predicate types an attestation manifest's layers announce."""
    return [str((layer.get("annotations") or {}).get(PREDICATE_TYPE, "")) for layer in attestation.get("layers", [])
            if layer.get("mediaType") == IN_TOTO]


def read_back(repository: str, index_digest: str, *, platform: str, image_id: str, inspect: Inspect) -> PushedImage:
    """Read the index pushed at `repository@index_digest` and prove it holds the verified image.

    Raises VerificationError (one line) unless: the index's one `platform` manifest has `image_id` as
    its config, and an attestation manifest for that manifest carries SLSA provenance.
    """
    ref = f"{repository}@{index_digest}"
    index = inspect(ref)
    if index is None:
        raise VerificationError(f"{ref} is not in the registry: the push did not arrive; refusing to record it")
    entry = platform_manifest(index, platform, ref)
    digest = str(entry.get("digest"))
    manifest = inspect(f"{repository}@{digest}")
    if manifest is None:
        raise VerificationError(f"{repository}@{digest} (listed by {index_digest}) is not in the registry")
    config = (manifest.get("config") or {}).get("digest")
    if config != image_id:
        raise VerificationError(f"{repository}@{digest} holds config {config}, not the verified image {image_id}: "
                                "the builder did not push the image the gate ran; refusing to record it")
    found = attestations_for(index, digest)
    if len(found) != 1:
        raise VerificationError(f"{ref} has {len(found)} attestation manifests for {digest}, not one: "
                                "the builder recorded no provenance for it; refusing to record it")
    attestation_digest = str(found[0].get("digest"))
    attestation = inspect(f"{repository}@{attestation_digest}")
    types = predicate_types(attestation or {})
    if not any(t in PROVENANCE_PREDICATES for t in types):
        raise VerificationError(f"{repository}@{attestation_digest} carries {', '.join(types) or 'no in-toto layer'}, "
                                "no SLSA provenance; refusing to record it")
    return PushedImage(repository=repository, index_digest=index_digest, manifest_digest=digest,
                       config_digest=str(config), attestation_digest=attestation_digest,
                       predicate_types=tuple(types))


# ---- the push ---------------------------------------------------------------------------------------


def bake_push_command(bake_files: list[Path], target: str, *, repository: str, metadata_file: Path) -> list[str]:
    """The second buildx run: the same bake files and target (so the same cached build), with a
    provenance attestation, pushed by digest to `repository` (a push by digest takes no tag)."""
    settings = [f"{target}.attest={ATTEST}", f"{target}.tags={repository}", f"{target}.output={PUSH_OUTPUT}"]
    return docker_cli.buildx_bake(bake_files, target, settings=settings, metadata_file=metadata_file)


def tag_command(tag: str, source: str) -> list[str]:
    """`imagetools create` with one index source makes `tag` a carbon copy of it (buildx's documented
    behaviour), so the per-platform tag holds the checked index, attestation included."""
    return docker_cli.imagetools_create([tag], [source])


def pushed_digests(metadata: dict[str, Any], target: str, where: Path) -> tuple[str, str]:
    """(index digest, config digest) bake's metadata file reports for `target`'s push."""
    entry = metadata.get(target) or {}
    index, config = entry.get("containerimage.digest"), entry.get("containerimage.config.digest", "")
    if not isinstance(index, str) or not DIGEST.match(index):
        raise BuildError(f"{where}: no containerimage.digest for {target}: buildx reported no pushed image")
    return index, str(config)


def require_epoch(bake_file: Path, target: str) -> str:
    """The target's SOURCE_DATE_EPOCH build arg; InputError when the bake file has none."""
    args = target_of(load_bake_file(bake_file), target, bake_file).get("args") or {}
    epoch = str(args.get(EPOCH_ARG, ""))
    if not epoch.isdigit():
        raise InputError(f"{bake_file}: target {target} has no {EPOCH_ARG} build arg, so a second buildx run would "
                         f"stamp a new config time: write the bake file again with build.py --bake-file")
    return epoch


def push_with_provenance(bake_file: Path, overrides: list[Path], target: str, *, repository: str, platform: str,
                         image_id: str, tag: str, run: Run | None = None, inspect: Inspect | None = None,
                         progress: Callable[[str], None] = lambda _m: None) -> PushedImage:
    """Push the verified `image_id` again with buildx and its provenance, prove the registry holds it
    (read_back), then give it the per-platform `tag`. Raises before tagging when anything differs."""
    run = run or run_command
    inspect = inspect or inspect_raw
    require_epoch(bake_file, target)
    bake_dir = Path(bake_file).parent
    metadata_file = bake_dir / f"push-metadata-{target}.json"
    metadata_file.unlink(missing_ok=True)  # a stale file from an earlier run must not answer for this push
    command = bake_push_command([bake_file, *overrides], target, repository=repository, metadata_file=metadata_file)
    progress(f"{target}: pushing verified {image_id[:19]} with provenance: {' '.join(command)}")
    run(command, bake_dir)
    try:
        metadata = json.loads(metadata_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise BuildError(f"{metadata_file}: buildx wrote no readable metadata ({exc})") from None
    index_digest, config = pushed_digests(metadata, target, metadata_file)
    if config and config != image_id:
        raise VerificationError(f"{target}: buildx pushed config {config}, not the verified image {image_id}: "
                                f"{repository}@{index_digest} is not recorded or tagged")
    pushed = read_back(repository, index_digest, platform=platform, image_id=image_id, inspect=inspect)
    progress(f"{target}: {repository}@{pushed.manifest_digest} holds config {image_id[:19]} = the verified image; "
             f"provenance {pushed.attestation_digest[:19]} ({', '.join(pushed.predicate_types)})")
    source = f"{repository}@{index_digest}"
    run(tag_command(tag, source), bake_dir)
    if inspect(tag) != inspect(source):
        raise VerificationError(f"{tag} does not hold {source} after tagging it; refusing to record it")
    return pushed
