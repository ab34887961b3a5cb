"""build.py --push publishes exactly what the gate verified, to a real registry, and nothing else.

Every test runs build.py (bakery.cli.main, the real pipeline with the real gate) on the vLLM stand-in
base and pushes to Debian's docker-registry on 127.0.0.1 (tests/image/real_registry.py); what
arrived is read back with skopeo, which shares no code with bakery. The gate runs once per image id
(the same checkout rebuilds the same id from Docker's cache); a planted defect is a new image id,
so its gate runs for real and fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from collections.abc import Iterator
from pathlib import Path

import docker.errors
import pytest

import bakery.build.builder
import bakery.build.pipeline as pipeline
from bakery.build.publish import push_verified, tag_verified
from bakery.cli import main
from bakery.errors import VerificationError
from tests.image.readback import main as readback_main
from tests.image.real_registry import (
    RunningRegistry,
    free_port,
    gate_once,
    keep,
    own_context_dir,
    push_as,
    remove_tags,
    running_registry,
    skopeo_raw,
    skopeo_tags,
    tiny_image,
)

ENGINE = "sglang"


@pytest.fixture(autouse=True)
def own_context_and_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bakery.build.builder, "context_dir", own_context_dir())
    monkeypatch.setattr(pipeline, "run_gate", gate_once)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRegistry]:
    """One real registry for the module, with its own config and storage in a temporary folder."""
    with running_registry(tmp_path_factory.mktemp("registry")) as running:
        yield running


def build_py(*args: str) -> tuple[int, dict, str]:
    """Run build.py --engine ENGINE --local --quiet --json ARGS; returns (exit code, summary, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--engine", ENGINE, "--local", "--quiet", "--json", *args])
    return code, json.loads(out.getvalue()), err.getvalue()


@pytest.fixture(scope="module")
def published(registry: RunningRegistry, docker_client) -> Iterator[dict]:
    """build.py --push to the module's registry, once: its JSON summary item and its stderr."""
    repository = f"{registry.host}/acme"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bakery.build.builder, "context_dir", own_context_dir())
        mp.setattr(pipeline, "run_gate", gate_once)
        code, summary, err = build_py("--push", "--repository", repository)
    assert code == 0, err[-3000:]
    keep(docker_client, summary["engines"][0]["image_id"])
    yield {"item": summary["engines"][0], "err": err, "repository": f"{repository}/{ENGINE}"}
    remove_tags(docker_client, f"{registry.host}/")


def test_push_publishes_the_verified_image_by_digest(published: dict) -> None:
    item, repository = published["item"], published["repository"]
    image_id = item["image_id"]
    assert item["verified"] is True and item["checks_run"] > 0 and item["pushed"], item
    assert len(item["pushed"]) == len(item["tags"])
    for line in item["pushed"]:
        ref, _, digest = line.partition("@")
        assert ref in item["tags"] and digest.startswith("sha256:")
        assert f"pushed {line} (verified image {image_id})" in published["err"], "--push prints the verified digest"
        # skopeo's view: the tag holds exactly that digest, and its config IS the image the gate verified.
        at_tag = skopeo_raw(ref)
        assert at_tag is not None, f"{ref} is not in the registry"
        manifest, stored_digest = at_tag
        assert stored_digest == digest
        assert manifest["config"]["digest"] == image_id
        assert skopeo_raw(f"{repository}@{digest}") == at_tag
    # Nothing else was published: the registry's tags are exactly build.py's release tags.
    assert skopeo_tags(repository) == sorted(ref.rpartition(":")[2] for ref in item["tags"])


def test_a_failed_gate_leaves_no_release_tag_and_never_pushes(registry: RunningRegistry, docker_client,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    real_render = pipeline.render

    def render_without_expose(spec, options=None):
        rendered = real_render(spec, options)
        planted = rendered.dockerfile.replace("\nEXPOSE 3000\n", "\n")
        assert planted != rendered.dockerfile, "the defect was not planted"
        return dataclasses.replace(rendered, dockerfile=planted)

    monkeypatch.setattr(pipeline, "render", render_without_expose)
    monkeypatch.setattr(bakery.build.builder, "context_dir", own_context_dir("-planted"))
    repository = f"{registry.host}/gatefail"
    code, summary, err = build_py("--push", "--repository", repository)
    item = summary["engines"][0]
    try:
        assert code == 1, err[-3000:]
        assert item["ok"] is False and item["verified"] is False
        assert "test_worker_port_exposed" in {name.split("[")[0] for name in item["failed_checks"]}
        assert item["tags"] == [] and item["pushed"] == []
        assert skopeo_tags(f"{repository}/{ENGINE}") == [], "an image whose gate failed reached the registry"
        tags = docker_client.images.get(item["image_id"]).tags
        assert not [t for t in tags if t.startswith(f"{repository}/")], tags
    finally:
        remove_tags(docker_client, f"{repository}/")
        docker_client.images.remove(item["image_id"], force=True)


def test_a_tag_moved_after_the_gate_is_not_pushed(published: dict, registry: RunningRegistry, docker_client) -> None:
    image_id = published["item"]["image_id"]  # verified by the gate in `published`
    repository = f"{registry.host}/moved/{ENGINE}"
    first, second = f"{repository}:first", f"{repository}:second"
    tag_verified(image_id, [first, second], verified=True)
    planted = tiny_image(docker_client, "not what the gate verified")
    docker_client.images.get(planted).tag(repository, "second")  # someone moves a tag after the gate
    try:
        with pytest.raises(VerificationError, match=rf"{second} now points at {planted[:19]}, not the verified"):
            push_verified(image_id, [first, second], verified=True)
        assert skopeo_tags(repository) == ["first"]
        assert skopeo_raw(first)[0]["config"]["digest"] == image_id
    finally:
        remove_tags(docker_client, f"{repository}:")
        with contextlib.suppress(docker.errors.ImageNotFound):  # untagging may have removed it already
            docker_client.images.remove(planted, force=True)


@pytest.fixture
def refusing(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, RunningRegistry | None]]:
    """(kind, host, registry): one that refuses the push (read-only storage, or auth nobody has), or none."""
    kind = request.param
    if kind == "down":
        yield kind, f"127.0.0.1:{free_port()}", None  # a closed loopback port
        return
    with running_registry(tmp_path / kind, readonly=kind == "readonly", auth=kind == "auth") as running:
        yield kind, running.host, running


@pytest.mark.parametrize(("refusing", "reason"), [
    ("readonly", "the registry refused the upload (HTTP 405: is it read-only?)"),
    ("auth", "the registry refused the push: authentication required"),
    ("down", "the registry is unreachable"),
], indirect=["refusing"])
def test_a_refused_push_fails_with_one_line(refusing: tuple[str, str, RunningRegistry | None], reason: str,
                                            published: dict, docker_client) -> None:
    kind, host, running = refusing
    repository = f"{host}/acme"
    try:
        code, summary, err = build_py("--push", "--repository", repository)
        assert code == 1, err[-3000:]
        lines = err.strip().splitlines()
        assert len(lines) == 1, err  # --quiet: the one error line and nothing else, no traceback
        assert lines[0].startswith(f"build.py: push to registry {host} failed: {reason}"), lines[0]
        assert "was not pushed" in lines[0]
        assert summary == {"ok": False, "error": lines[0].removeprefix("build.py: "), "exit_code": 1}
        if running is not None:
            # Nothing reached the registry's storage (skopeo cannot list a registry that wants
            # credentials nobody has, so its storage directory is read too).
            assert running.repositories() == []
            if kind == "readonly":
                assert skopeo_tags(f"{repository}/{ENGINE}") == []
    finally:
        remove_tags(docker_client, f"{host}/")


def test_readback_matches_every_tag_with_a_verified_push(published: dict, registry: RunningRegistry,
                                                         tmp_path: Path, docker_client,
                                                         capsys: pytest.CaptureFixture) -> None:
    # tests.image.readback is how a registry no test started is checked after `build.py --push`.
    # Here: build.py pushes under its own prefix of the module's registry (the layers are there
    # already), readback passes; then one tag planted beside them is the one line it reports.
    host, summary_file = registry.host, tmp_path / "summary.json"
    try:
        code, summary, err = build_py("--push", "--repository", f"{host}/readback")
        assert code == 0, err[-3000:]
        summary_file.write_text(json.dumps(summary))
        assert readback_main([host, str(summary_file), "--prefix", "readback/"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert sorted(out) == sorted(f"ok   {line}: config {summary['engines'][0]['image_id']} = verified image"
                                     for line in summary["engines"][0]["pushed"])
        planted = tiny_image(docker_client, "beside the verified tags")
        digest = push_as(docker_client, planted, f"{host}/readback/{ENGINE}:planted")
        assert readback_main([host, str(summary_file), "--prefix", "readback/"]) == 1
        bad = [line for line in capsys.readouterr().out.splitlines() if line.startswith("BAD")]
        assert bad == [f"BAD  {host}/readback/{ENGINE}:planted@{digest}: no verified push of that ref at that "
                       f"digest (config {planted})"]
    finally:
        remove_tags(docker_client, f"{host}/readback/")
