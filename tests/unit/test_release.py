"""Publishing exactly what was verified (bakery/release/ci.py, bakery/build/publish.py), without Docker.

A failed gate leaves no tag, no push and no record; the manifest is assembled only from records, and
only after each pushed digest is shown to hold the very image the gate verified.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bakery.build.publish as publish
import bakery.docker.engine as docker_engine
import bakery.docker.push as docker_push
import bakery.release.ci as release
from bakery import __version__
from bakery.build.publish import Pushed
from bakery.build.verify import GateResult
from bakery.errors import InputError, VerificationError
from bakery.recipe.build_facts import BuildFacts
from bakery.recipe.plan import BuildOptions, host_platform, make_plan
from bakery.release.bakefile import write_bake_file
from bakery.release.ci import VerifiedRecord, assemble, matrix, plan_manifests, verify_target
from bakery.spec.engine_spec import available_engines, load_engine
from bakery.spec.image_ref import registry_of

# The pinned vLLM version and base, read from the spec: a version bump (python -m bakery.upkeep.bump) keeps these true.
VV = load_engine("vllm").version
VLLM_BASE = load_engine("vllm").base.image

REV = "abc1234def5678900000000000000000000000000"
IMAGE = {"amd64": "sha256:" + "a" * 64, "arm64": "sha256:" + "b" * 64}
DIGEST = {"amd64": "sha256:" + "1" * 64, "arm64": "sha256:" + "2" * 64}
FACTS = BuildFacts(revision=REV, created="now")


def vllm_plan(**options):
    return [make_plan(load_engine("vllm"), BuildOptions(**options), FACTS)]


def record(engine: str = "vllm", arch: str = "amd64", **changes) -> VerifiedRecord:
    fields = dict(engine=engine, target=f"{engine}-{arch}", platform=f"linux/{arch}", variant="production",
                  repository=f"ghcr.io/acme/{engine}", revision=REV, image_id=IMAGE[arch], checks_run=6,
                  tags=[f"ghcr.io/acme/{engine}:x-{arch}"], pushed_ref=f"ghcr.io/acme/{engine}:x-{arch}",
                  digest=DIGEST[arch])
    fields.update(changes)
    return VerifiedRecord(**fields)


class Registry:
    """A fake registry for imagetools: manifests by digest, and the index each tag was made into."""

    def __init__(self, records: list[VerifiedRecord]) -> None:
        self.refs: dict[str, dict] = {}
        self.platforms: dict[str, str] = {}  # digest -> os/arch, as the image config says
        for r in records:
            self.refs[f"{r.repository}@{r.digest}"] = self.refs[r.pushed_ref] = {"config": {"digest": r.image_id}}
            self.platforms[r.digest] = r.platform
        self.commands: list[list[str]] = []

    def inspect(self, ref: str):
        return self.refs.get(ref)

    def run(self, cmd: list[str]) -> None:
        self.commands.append(cmd)
        tags = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--tag"]
        sources = [arg for arg in cmd[4:] if "@" in arg]
        index = {"manifests": [self.entry(s.partition("@")[2]) for s in sources]}
        for tag in tags:
            self.refs[tag] = index

    def entry(self, digest: str) -> dict:
        os_name, _, arch = self.platforms.get(digest, "linux/unknown").partition("/")
        return {"digest": digest, "platform": {"os": os_name, "architecture": arch}}


# ---- the publishing rule ------------------------------------------------------------------------


def _no_docker(*_a, **_k):
    raise AssertionError("Docker was reached for an image that failed its gate")


def test_tag_and_push_refuse_an_unverified_image(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(docker_engine, "client", _no_docker)
    with pytest.raises(VerificationError, match="no release tag"):
        publish.tag_verified(IMAGE["amd64"], ["bakery/vllm:v1"], verified=False)
    with pytest.raises(VerificationError, match="never pushed"):
        publish.push_verified(IMAGE["amd64"], ["bakery/vllm:v1"], verified=False)


@pytest.fixture
def bake_file(tmp_path: Path) -> Path:
    def wheelhouse(platform: str) -> Path:
        directory = tmp_path / "wheels" / platform.replace("/", "-")
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    return write_bake_file(vllm_plan(repository="ghcr.io/acme"), tmp_path / "bake" / "docker-bake.json",
                           wheelhouse=wheelhouse, quiet=True)


BASE_DIGEST = "sha256:" + "5" * 64
BASE_LABELS = {"org.opencontainers.image.base.name": VLLM_BASE,
               "org.opencontainers.image.base.digest": BASE_DIGEST}


@pytest.fixture
def labels(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The built image's labels (what `bakefile ci --pin-bases` makes the build add); tests may change them."""
    current = dict(BASE_LABELS)
    monkeypatch.setattr(docker_engine, "image_labels", lambda image_id: current)
    return current


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, labels: dict[str, str]) -> list[str]:
    seen: list[str] = []
    monkeypatch.setattr(release, "built_image_id", lambda candidate, metadata, target: IMAGE["amd64"])
    monkeypatch.setattr(publish, "tag_verified", lambda image_id, tags, verified: seen.append(f"tag {tags}"))
    monkeypatch.setattr(publish, "push_verified", lambda image_id, tags, verified, progress=None:
                        seen.append(f"push {tags}") or [Pushed(tags[0], DIGEST["amd64"])])
    return seen


def test_a_failed_gate_leaves_no_tag_no_push_no_record(bake_file: Path, tmp_path: Path, calls: list[str]) -> None:
    def failing_gate(image_id, engine, **_kw):
        return GateResult(passed=False, ran=5, failed=["test_worker_port_exposed"])

    records = tmp_path / "records"
    with pytest.raises(VerificationError, match="test_worker_port_exposed"):
        verify_target(bake_file, "vllm-amd64", records=records, push=True, gate=failing_gate)
    assert calls == []
    assert not records.exists() or not list(records.iterdir())


def test_a_gate_that_ran_nothing_is_not_a_pass(bake_file: Path, tmp_path: Path, calls: list[str]) -> None:
    with pytest.raises(VerificationError, match="no check ran"):
        verify_target(bake_file, "vllm-amd64", records=tmp_path / "r", push=True,
                      gate=lambda *a, **k: GateResult(passed=False, ran=0))
    assert calls == []


def test_a_passed_gate_pushes_the_platform_tag_and_records_the_digest(bake_file: Path, tmp_path: Path,
                                                                      calls: list[str]) -> None:
    gate_calls = []

    def gate(image_id, engine, **kw):
        gate_calls.append((image_id, engine, kw["variant"]))
        return GateResult(passed=True, ran=6)

    rec = verify_target(bake_file, "vllm-amd64", records=tmp_path / "r", push=True, gate=gate)
    assert gate_calls == [(IMAGE["amd64"], "vllm", "production")]
    tag = f"ghcr.io/acme/vllm:{VV}-bakery{__version__}-gabc1234-amd64"
    assert calls == [f"tag {[tag]}", f"push {[tag]}"]
    assert (rec.image_id, rec.digest, rec.pushed_ref) == (IMAGE["amd64"], DIGEST["amd64"], tag)
    assert (rec.base_image, rec.base_digest) == (VLLM_BASE, BASE_DIGEST)
    assert VerifiedRecord.read(tmp_path / "r" / "vllm-amd64.json") == rec


def test_a_release_without_a_recorded_base_digest_is_refused_before_the_gate(
        bake_file: Path, tmp_path: Path, calls: list[str], labels: dict[str, str]) -> None:
    del labels["org.opencontainers.image.base.digest"]
    with pytest.raises(InputError, match=r"records no base digest .*--pin-bases"):
        verify_target(bake_file, "vllm-amd64", records=tmp_path / "r", push=True, gate=_no_docker)
    assert calls == []
    # Without --push (a gate run, no release) the record just says what is known.
    rec = verify_target(bake_file, "vllm-amd64", records=tmp_path / "r",
                        gate=lambda *a, **k: GateResult(passed=True, ran=1))
    assert (rec.base_image, rec.base_digest) == (VLLM_BASE, "")


def test_a_base_pinned_by_the_spec_must_be_the_recorded_digest(bake_file: Path, tmp_path: Path, calls: list[str],
                                                               labels: dict[str, str]) -> None:
    pinned = "sha256:" + "6" * 64
    labels["org.opencontainers.image.base.name"] = f"{VLLM_BASE}@{pinned}"
    with pytest.raises(release.BuildError, match=r"names the base .* but records"):
        verify_target(bake_file, "vllm-amd64", records=tmp_path / "r", push=True, gate=_no_docker)
    del labels["org.opencontainers.image.base.digest"]  # the spec's own pin is the record then
    rec = verify_target(bake_file, "vllm-amd64", records=tmp_path / "r", push=True,
                        gate=lambda *a, **k: GateResult(passed=True, ran=1))
    assert rec.base_digest == pinned


def test_local_builds_are_never_pushed_for_release(tmp_path: Path, calls: list[str]) -> None:
    def wheelhouse(platform: str) -> Path:
        (tmp_path / "w").mkdir(exist_ok=True)
        return tmp_path / "w"

    local = write_bake_file(vllm_plan(local=True), tmp_path / "l" / "docker-bake.json", wheelhouse=wheelhouse,
                            quiet=True)
    target = f"vllm-{host_platform().split('/')[1]}"
    with pytest.raises(InputError, match="only production builds are pushed"):
        verify_target(local, target, records=tmp_path / "r", push=True,
                      gate=lambda *a, **k: GateResult(passed=True, ran=1))
    rec = verify_target(local, target, records=tmp_path / "r", gate=lambda *a, **k: GateResult(passed=True, ran=1))
    assert rec.digest == "" and rec.tags[0].endswith("-gabc1234-local")


def test_metadata_must_name_the_same_image(monkeypatch: pytest.MonkeyPatch) -> None:
    class Image:
        id = IMAGE["amd64"]

    class Client:
        class images:  # mimics the SDK's client.images
            @staticmethod
            def get(ref):
                return Image

    monkeypatch.setattr("bakery.docker.engine.client", lambda: Client)
    meta = {"vllm-amd64": {"containerimage.config.digest": IMAGE["amd64"]}}
    assert release.built_image_id("x:candidate", meta, "vllm-amd64") == IMAGE["amd64"]
    assert release.built_image_id("x:candidate", {"vllm-amd64": {}}, "vllm-amd64") == IMAGE["amd64"]
    with pytest.raises(release.BuildError, match="not the same image"):
        release.built_image_id("x:candidate", {"vllm-amd64": {"containerimage.config.digest": IMAGE["arm64"]}},
                               "vllm-amd64")


# ---- the manifest -------------------------------------------------------------------------------


def test_assemble_creates_release_tags_from_verified_digests_only() -> None:
    records = [record(arch="arm64"), record(arch="amd64")]
    registry = Registry(records)
    plans = assemble(records, inspect=registry.inspect, run=registry.run)
    # vLLM's default CUDA line: its plain tags first, then its -cuda<version> ones, then latest.
    cuda = load_engine("vllm").base.cuda_variant(None).cuda
    tags = [f"ghcr.io/acme/vllm:{VV}-bakery{__version__}-gabc1234", f"ghcr.io/acme/vllm:{VV}-bakery{__version__}",
            f"ghcr.io/acme/vllm:{VV}", f"ghcr.io/acme/vllm:{VV}-bakery{__version__}-gabc1234-cuda{cuda}",
            f"ghcr.io/acme/vllm:{VV}-bakery{__version__}-cuda{cuda}", f"ghcr.io/acme/vllm:{VV}-cuda{cuda}",
            "ghcr.io/acme/vllm:latest"]
    assert registry.commands == [["docker", "buildx", "imagetools", "create",
                                  *[a for t in tags for a in ("--tag", t)],
                                  f"ghcr.io/acme/vllm@{DIGEST['amd64']}", f"ghcr.io/acme/vllm@{DIGEST['arm64']}"]]
    assert plans[0].pinned == tags[0]


def test_each_cuda_line_is_released_under_its_own_tags() -> None:
    other = next(line for line in load_engine("vllm").base.cuda_variants if not line.default)
    part = other.cuda.replace(".", "")
    records = [record(arch="amd64"), record(arch="arm64"),
               record(arch="amd64", cuda=other.cuda, target=f"vllm-cu{part}-amd64", image_id=IMAGE["arm64"],
                      digest="sha256:" + "3" * 64),
               record(arch="arm64", cuda=other.cuda, target=f"vllm-cu{part}-arm64", image_id=IMAGE["amd64"],
                      digest="sha256:" + "4" * 64)]
    plans = plan_manifests(records)
    # A record naming no line is of the default one (what the default target's image is).
    assert sorted(p.cuda for p in plans) == sorted([load_engine("vllm").base.cuda_variant(None).cuda, other.cuda])
    line_plan = next(p for p in plans if p.cuda == other.cuda)
    assert all(t.endswith(f"-cuda{other.cuda}") for t in line_plan.tags), "no plain tag, no latest"
    assert line_plan.sources == [f"ghcr.io/acme/vllm@sha256:{'3' * 64}", f"ghcr.io/acme/vllm@sha256:{'4' * 64}"]
    with pytest.raises(InputError, match="not a line of this engine"):
        plan_manifests([record(arch="amd64", cuda="9.9")], allow_partial=True)


def test_a_digest_holding_another_image_is_refused() -> None:
    records = [record(arch="amd64"), record(arch="arm64")]
    registry = Registry(records)
    registry.refs[f"ghcr.io/acme/vllm@{DIGEST['arm64']}"] = {"config": {"digest": "sha256:" + "f" * 64}}
    with pytest.raises(VerificationError, match="not the verified image"):
        assemble(records, inspect=registry.inspect, run=registry.run)
    assert registry.commands == []


def test_a_missing_digest_is_refused() -> None:
    records = [record(arch="amd64"), record(arch="arm64")]
    registry = Registry(records[:1])
    with pytest.raises(VerificationError, match="not in the registry"):
        assemble(records, inspect=registry.inspect, run=registry.run)


def test_a_commit_tag_is_never_moved() -> None:
    records = [record(arch="amd64"), record(arch="arm64")]
    registry = Registry(records)
    pinned = f"ghcr.io/acme/vllm:{VV}-bakery{__version__}-gabc1234"
    registry.refs[pinned] = {"manifests": [{"digest": "sha256:" + "9" * 64}]}
    with pytest.raises(VerificationError, match="never moved"):
        assemble(records, inspect=registry.inspect, run=registry.run)
    registry.refs[pinned] = {"manifests": [registry.entry(DIGEST["amd64"]), registry.entry(DIGEST["arm64"])]}
    assemble(records, inspect=registry.inspect, run=registry.run)  # a re-run with the same digests is fine


def test_a_created_tag_listing_other_digests_fails() -> None:
    records = [record(arch="amd64"), record(arch="arm64")]
    registry = Registry(records)

    def sloppy_run(cmd):
        registry.run(cmd)
        registry.refs["ghcr.io/acme/vllm:latest"] = {"manifests": [registry.entry(DIGEST["amd64"])]}

    with pytest.raises(VerificationError, match="not the verified"):
        assemble(records, inspect=registry.inspect, run=sloppy_run)


@pytest.mark.parametrize(("records", "message"), [
    ([], "nothing passed the gate"),
    ([record(arch="amd64")], "no verified image for linux/arm64"),
    ([record(arch="amd64"), record(arch="amd64")], "two records for one platform"),
    ([record(arch="amd64", variant="local"), record(arch="arm64")], "only production"),
    ([record(arch="amd64", digest=""), record(arch="arm64")], "was not pushed"),
    ([record(arch="amd64"), record(arch="arm64", revision="f" * 40)], "disagree on revision"),
])
def test_plan_manifests_refuses_incomplete_or_mixed_records(records, message: str) -> None:
    with pytest.raises(InputError, match=message):
        plan_manifests(records)


def test_a_single_platform_release_may_be_a_plain_manifest_copy() -> None:
    records = [record(engine="sglang", arch="amd64", repository="ghcr.io/acme/sglang")]
    registry = Registry(records)

    def copy_as_is(cmd):  # imagetools without --prefer-index copies a single source unchanged
        registry.commands.append(cmd)
        for i, arg in enumerate(cmd):
            if arg == "--tag":
                registry.refs[cmd[i + 1]] = {"config": {"digest": IMAGE["amd64"]}}

    assemble(records, inspect=registry.inspect, run=copy_as_is)
    assert registry.commands and registry.commands[0][-1] == f"ghcr.io/acme/sglang@{DIGEST['amd64']}"

    def copy_other(cmd):
        for i, arg in enumerate(cmd):
            if arg == "--tag":
                registry.refs[cmd[i + 1]] = {"config": {"digest": IMAGE["arm64"]}}

    registry = Registry(records)
    with pytest.raises(VerificationError, match="not the verified"):
        assemble(records, inspect=registry.inspect, run=copy_other)


def test_partial_release_only_when_asked() -> None:
    plans = plan_manifests([record(arch="amd64")], allow_partial=True)
    assert plans[0].sources == [f"ghcr.io/acme/vllm@{DIGEST['amd64']}"]


def test_dirty_revision_has_no_pinned_tag() -> None:
    recs = [record(arch="amd64", revision=REV + "-dirty"), record(arch="arm64", revision=REV + "-dirty")]
    plan = plan_manifests(recs)[0]
    assert plan.pinned is None and plan.tags[0] == f"ghcr.io/acme/vllm:{VV}-bakery{__version__}"


def test_assemble_cli_reads_record_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    for rec in (record(arch="amd64"), record(arch="arm64")):
        rec.write(tmp_path)
    registry = Registry([record(arch="amd64"), record(arch="arm64")])
    monkeypatch.setitem(release.assemble.__kwdefaults__, "inspect", registry.inspect)
    monkeypatch.setitem(release.assemble.__kwdefaults__, "run", registry.run)
    assert release.main(["assemble", str(tmp_path), "--dry-run"]) == 0
    assert registry.commands == []
    (tmp_path / "broken.json").write_text("{")
    assert release.main(["assemble", str(tmp_path)]) == 2


# ---- the matrix ---------------------------------------------------------------------------------


def test_matrix_has_one_native_job_per_target() -> None:
    include = matrix(available_engines(), local=False)["include"]
    expected = {(name, p, line.cuda if line else None) for name in available_engines()
                for line in (load_engine(name).base.cuda_variants or (None,)) for p in load_engine(name).base.platforms}
    assert {(m["engine"], m["platform"], m.get("cuda")) for m in include} == expected
    for entry in include:
        line = load_engine(entry["engine"]).base.cuda_variant(entry.get("cuda"))
        part = f"-cu{line.cuda.replace('.', '')}" if line is not None and not line.default else ""
        assert entry["target"] == f"{entry['engine']}{part}-{entry['platform'].split('/')[1]}"
        assert entry["runner"] == ("ubuntu-24.04-arm" if entry["platform"] == "linux/arm64" else "ubuntu-24.04")


def test_matrix_cli_prints_json(capsys) -> None:
    assert release.main(["matrix", "--engine", "vllm", "--local"]) == 0
    include = json.loads(capsys.readouterr().out)["include"]
    assert [m["engine"] for m in include] == ["vllm"] * len(load_engine("vllm").base.cuda_variants)


# ---- the docker manifest path, rehearsal, and what both tools must agree on -----------------------


def test_both_tools_get_the_same_tags_and_sources() -> None:
    plan = plan_manifests([record(arch="amd64"), record(arch="arm64")])[0]
    imagetools = plan.command()
    manifest = plan.manifest_commands()
    creates = [c for c in manifest if c[:3] == ["docker", "manifest", "create"]]
    pushes = [c for c in manifest if c[:3] == ["docker", "manifest", "push"]]
    assert [c[3] for c in creates] == plan.tags == [imagetools[i + 1] for i, a in enumerate(imagetools) if a == "--tag"]
    assert all(c[4:] == plan.sources for c in creates)
    assert imagetools[-len(plan.sources):] == plan.sources
    assert pushes == [["docker", "manifest", "push", "--purge", tag] for tag in plan.tags]
    assert not any("--insecure" in c for c in manifest), "a remote registry is never reached over plain HTTP"


@pytest.mark.parametrize(("repository", "insecure"), [
    ("127.0.0.1:5000/acme/vllm", True), ("localhost:5000/acme/vllm", True), ("localhost/acme/vllm", True),
    ("127.1.2.3/acme/vllm", True), ("128.0.0.1:5000/acme/vllm", False),
    ("ghcr.io/acme/vllm", False), ("registry.example:5000/acme/vllm", False), ("acme/vllm", False),
])
def test_only_a_loopback_registry_is_reached_insecurely(repository: str, insecure: bool) -> None:
    recs = [record(arch=a, repository=repository) for a in ("amd64", "arm64")]
    commands = plan_manifests(recs)[0].manifest_commands()
    assert all(("--insecure" in c) == insecure for c in commands)


def test_an_index_with_the_right_digests_on_the_wrong_platforms_fails() -> None:
    records = [record(arch="amd64"), record(arch="arm64")]
    registry = Registry(records)

    def swapped(cmd):  # every tag gets one index, listing amd64's digest as arm64 and the reverse
        registry.run(cmd)
        entries = registry.refs[cmd[cmd.index("--tag") + 1]]["manifests"]
        entries[0]["platform"], entries[1]["platform"] = entries[1]["platform"], entries[0]["platform"]

    with pytest.raises(VerificationError, match="not the verified"):
        assemble(records, inspect=registry.inspect, run=swapped)


def test_a_moved_platform_tag_is_refused_before_anything_is_created() -> None:
    records = [record(arch="amd64"), record(arch="arm64")]
    registry = Registry(records)
    registry.refs[records[1].pushed_ref] = {"config": {"digest": "sha256:" + "f" * 64}}
    with pytest.raises(VerificationError, match=r"x-arm64 no longer holds the verified .*moved after the gate ran"):
        assemble(records, inspect=registry.inspect, run=registry.run)
    assert registry.commands == []


def test_rehearsal_takes_local_records_only_and_tags_them_local() -> None:
    local = [record(arch=a, variant="local") for a in ("amd64", "arm64")]
    with pytest.raises(InputError, match="only production images are released"):
        plan_manifests(local)
    with pytest.raises(InputError, match="this release takes local builds only"):
        plan_manifests([record(arch="amd64"), record(arch="arm64")], variant="local")
    plan = plan_manifests(local, variant="local")[0]
    cuda = load_engine("vllm").base.cuda_variant(None).cuda  # the default line: plain tags, then its own
    assert plan.tags == [f"ghcr.io/acme/vllm:{VV}-bakery{__version__}-gabc1234-local",
                         f"ghcr.io/acme/vllm:{VV}-bakery{__version__}-local", f"ghcr.io/acme/vllm:{VV}-local",
                         f"ghcr.io/acme/vllm:{VV}-bakery{__version__}-gabc1234-cuda{cuda}-local",
                         f"ghcr.io/acme/vllm:{VV}-bakery{__version__}-cuda{cuda}-local",
                         f"ghcr.io/acme/vllm:{VV}-cuda{cuda}-local"]
    assert plan.pinned == plan.tags[0]


def test_assemble_cli_refuses_an_unknown_tool(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        release.main(["assemble", "--tool", "crane", "x.json"])
    assert exc.value.code == 2


def test_rehearsal_lets_verify_push_a_local_build(tmp_path: Path, calls: list[str]) -> None:
    (tmp_path / "w").mkdir()
    local = write_bake_file(vllm_plan(local=True, repository="127.0.0.1:5000/acme"),
                            tmp_path / "l" / "docker-bake.json", wheelhouse=lambda p: tmp_path / "w", quiet=True)
    arch = host_platform().split("/")[1]
    rec = verify_target(local, f"vllm-{arch}", records=tmp_path / "r", push=True, rehearsal=True,
                        gate=lambda *a, **k: GateResult(passed=True, ran=1))
    tag = f"127.0.0.1:5000/acme/vllm:{VV}-bakery{__version__}-gabc1234-local-{arch}"
    assert calls == [f"tag {[tag]}", f"push {[tag]}"]
    assert (rec.variant, rec.pushed_ref, rec.digest) == ("local", tag, DIGEST["amd64"])


# ---- push failures ------------------------------------------------------------------------------


@pytest.mark.parametrize(("ref", "registry"), [
    ("127.0.0.1:5000/acme/vllm:x", "127.0.0.1:5000"), ("localhost/acme/vllm:x", "localhost"),
    ("ghcr.io/acme/vllm:x", "ghcr.io"), ("acme/vllm:x", "docker.io"), ("vllm:x", "docker.io"),
])
def test_registry_of_follows_dockers_reference_rules(ref: str, registry: str) -> None:
    assert registry_of(ref) == registry


@pytest.mark.parametrize(("error", "reason"), [
    ('Get "http://127.0.0.1:9/v2/": dial tcp 127.0.0.1:9: connect: connection refused', "is unreachable"),
    ("no basic auth credentials", "authentication required (docker login 127.0.0.1:9)"),
    ("denied: requested access to the resource is denied", "denied the push"),
    ('error parsing HTTP 405 response body: "Method not allowed\\n"', "HTTP 405: is it read-only?"),
    ("blob upload unknown", "the push failed"),
])
def test_a_push_failure_is_one_line_naming_the_registry_and_reason(error: str, reason: str) -> None:
    message = str(docker_push.push_failure("127.0.0.1:9/acme/vllm:x", error + "\nsecond line"))
    assert message.startswith("push to registry 127.0.0.1:9 failed: ") and reason in message
    assert "\n" not in message and message.endswith("127.0.0.1:9/acme/vllm:x was not pushed")
    assert docker_push.push_failure("x:1", error).exit_code == 1
