"""build.py --push publishes exactly what the gate verified, and nothing when the gate fails.

Both run the real pipeline (bakery.pipeline.run_engine, as build.py does) on the vLLM stand-in base:
one with a defect planted in the rendered Dockerfile, so the real gate fails; one that passes and
pushes to a registry on 127.0.0.1 (tests/image/registry.py), where the manifest that arrived is read
back and must hold the verified image id as its config.
"""

from __future__ import annotations

import dataclasses
import json

import docker.api.client
import pytest

import bakery.builder
import bakery.pipeline as pipeline
from bakery.artifacts import cache_dir
from bakery.cli import main, make_parser
from bakery.spec import load_engine
from tests.image.registry import Registry

ENGINE = "vllm"


@pytest.fixture(autouse=True)
def own_context_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    # Other builds on this machine lay out cache/contexts/<engine>: keep this test's apart.
    monkeypatch.setattr(bakery.builder, "context_dir", lambda name: cache_dir() / "contexts" / f"test-publish-{name}")


def _remove_tags(client, prefix: str) -> None:
    for image in client.images.list():
        for ref in image.tags:
            if ref.startswith(prefix):
                client.images.remove(ref)


def test_a_failed_gate_leaves_no_release_tag_and_never_pushes(monkeypatch: pytest.MonkeyPatch, docker_client) -> None:
    pushes: list[tuple] = []
    monkeypatch.setattr(docker.api.client.APIClient, "push",
                        lambda self, *args, **kwargs: pushes.append(args) or iter(()))
    real_render = pipeline.render

    def render_without_expose(spec, options=None):
        rendered = real_render(spec, options)
        planted = rendered.dockerfile.replace("\nEXPOSE 3000\n", "\n")
        assert planted != rendered.dockerfile, "the defect was not planted"
        return dataclasses.replace(rendered, dockerfile=planted)

    monkeypatch.setattr(pipeline, "render", render_without_expose)
    repository = "bakery-test-gatefail"
    args = make_parser().parse_args(["--engine", ENGINE, "--local", "--push", "--repository", repository,
                                     "--quiet"])
    summary = pipeline.run_engine(load_engine(ENGINE), args)
    try:
        assert summary["ok"] is False and summary["verified"] is False
        assert "test_worker_port_exposed" in {name.split("[")[0] for name in summary["failed_checks"]}
        assert summary["tags"] == [] and summary["pushed"] == []
        assert pushes == [], "an image whose gate failed reached docker push"
        tags = docker_client.images.get(summary["image_id"]).tags
        assert not [t for t in tags if t.startswith(f"{repository}/")], tags
    finally:
        _remove_tags(docker_client, f"{repository}/")
        docker_client.images.remove(summary["image_id"], force=True)


def test_push_publishes_the_verified_image_by_digest(docker_client, capsys: pytest.CaptureFixture) -> None:
    with Registry() as registry:
        repository = f"{registry.host}/bakery-test"
        try:
            code = main(["--engine", ENGINE, "--local", "--push", "--repository", repository, "--quiet", "--json"])
            out, err = capsys.readouterr()
            assert code == 0, err[-3000:]
            item = json.loads(out)["engines"][0]
            image_id = item["image_id"]
            assert item["verified"] is True and item["pushed"], item
            assert len(item["pushed"]) == len(item["tags"])
            for line in item["pushed"]:
                ref, _, digest = line.partition("@")
                assert ref in item["tags"] and digest.startswith("sha256:")
                assert f"pushed {line} (verified image {image_id})" in err, "--push prints the verified digest"
                name, _, tag = ref.removeprefix(f"{registry.host}/").rpartition(":")
                # What the registry holds under that tag is that digest, and its config IS the verified image.
                stored = registry.manifest(name, tag)
                assert stored["config"]["digest"] == image_id
                assert registry.manifest(name, digest) == stored
            assert {p["config"] for p in registry.pushed} == {image_id}
        finally:
            _remove_tags(docker_client, f"{registry.host}/")
