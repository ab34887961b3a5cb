"""The release path (bakery.release) rehearsed against a real registry, as far as this machine allows.

On GitHub each platform job gates its bake-built image, pushes it and writes a record; the manifest
job makes the release tags from the records with `docker buildx imagetools create`. Here there is
one platform and no buildx, so: this machine's local bake target (the vLLM stand-in) is gated for
real by `verify --push --rehearsal`, and `assemble --tool manifest --rehearsal` makes the release
tags with `docker manifest create/push` from the record. skopeo reads every result back.

Both tools are given the same verified digests by the same plan (ManifestPlan); the imagetools call
is checked by its exact argv and by what the registry holds after the docker manifest path: an
index of exactly those digests with the platform each one's config declares, which is what
imagetools makes of the same sources.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

import bakery.build.builder
import bakery.release.ci as release
from bakery.build.pipeline import run_engine
from bakery.recipe.build_facts import BuildFacts
from bakery.recipe.plan import BuildOptions, host_platform, make_plan
from bakery.release.bakefile import load_bake_file, target_of, write_bake_file
from bakery.release.ci import VerifiedRecord, plan_manifests, verify_target
from bakery.spec.engine_spec import load_engine
from tests.image.readback import main as readback_main
from tests.image.real_registry import (
    RunningRegistry,
    gate_once,
    keep,
    own_context_dir,
    planted_images,
    push_as,
    remove_tags,
    running_registry,
    skopeo_config,
    skopeo_raw,
    skopeo_tags,
)

ENGINE = "sglang"
REV = "abc1234" + "0" * 33  # the bake file's BAKERY_REVISION: a clean commit, so a commit tag is made
PLATFORM = host_platform()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRegistry]:
    """One real registry for the module, with its own config and storage in a temporary folder."""
    with running_registry(tmp_path_factory.mktemp("release-registry")) as running:
        yield running


@pytest.fixture(scope="module")
def verified(registry: RunningRegistry, docker_client, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """`verify --push --rehearsal` for real: this machine's bake target, gated, pushed and recorded."""
    spec = load_engine(ENGINE)
    work = tmp_path_factory.mktemp("release")
    with pytest.MonkeyPatch.context() as mp:
        # The image as build.py makes it (Docker's cache: the same id build.py --local verifies).
        mp.setattr(bakery.build.builder, "context_dir", own_context_dir())
        plan = make_plan(spec, BuildOptions(local=True, verify=False), BuildFacts.of_checkout())
        built = run_engine(plan, quiet=True)

    def no_wheels(platform: str) -> Path:  # the bake file is read here, not built from
        (work / "wheels").mkdir(exist_ok=True)
        return work / "wheels"

    bake_plan = make_plan(spec, BuildOptions(local=True, repository=f"{registry.host}/acme"), BuildFacts(REV, "now"))
    bake = write_bake_file([bake_plan], work / "bake" / "docker-bake.json", wheelhouse=no_wheels, quiet=True)
    target = f"{ENGINE}-{PLATFORM.split('/')[1]}"
    candidate = target_of(load_bake_file(bake), target)["tags"][0]
    repo, _, tag = candidate.rpartition(":")
    keep(docker_client, built["image_id"])
    docker_client.images.get(built["image_id"]).tag(repo, tag)  # what `docker buildx bake --load` leaves
    records = work / "records"
    record = verify_target(bake, target, records=records, push=True, rehearsal=True, gate=gate_once)
    yield {"record": record, "records": records, "image_id": built["image_id"], "repository": repo}
    remove_tags(docker_client, f"{registry.host}/")


def assemble_cli(capsys: pytest.CaptureFixture, *records: Path) -> tuple[int, list[str]]:
    """`python -m bakery.release assemble --tool manifest --rehearsal --allow-partial RECORDS`:
    (exit code, its error lines). --allow-partial: this machine builds one of the spec's platforms."""
    code = release.main(["assemble", "--tool", "manifest", "--rehearsal", "--allow-partial", *map(str, records)])
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if line.startswith("bakery.release:")]


@pytest.fixture
def plant(docker_client) -> Iterator:
    """plant(text) -> the id of a tiny image no gate ever saw; removed (with its tags) afterwards."""
    with planted_images(docker_client) as make:
        yield lambda text: make({"planted.txt": text.encode()})


def shared_tags(record: VerifiedRecord) -> list[str]:
    """The release tags every revision shares (engine + bakery version, engine version)."""
    return plan_manifests([record], allow_partial=True, variant="local")[0].tags[1:]


def views(refs: list[str]) -> dict[str, object]:
    return {ref: skopeo_raw(ref) for ref in refs}


def test_verify_pushed_exactly_the_gated_image(verified: dict) -> None:
    record = verified["record"]
    assert record.image_id == verified["image_id"] and record.checks_run > 0
    assert record.pushed_ref.endswith(f"-g{REV[:7]}-local-{PLATFORM.split('/')[1]}"), record.pushed_ref
    manifest, digest = skopeo_raw(record.pushed_ref)
    assert digest == record.digest
    assert manifest["config"]["digest"] == verified["image_id"]
    assert skopeo_tags(verified["repository"]) == [record.pushed_ref.rpartition(":")[2]]


def test_release_tags_are_an_index_of_the_verified_digests(verified: dict, registry: RunningRegistry,
                                                           capsys: pytest.CaptureFixture) -> None:
    record, repository = verified["record"], verified["repository"]
    code, errors = assemble_cli(capsys, verified["records"])
    assert code == 0, errors
    plan = plan_manifests([record], allow_partial=True, variant="local")[0]
    # What the GitHub path would run for the same records: the exact imagetools argv.
    argv = plan.command()
    tags = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--tag"]
    sources = [arg for arg in argv[4:] if not arg.startswith("--") and arg not in tags]
    assert argv == ["docker", "buildx", "imagetools", "create", *[a for t in tags for a in ("--tag", t)], *sources]
    assert sources == [f"{repository}@{record.digest}"]
    assert tags[0].endswith(f"-g{REV[:7]}-local") and not any(t.endswith(":latest") for t in tags)
    # What docker manifest made, per skopeo: exactly those tags (plus the platform tag), each an index
    # of exactly those sources, each entry with the platform its image's config declares (what
    # imagetools puts there too).
    names = [t.rpartition(":")[2] for t in [*tags, record.pushed_ref]]
    assert skopeo_tags(repository) == sorted(names)
    config = skopeo_config(sources[0])
    for tag in tags:
        index, _digest = skopeo_raw(tag)
        assert index["mediaType"] == "application/vnd.docker.distribution.manifest.list.v2+json", index
        assert [(m["digest"], m["platform"]["os"], m["platform"]["architecture"]) for m in index["manifests"]] == \
            [(record.digest, config["os"], config["architecture"])]
        assert f"{config['os']}/{config['architecture']}" == record.platform
    source_manifest, _ = skopeo_raw(sources[0])
    assert source_manifest["config"]["digest"] == verified["image_id"]
    # readback (skopeo) accepts what was made from the records: the platform tag and each index.
    readback_main([registry.host, "--records", str(verified["records"])])
    lines = capsys.readouterr().out.splitlines()
    for ref in [*tags, record.pushed_ref]:
        assert any(line.startswith(f"ok   {ref}") for line in lines), (ref, lines)
        assert not any(line.startswith(f"BAD  {ref}") for line in lines), (ref, lines)
    # A re-run with the same records leaves every tag as it is (the commit tag holds the same digest).
    before = views(tags)
    assert assemble_cli(capsys, verified["records"])[0] == 0
    assert views(tags) == before


def test_a_record_of_a_digest_the_gate_never_verified_is_refused(verified: dict, registry: RunningRegistry,
                                                                docker_client, plant, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    record, repository = verified["record"], verified["repository"]
    planted = plant("never gated")
    digest = push_as(docker_client, planted, f"{repository}:planted")
    revision = "bbbbbbb" + "1" * 33
    forged = dataclasses.replace(record, digest=digest, revision=revision)
    before = views(shared_tags(record))
    code, errors = assemble_cli(capsys, VerifiedRecord.write(forged, tmp_path))
    assert code == 1
    assert errors == [f"bakery.release: {repository}@{digest} holds config {planted}, not the verified image "
                      f"{record.image_id}: refusing to publish it"]
    assert not [t for t in skopeo_tags(repository) if f"-g{revision[:7]}" in t], "a release tag was created"
    assert views(shared_tags(record)) == before, "a shared release tag moved"


def test_a_platform_tag_moved_after_the_gate_is_refused(verified: dict, docker_client, plant, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    record, repository = verified["record"], verified["repository"]
    moved_ref = f"{repository}:moved-{PLATFORM.split('/')[1]}"
    assert push_as(docker_client, verified["image_id"], moved_ref) == record.digest  # the verified image, by digest
    planted = plant("pushed over the verified tag")
    planted_digest = push_as(docker_client, planted, moved_ref)  # someone moves the tag after the gate
    revision = "ccccccc" + "2" * 33
    before = views(shared_tags(record))
    code, errors = assemble_cli(capsys, VerifiedRecord.write(dataclasses.replace(record, pushed_ref=moved_ref,
                                                                         revision=revision), tmp_path))
    assert code == 1
    assert len(errors) == 1 and errors[0].startswith(
        f"bakery.release: {moved_ref} no longer holds the verified {record.digest}"), errors
    assert skopeo_raw(moved_ref)[1] == planted_digest  # skopeo sees the move, and nothing was made of it
    assert not [t for t in skopeo_tags(repository) if f"-g{revision[:7]}" in t], "a release tag was created"
    assert views(shared_tags(record)) == before, "a shared release tag moved"


def test_an_existing_commit_tag_is_never_moved(verified: dict, docker_client, plant, tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    record = verified["record"]
    revision = "ddddddd" + "3" * 33
    again = dataclasses.replace(record, revision=revision)
    commit_tag = plan_manifests([again], allow_partial=True, variant="local")[0].pinned
    assert commit_tag and f"-g{revision[:7]}-local" in commit_tag
    planted = plant("an earlier release of this commit")
    planted_digest = push_as(docker_client, planted, commit_tag)
    before = views(shared_tags(record))
    code, errors = assemble_cli(capsys, VerifiedRecord.write(again, tmp_path))
    assert code == 1
    assert errors == [f"bakery.release: {commit_tag} already exists with other images: a commit tag is never moved"]
    assert skopeo_raw(commit_tag)[1] == planted_digest, "the commit tag was moved"
    assert views(shared_tags(record)) == before, "a shared release tag moved"
