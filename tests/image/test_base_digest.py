"""`bakefile ci --pin-bases` resolves a base's digest through the real Docker engine and registry.

A tiny image is pushed to a real registry on 127.0.0.1 (Debian's docker-registry, started by
tests/image/real_registry.py); the digest bakery resolves for its tag must be the manifest digest that
registry holds as skopeo reads it, and the override pins the base to exactly that digest and labels the
image with it.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from bakery.docker.engine import registry_digest
from bakery.release.bakefile import BASE_DIGEST_LABEL, main
from tests.image.real_registry import running_registry, skopeo_raw


def tiny_image(client, ref: str) -> None:
    """Import a one-file image as `ref` (no pull: nothing can be pulled here)."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo("hello.txt")
        payload = b"bakery base digest test\n"
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    repository, _, tag = ref.rpartition(":")
    client.api.import_image_from_data(data.getvalue(), repository=repository, tag=tag)


def test_the_resolved_digest_is_the_one_the_registry_holds(docker_client, tmp_path: Path) -> None:
    with running_registry(tmp_path / "registry") as registry:
        ref = f"{registry.host}/bakery-test/base:1"
        tiny_image(docker_client, ref)
        try:
            for event in docker_client.api.push(ref.rpartition(":")[0], tag="1", stream=True, decode=True):
                assert "error" not in event, event
            held = skopeo_raw(ref)
            assert held is not None, f"the registry holds nothing at {ref}"
            stored = [held[1]]
            assert registry_digest(ref) == stored[0]
            # The override pins a bake target FROM that base to it, and labels the image with it.
            context = tmp_path / "contexts" / "demo-amd64"
            context.mkdir(parents=True)
            (context / "Dockerfile").write_text(f"FROM bakery-local/debian:bookworm AS tools\nFROM {ref}\n")
            bake = {"target": {"demo-amd64": {"context": "contexts/demo-amd64", "dockerfile": "Dockerfile"}}}
            (tmp_path / "docker-bake.json").write_text(json.dumps(bake))
            out = tmp_path / "ci.json"
            assert main(["ci", "--bake-file", str(tmp_path / "docker-bake.json"), "--target", "demo-amd64",
                         "--pin-bases", "--out", str(out)]) == 0
            entry = json.loads(out.read_text())["target"]["demo-amd64"]
            assert entry["contexts"] == {ref: f"docker-image://{ref}@{stored[0]}"}
            assert entry["labels"] == {BASE_DIGEST_LABEL: stored[0]}
        finally:
            docker_client.images.remove(ref, force=True)


def test_an_unknown_base_is_refused_in_one_line(docker_client, tmp_path: Path, capsys) -> None:
    with running_registry(tmp_path / "registry") as registry:
        context = tmp_path / "contexts" / "demo-amd64"
        context.mkdir(parents=True)
        (context / "Dockerfile").write_text(f"FROM {registry.host}/bakery-test/missing:1\n")
        bake = {"target": {"demo-amd64": {"context": "contexts/demo-amd64", "dockerfile": "Dockerfile"}}}
        (tmp_path / "docker-bake.json").write_text(json.dumps(bake))
        code = main(["ci", "--bake-file", str(tmp_path / "docker-bake.json"), "--target", "demo-amd64",
                     "--pin-bases", "--out", str(tmp_path / "ci.json")])
    err = capsys.readouterr().err
    assert code == 1 and "cannot resolve the digest of" in err and len(err.strip().splitlines()) == 1, err
