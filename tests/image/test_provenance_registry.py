"""The provenance read-back (bakery.release.provenance.read_back) on what a real registry serves.

buildx is not on this machine, so its push is laid out by hand, as BuildKit's attestation-storage
document describes it: the image itself arrives by `docker push` of a real bakery image (the vLLM
stand-in, as the suite builds it), then an attestation manifest (one in-toto SLSA provenance layer
whose subject is that image's manifest) and an OCI index listing both are uploaded through the
distribution API to Debian's docker-registry. skopeo, which shares no code with bakery, reads them
back for read_back. Planted indexes (another image under the platform entry, no attestation) are
refused with one line.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import docker
import pytest
import requests

from bakery.errors import VerificationError
from bakery.recipe.plan import host_platform
from bakery.release.provenance import read_back
from bakery.spec.engine_spec import load_engine
from tests.image.conftest import build_local_image
from tests.image.real_registry import (
    RunningRegistry,
    push_as,
    remove_tags,
    running_registry,
    skopeo_raw,
    tiny_image,
)

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRegistry]:
    with running_registry(tmp_path_factory.mktemp("provenance-registry")) as running:
        yield running


def upload_blob(host: str, name: str, data: bytes) -> dict[str, Any]:
    """A monolithic blob upload (POST, then PUT with the digest); returns its descriptor fields."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    start = requests.post(f"http://{host}/v2/{name}/blobs/uploads/", timeout=10)
    start.raise_for_status()
    location = start.headers["Location"]
    if location.startswith("/"):
        location = f"http://{host}{location}"
    put = requests.put(location, params={"digest": digest}, data=data, timeout=10,
                       headers={"Content-Type": "application/octet-stream"})
    put.raise_for_status()
    return {"digest": digest, "size": len(data)}


def put_manifest(host: str, name: str, manifest: dict[str, Any]) -> str:
    """PUT a manifest or index by its digest; returns the digest."""
    data = json.dumps(manifest, indent=2).encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    answer = requests.put(f"http://{host}/v2/{name}/manifests/{digest}", data=data, timeout=10,
                          headers={"Content-Type": manifest["mediaType"]})
    answer.raise_for_status()
    return digest


def provenance_push(host: str, name: str, manifest_digest: str, *, platform: str, attest: bool = True) -> str:
    """Lay out what buildx pushes beside `manifest_digest`: its attestation manifest and the index."""
    os_name, _, arch = platform.partition("/")
    answer = requests.get(f"http://{host}/v2/{name}/manifests/{manifest_digest}", timeout=10,
                          headers={"Accept": DOCKER_MANIFEST})
    answer.raise_for_status()
    size = len(answer.content)  # an index descriptor records the manifest's own size
    manifests = [{"mediaType": DOCKER_MANIFEST, "digest": manifest_digest, "size": size,
                  "platform": {"architecture": arch, "os": os_name}}]
    if attest:
        statement = upload_blob(host, name, json.dumps({
            "_type": "https://in-toto.io/Statement/v0.1", "predicateType": "https://slsa.dev/provenance/v0.2",
            "subject": [{"name": f"pkg:docker/{host}/{name}", "digest": {"sha256": manifest_digest.split(":")[1]}}],
            "predicate": {"buildType": "https://mobyproject.org/buildkit@v1"}}).encode())
        config = upload_blob(host, name, b"{}")
        attestation = put_manifest(host, name, {
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.docker.attestation.config.v1+json", **config},
            "layers": [{"mediaType": "application/vnd.in-toto+json", **statement,
                        "annotations": {"in-toto.io/predicate-type": "https://slsa.dev/provenance/v0.2"}}]})
        manifests.append({"mediaType": OCI_MANIFEST, "digest": attestation, "platform": {"architecture": "unknown",
                                                                                          "os": "unknown"},
                          "annotations": {"vnd.docker.reference.digest": manifest_digest,
                                          "vnd.docker.reference.type": "attestation-manifest"}})
    return put_manifest(host, name, {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests})


def skopeo_inspect(ref: str) -> dict[str, Any] | None:
    found = skopeo_raw(ref)
    return None if found is None else found[0]


@pytest.fixture(scope="module")
def pushed(registry: RunningRegistry, docker_client: docker.DockerClient) -> Iterator[dict[str, str]]:
    """The suite's SGLang stand-in image pushed with docker, then its provenance index laid out beside it."""
    image_id = build_local_image(load_engine("sglang"))
    name = "acme/sglang"
    manifest = push_as(docker_client, image_id, f"{registry.host}/{name}:pushed")
    index = provenance_push(registry.host, name, manifest, platform=host_platform())
    yield {"image_id": image_id, "repository": f"{registry.host}/{name}", "manifest": manifest, "index": index,
           "name": name}
    remove_tags(docker_client, f"{registry.host}/")


def test_read_back_finds_the_verified_image_and_its_provenance(pushed: dict[str, str]) -> None:
    index, digest = skopeo_raw(f"{pushed['repository']}@{pushed['index']}")
    assert digest == pushed["index"]
    assert index["manifests"][1]["annotations"]["vnd.docker.reference.type"] == "attestation-manifest", \
        "the registry serves the index as it was pushed, annotations included"
    result = read_back(pushed["repository"], pushed["index"], platform=host_platform(), image_id=pushed["image_id"],
                       inspect=skopeo_inspect)
    assert result.manifest_digest == pushed["manifest"]
    assert result.config_digest == pushed["image_id"], "the docker-pushed manifest's config is the image id"
    assert result.predicate_types == ("https://slsa.dev/provenance/v0.2",)


def test_an_index_of_another_image_is_refused(pushed: dict[str, str], registry: RunningRegistry,
                                              docker_client: docker.DockerClient) -> None:
    planted = tiny_image(docker_client, "built by something else")
    try:
        manifest = push_as(docker_client, planted, f"{registry.host}/{pushed['name']}:planted")
        index = provenance_push(registry.host, pushed["name"], manifest, platform=host_platform())
        with pytest.raises(VerificationError) as caught:
            read_back(pushed["repository"], index, platform=host_platform(), image_id=pushed["image_id"],
                      inspect=skopeo_inspect)
    finally:
        docker_client.images.remove(planted, force=True)
    assert str(caught.value) == (f"{pushed['repository']}@{manifest} holds config {planted}, not the verified image "
                                 f"{pushed['image_id']}: the builder did not push the image the gate ran; "
                                 "refusing to record it")


def test_an_index_without_provenance_is_refused(pushed: dict[str, str], registry: RunningRegistry) -> None:
    index = provenance_push(registry.host, pushed["name"], pushed["manifest"], platform=host_platform(), attest=False)
    with pytest.raises(VerificationError, match="0 attestation manifests"):
        read_back(pushed["repository"], index, platform=host_platform(), image_id=pushed["image_id"],
                  inspect=skopeo_inspect)
