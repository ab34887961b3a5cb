"""The provenance push (bakery/release/provenance.py) and its read-back, on recorded index and manifest JSON.

The fixtures (tests/unit/fixtures/provenance/, see its README) are what buildx pushes for one platform
with `attest=type=provenance`, laid out as BuildKit's attestation-storage document describes: an index
holding the platform manifest and an attestation manifest for it. buildx is not on this machine, so
the push itself is a fake here (its argv is checked); the read-back logic is the real one.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

import bakery.build.publish as publish
import bakery.build.verify
import bakery.docker.engine as docker_engine
import bakery.release.ci as release
import bakery.release.provenance as provenance
from bakery.build.verify import GateResult
from bakery.errors import BuildError, InputError, VerificationError
from bakery.recipe.build_facts import BuildFacts
from bakery.recipe.plan import BuildOptions, make_plan
from bakery.release.bakefile import load_bake_file, write_bake_file
from bakery.release.ci import VerifiedRecord, assemble, verify_target
from bakery.release.provenance import bake_push_command, platform_manifest, push_with_provenance, read_back
from bakery.spec.engine_spec import load_engine

FIXTURES = Path(__file__).parent / "fixtures" / "provenance"
REPO = "ghcr.io/acme/vllm"
REV = "abc1234def5678900000000000000000000000000"


def raw(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


IMAGE = {arch: digest_of(raw(f"config-{arch}.json")) for arch in ("amd64", "arm64")}
MANIFEST = {arch: digest_of(raw(f"manifest-{arch}.json")) for arch in ("amd64", "arm64")}
ATTESTATION = {arch: digest_of(raw(f"attestation-{arch}.json")) for arch in ("amd64", "arm64")}
INDEX = {arch: digest_of(raw(f"index-{arch}.json")) for arch in ("amd64", "arm64")}


class Registry:
    """Blobs by digest (as a registry serves `repo@sha256:...`), tags, and buildx's two registry verbs
    as their documentation and source describe them: imagetools create copies a single index source
    as is and otherwise merges the sources' entries (attestation manifests included)."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.tags: dict[str, str] = {}
        self.commands: list[list[str]] = []
        for path in sorted(FIXTURES.glob("*.json")):
            self.put(path.read_bytes())

    def put(self, data: bytes, tag: str | None = None) -> str:
        digest = digest_of(data)
        self.blobs[digest] = data
        if tag:
            self.tags[tag] = digest
        return digest

    def put_json(self, obj: Any, tag: str | None = None) -> str:
        return self.put((json.dumps(obj, indent=2) + "\n").encode(), tag)

    def inspect(self, ref: str) -> dict[str, Any] | None:
        _name, at, digest = ref.rpartition("@")
        key = digest if at else self.tags.get(ref, "")
        return json.loads(self.blobs[key]) if key in self.blobs else None

    def imagetools_create(self, cmd: list[str]) -> None:
        tags = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--tag"]
        sources = [arg for arg in cmd[4:] if "@" in arg]
        found = [self.inspect(s) for s in sources]
        if len(sources) == 1 and "manifests" in (found[0] or {}):
            digest = sources[0].partition("@")[2]
        else:
            entries: list[dict] = []
            for source, item in zip(sources, found, strict=True):
                if "manifests" in (item or {}):
                    entries += item["manifests"]
                else:
                    entries.append({"digest": source.partition("@")[2]})
            digest = self.put_json({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                                    "manifests": entries})
        for tag in tags:
            self.tags[tag] = digest


@pytest.fixture
def registry() -> Registry:
    return Registry()


def edited_index(registry: Registry, arch: str, edit) -> str:
    """Store a changed copy of index-<arch>.json and return its digest."""
    index = json.loads(raw(f"index-{arch}.json"))
    edit(index)
    return registry.put_json(index)


# ---- reading the pushed index back --------------------------------------------------------------


@pytest.mark.parametrize("attestation_first", [False, True])
def test_read_back_picks_the_platform_manifest_not_the_attestation(registry: Registry, attestation_first: bool) -> None:
    digest = INDEX["amd64"]
    if attestation_first:
        digest = edited_index(registry, "amd64", lambda index: index["manifests"].reverse())
    pushed = read_back(REPO, digest, platform="linux/amd64", image_id=IMAGE["amd64"], inspect=registry.inspect)
    assert pushed.manifest_digest == MANIFEST["amd64"]
    assert pushed.config_digest == IMAGE["amd64"]
    assert pushed.attestation_digest == ATTESTATION["amd64"]
    assert pushed.predicate_types == ("https://slsa.dev/provenance/v0.2",)
    assert pushed.index_digest == digest


def test_arm64_with_its_cpu_variant_is_linux_arm64(registry: Registry) -> None:
    pushed = read_back(REPO, INDEX["arm64"], platform="linux/arm64", image_id=IMAGE["arm64"], inspect=registry.inspect)
    assert pushed.manifest_digest == MANIFEST["arm64"]


def test_a_config_that_is_not_the_verified_image_is_refused_in_one_line(registry: Registry) -> None:
    with pytest.raises(VerificationError) as caught:
        read_back(REPO, INDEX["amd64"], platform="linux/amd64", image_id=IMAGE["arm64"], inspect=registry.inspect)
    message = str(caught.value)
    assert "\n" not in message
    assert f"holds config {IMAGE['amd64']}, not the verified image {IMAGE['arm64']}" in message


def test_the_attestation_manifest_is_never_taken_for_the_image(registry: Registry) -> None:
    # The attestation claims the target's platform: an index then lists two "images" and is refused,
    # rather than one of them being picked by position.
    def relabel(index: dict) -> None:
        index["manifests"][1]["annotations"]["vnd.docker.reference.type"] = "something-else"
        index["manifests"][1]["platform"] = {"os": "linux", "architecture": "amd64"}

    digest = edited_index(registry, "amd64", relabel)
    with pytest.raises(VerificationError, match="should list one linux/amd64 image, it lists"):
        read_back(REPO, digest, platform="linux/amd64", image_id=IMAGE["amd64"], inspect=registry.inspect)


@pytest.mark.parametrize("edit, message", [
    (lambda index: index["manifests"].pop(1), "0 attestation manifests"),
    (lambda index: index["manifests"][1]["annotations"].update({"vnd.docker.reference.digest": MANIFEST["arm64"]}),
     "0 attestation manifests"),
    (lambda index: index["manifests"].append(copy.deepcopy(index["manifests"][1])), "2 attestation manifests"),
    (lambda index: index["manifests"].pop(0), "should list one linux/amd64 image, it lists none"),
    (lambda index: index["manifests"].insert(1, {"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                                 "digest": MANIFEST["arm64"],
                                                 "platform": {"os": "linux", "architecture": "arm64"}}),
     "should list one linux/amd64 image"),
], ids=["no-attestation", "attestation-of-another-image", "two-attestations", "no-image", "another-image"])
def test_an_index_without_exactly_its_image_and_provenance_is_refused(registry: Registry, edit, message: str) -> None:
    digest = edited_index(registry, "amd64", edit)
    with pytest.raises(VerificationError, match=message):
        read_back(REPO, digest, platform="linux/amd64", image_id=IMAGE["amd64"], inspect=registry.inspect)


def test_a_plain_manifest_carries_no_provenance(registry: Registry) -> None:
    with pytest.raises(VerificationError, match="single manifest, not an index"):
        read_back(REPO, MANIFEST["amd64"], platform="linux/amd64", image_id=IMAGE["amd64"], inspect=registry.inspect)


def test_an_attestation_without_slsa_provenance_is_refused(registry: Registry) -> None:
    attestation = json.loads(raw("attestation-amd64.json"))
    attestation["layers"][0]["annotations"]["in-toto.io/predicate-type"] = "https://spdx.dev/Document"
    sbom_only = registry.put_json(attestation)
    digest = edited_index(registry, "amd64", lambda index: index["manifests"][1].update({"digest": sbom_only}))
    with pytest.raises(VerificationError, match=r"carries https://spdx\.dev/Document, no SLSA provenance"):
        read_back(REPO, digest, platform="linux/amd64", image_id=IMAGE["amd64"], inspect=registry.inspect)


def test_an_index_the_registry_does_not_have_is_refused(registry: Registry) -> None:
    with pytest.raises(VerificationError, match="is not in the registry"):
        read_back(REPO, "sha256:" + "9" * 64, platform="linux/amd64", image_id=IMAGE["amd64"], inspect=registry.inspect)


def test_platform_manifest_reads_the_documented_example() -> None:
    index = json.loads(raw("index-amd64.json"))
    assert platform_manifest(index, "linux/amd64", "x")["digest"] == MANIFEST["amd64"]


# ---- the push: argv, order, and nothing recorded or tagged before the check --------------------------


def vllm_bake_file(directory: Path, created: str) -> Path:
    """The vLLM bake file (production targets) with this `created` time; no wheels (it is never built)."""
    (directory / "wheels").mkdir(parents=True, exist_ok=True)
    plan = make_plan(load_engine("vllm"), BuildOptions(repository="ghcr.io/acme"), BuildFacts(REV, created))
    return write_bake_file([plan], directory / "bake" / "docker-bake.json",
                           wheelhouse=lambda _platform: directory / "wheels", quiet=True)


@pytest.fixture
def bake_file(tmp_path: Path) -> Path:
    return vllm_bake_file(tmp_path, "2026-01-02T03:04:05Z")


def test_the_bake_file_pins_the_config_time_to_the_created_label(bake_file: Path) -> None:
    args = load_bake_file(bake_file)["target"]["vllm-amd64"]["args"]
    assert args["SOURCE_DATE_EPOCH"] == "1767323045"  # 2026-01-02T03:04:05Z, the label's time
    assert provenance.require_epoch(bake_file, "vllm-amd64") == "1767323045"


def test_the_push_is_the_same_bake_with_provenance_by_digest(bake_file: Path) -> None:
    override = bake_file.parent / "ci.json"
    cmd = bake_push_command([bake_file, override], "vllm-amd64", repository=REPO,
                            metadata_file=bake_file.parent / "m.json")
    assert cmd[:3] == ["docker", "buildx", "bake"]
    assert cmd[3:7] == ["-f", str(bake_file.resolve()), "-f", str(override.resolve())], \
        "the build's own bake files, in the build's order: the same definition, so the same cache"
    sets = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--set"]
    assert sets == ["vllm-amd64.attest=type=provenance,mode=max", f"vllm-amd64.tags={REPO}",
                    "vllm-amd64.output=type=image,push-by-digest=true,name-canonical=true,push=true"]
    assert cmd[-1] == "vllm-amd64" and "--metadata-file" in cmd
    for changes_the_build in ("--no-cache", "--pull", "--load", ".args.", ".platform", ".context"):
        assert not any(changes_the_build in arg for arg in cmd), changes_the_build


class FakeBuildx:
    """`run` for push_with_provenance: the bake push lands `index` in the registry and writes bake's
    metadata; imagetools create is the registry's."""

    def __init__(self, registry: Registry, index_digest: str, config: str) -> None:
        self.registry, self.index_digest, self.config = registry, index_digest, config
        self.ran: list[list[str]] = []

    def __call__(self, cmd: list[str], cwd: Path) -> None:
        self.ran.append(cmd)
        if cmd[:3] == ["docker", "buildx", "bake"]:
            target = cmd[-1]
            metadata = Path(cmd[cmd.index("--metadata-file") + 1])
            metadata.write_text(json.dumps({target: {"containerimage.digest": self.index_digest,
                                                     "containerimage.config.digest": self.config}}))
        elif cmd[:4] == ["docker", "buildx", "imagetools", "create"]:
            self.registry.imagetools_create(cmd)
        else:
            raise AssertionError(f"unexpected command {cmd}")


def push(bake_file: Path, registry: Registry, buildx: FakeBuildx, image_id: str = IMAGE["amd64"]):
    return push_with_provenance(bake_file, [], "vllm-amd64", repository=REPO, platform="linux/amd64",
                                image_id=image_id, tag=f"{REPO}:x-amd64", run=buildx, inspect=registry.inspect)


def test_a_checked_push_tags_the_index_as_is(bake_file: Path, registry: Registry) -> None:
    buildx = FakeBuildx(registry, INDEX["amd64"], IMAGE["amd64"])
    pushed = push(bake_file, registry, buildx)
    assert [c[:4] for c in buildx.ran] == [["docker", "buildx", "bake", "-f"],
                                           ["docker", "buildx", "imagetools", "create"]]
    assert buildx.ran[1] == ["docker", "buildx", "imagetools", "create", "--tag", f"{REPO}:x-amd64",
                             f"{REPO}@{INDEX['amd64']}"]
    assert registry.tags[f"{REPO}:x-amd64"] == INDEX["amd64"], "the per-platform tag is a carbon copy of the index"
    assert pushed.manifest_digest == MANIFEST["amd64"]


def test_a_push_of_another_config_is_refused_before_any_tag(bake_file: Path, registry: Registry) -> None:
    # buildx rebuilt something (a layer missed the cache): its metadata names another config.
    buildx = FakeBuildx(registry, INDEX["arm64"], IMAGE["arm64"])
    with pytest.raises(VerificationError, match=f"buildx pushed config {IMAGE['arm64']}, not the verified image"):
        push(bake_file, registry, buildx)
    assert len(buildx.ran) == 1 and not registry.tags


def test_the_registry_is_believed_over_the_metadata(bake_file: Path, registry: Registry) -> None:
    # The metadata says the verified config, but the index in the registry holds another image.
    buildx = FakeBuildx(registry, INDEX["arm64"], IMAGE["amd64"])
    with pytest.raises(VerificationError, match="should list one linux/amd64 image"):
        push(bake_file, registry, buildx)
    assert not registry.tags


def test_no_metadata_digest_is_a_build_error(bake_file: Path, registry: Registry) -> None:
    buildx = FakeBuildx(registry, "", "")
    with pytest.raises(BuildError, match=r"no containerimage\.digest for vllm-amd64"):
        push(bake_file, registry, buildx)


def test_a_bake_file_without_the_epoch_is_refused_before_pushing(tmp_path: Path, registry: Registry) -> None:
    bake = vllm_bake_file(tmp_path, "now")
    buildx = FakeBuildx(registry, INDEX["amd64"], IMAGE["amd64"])
    with pytest.raises(InputError, match="has no SOURCE_DATE_EPOCH build arg"):
        push(bake, registry, buildx)
    assert buildx.ran == []


# ---- verify_target with provenance: the record is written only after the read-back -----------------


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The loaded image is IMAGE[amd64], pinned base labels; tag_verified records what it tagged."""
    seen: list[str] = []
    labels = {"org.opencontainers.image.base.name": "vllm/vllm-openai:v0.10.2",
              "org.opencontainers.image.base.digest": "sha256:" + "5" * 64}
    monkeypatch.setattr(release, "built_image_id", lambda candidate, metadata, target: IMAGE["amd64"])
    monkeypatch.setattr(docker_engine, "image_labels", lambda image_id: labels)
    monkeypatch.setattr(publish, "tag_verified", lambda image_id, tags, verified: seen.append(f"tag {tags}"))
    monkeypatch.setattr(publish, "push_verified", lambda *a, **k: pytest.fail("docker push on the provenance path"))
    return seen


def passing_gate(image_id, engine, **_kw) -> GateResult:
    return GateResult(passed=True, ran=6)


def test_verify_with_provenance_records_the_read_back_digests(bake_file: Path, tmp_path: Path, registry: Registry,
                                                             gated: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    buildx = FakeBuildx(registry, INDEX["amd64"], IMAGE["amd64"])
    monkeypatch.setattr(provenance, "run_command", buildx)
    monkeypatch.setattr(provenance, "inspect_raw", registry.inspect)
    override = bake_file.parent / "ci.json"
    override.write_text('{"target": {}}')
    rec = verify_target(bake_file, "vllm-amd64", records=tmp_path / "r", push=True, gate=passing_gate,
                        provenance_overrides=[override])
    stored = VerifiedRecord.read(tmp_path / "r" / "vllm-amd64.json")
    assert stored == rec
    assert (rec.image_id, rec.digest, rec.index_digest, rec.attestation_digest) == \
        (IMAGE["amd64"], MANIFEST["amd64"], INDEX["amd64"], ATTESTATION["amd64"])
    assert rec.pushed_ref == rec.tags[0] and registry.tags[rec.pushed_ref] == INDEX["amd64"]
    assert str(override.resolve()) in buildx.ran[0], "the push uses the override the build used"


def test_verify_with_provenance_writes_no_record_for_a_mismatch(bake_file: Path, tmp_path: Path, registry: Registry,
                                                               gated: list[str], monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(provenance, "run_command", FakeBuildx(registry, INDEX["arm64"], IMAGE["arm64"]))
    monkeypatch.setattr(provenance, "inspect_raw", registry.inspect)
    monkeypatch.setattr(bakery.build.verify, "run_gate", passing_gate)  # what verify runs when no gate is given
    code = release.main(["verify", "--bake-file", str(bake_file), "--target", "vllm-amd64", "--records",
                         str(tmp_path / "r"), "--push", "--provenance"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("bakery.release:")]
    assert code == 1 and len(errors) == 1 and "not the verified image" in errors[0], errors
    assert not (tmp_path / "r").exists() or not list((tmp_path / "r").iterdir())
    assert not registry.tags


@pytest.mark.parametrize("args", [["--provenance"], ["--override", "ci.json"], ["--push", "--override", "ci.json"]])
def test_provenance_options_go_together(args: list[str], bake_file: Path, tmp_path: Path, capsys) -> None:
    code = release.main(["verify", "--bake-file", str(bake_file), "--target", "vllm-amd64", "--records",
                         str(tmp_path / "r"), *args])
    assert code == 2
    assert "use --push --provenance" in capsys.readouterr().err


# ---- assembling the release from provenance records ---------------------------------------------------


def provenance_record(arch: str) -> VerifiedRecord:
    return VerifiedRecord(engine="vllm", target=f"vllm-{arch}", platform=f"linux/{arch}", variant="production",
                          repository=REPO, revision=REV, image_id=IMAGE[arch], checks_run=6,
                          tags=[f"{REPO}:x-{arch}"], pushed_ref=f"{REPO}:x-{arch}", digest=MANIFEST[arch],
                          index_digest=INDEX[arch], attestation_digest=ATTESTATION[arch])


@pytest.fixture
def pushed(registry: Registry) -> list[VerifiedRecord]:
    records = [provenance_record(arch) for arch in ("amd64", "arm64")]
    for r in records:
        registry.tags[r.pushed_ref] = r.index_digest
    return records


def test_the_release_index_lists_each_image_and_its_provenance(registry: Registry,
                                                             pushed: list[VerifiedRecord]) -> None:
    plans = assemble(pushed, inspect=registry.inspect, run=registry.imagetools_create)
    assert plans[0].sources == [f"{REPO}@{INDEX['amd64']}", f"{REPO}@{INDEX['arm64']}"]
    for tag in plans[0].tags:
        listed = {m["digest"]: m for m in registry.inspect(tag)["manifests"]}
        assert set(listed) == {MANIFEST["amd64"], MANIFEST["arm64"], ATTESTATION["amd64"], ATTESTATION["arm64"]}
        assert listed[ATTESTATION["arm64"]]["annotations"]["vnd.docker.reference.digest"] == MANIFEST["arm64"]


def test_a_release_index_that_drops_the_provenance_fails(registry: Registry, pushed: list[VerifiedRecord]) -> None:
    def without_attestations(cmd: list[str]) -> None:
        registry.imagetools_create(cmd)
        for tag in [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--tag"]:
            index = registry.inspect(tag)
            index["manifests"] = [m for m in index["manifests"] if not provenance.is_attestation(m)]
            registry.put_json(index, tag)

    with pytest.raises(VerificationError, match="not the verified"):
        assemble(pushed, inspect=registry.inspect, run=without_attestations)


def test_a_record_whose_index_lists_another_manifest_is_refused(registry: Registry,
                                                               pushed: list[VerifiedRecord]) -> None:
    pushed[0].digest = MANIFEST["arm64"]  # the record no longer matches what its index holds
    with pytest.raises(VerificationError, match=f"lists {MANIFEST['amd64']}"):
        assemble(pushed, inspect=registry.inspect, run=registry.imagetools_create)
    assert not [t for t in registry.tags if not t.endswith(("-amd64", "-arm64"))], "no release tag was created"


def test_a_moved_platform_tag_is_refused_for_provenance_records(registry: Registry,
                                                               pushed: list[VerifiedRecord]) -> None:
    registry.tags[pushed[1].pushed_ref] = MANIFEST["arm64"]  # someone pushed the bare manifest over the tag
    with pytest.raises(VerificationError, match=f"no longer holds the verified {INDEX['arm64']}"):
        assemble(pushed, inspect=registry.inspect, run=registry.imagetools_create)


def test_the_docker_manifest_tool_cannot_take_indexes(registry: Registry, pushed: list[VerifiedRecord]) -> None:
    with pytest.raises(InputError, match="takes no index as a source"):
        assemble(pushed, inspect=registry.inspect, run=registry.imagetools_create, tool="manifest")
