"""`python -m bakery.release sbom`: the SBOM a release publishes is the one the gate checked.

One real image (the vLLM stand-in on its local base, built as the suite builds it: tag
bakery-test/sglang:$BAKERY_SUITE_TAG) has its /opt/bakery/sbom.cdx.json written out by the release's
own command. The same file is then read inside a container of that image, as the gate's
test_sbom_lists_exactly_the_worker_venv reads it, with the gate's own check run on it: the bytes are
the same, and it lists exactly the worker venv's distributions. Planted images (made with `docker
import`, never built) have no SBOM, or one that is not CycloneDX JSON: each is refused with one
line and exit 1, and no file is written.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

import bakery.release.ci as release
from bakery.release.ci import VerifiedRecord
from bakery.release.sbom import INSTALLED_PROBE, SBOM_PATH, sbom_mismatches
from bakery.spec.engine_spec import load_engine
from tests.image.conftest import build_local_image
from tests.image.launch import WORKER_PYTHON
from tests.image.real_registry import planted_images

ENGINE = "sglang"  # a stand-in: the quickest image to build

# Run with the venv's Python (-I, as the gate does): the SBOM file's bytes (base64) and the venv's
# distributions, in one JSON line.
GATE_VIEW = f"""
import base64, json, subprocess, sys
sbom = base64.b64encode(open({SBOM_PATH!r}, "rb").read()).decode()
installed = subprocess.run([sys.executable, "-I", "-c", {INSTALLED_PROBE!r}], capture_output=True, text=True,
                           check=True).stdout
print(json.dumps({{"sbom": sbom, "installed": json.loads(installed)}}))
"""


@pytest.fixture(scope="module")
def engine_image(docker_client: docker.DockerClient) -> str:
    return build_local_image(load_engine(ENGINE))


@pytest.fixture(scope="module")
def gate_view(engine_image: str, docker_client: docker.DockerClient) -> dict:
    """What the gate's SBOM check reads in a container of the image: the file and the installed set."""
    out = docker_client.containers.run(engine_image, entrypoint=[WORKER_PYTHON], command=["-I", "-c", GATE_VIEW],
                                       network_disabled=True, remove=True, stdout=True, stderr=False)
    view = json.loads(out.decode().strip().splitlines()[-1])
    return {"sbom": base64.b64decode(view["sbom"]), "installed": view["installed"]}


def sbom_cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, list[str]]:
    """`python -m bakery.release sbom ARGS`: (exit code, its bakery.release error lines)."""
    code = release.main(["sbom", *args])
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if line.startswith("bakery.release:")]


def test_the_published_sbom_is_the_file_the_gate_checked(engine_image: str, gate_view: dict, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / f"{ENGINE}-amd64.cdx.json"
    code, errors = sbom_cli(capsys, "--image", engine_image, "--out", str(out))
    assert (code, errors) == (0, [])
    assert out.read_bytes() == gate_view["sbom"], "the same bytes as the file in the image"
    exported = json.loads(out.read_bytes())
    assert sbom_mismatches(exported, gate_view["installed"]) == [], "the gate's own check passes on it"
    names = {c["name"].lower() for c in exported["components"]}
    assert {"vastai", "aiohttp"} <= names, sorted(names)


def test_a_record_names_the_image_whose_sbom_is_written(engine_image: str, gate_view: dict, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    record = VerifiedRecord(engine=ENGINE, target=f"{ENGINE}-amd64", platform="linux/amd64", variant="local",
                            repository=f"bakery/{ENGINE}", revision="unknown", image_id=engine_image, checks_run=1)
    path = record.write(tmp_path / "records")
    out = tmp_path / "sbom" / f"{ENGINE}-amd64.cdx.json"
    code, errors = sbom_cli(capsys, "--record", str(path), "--out", str(out))
    assert (code, errors) == (0, [])
    assert out.read_bytes() == gate_view["sbom"]


@pytest.fixture
def planted(docker_client: docker.DockerClient) -> Iterator:
    """planted({path: content}) -> an imported image holding exactly those files; removed afterwards."""
    with planted_images(docker_client) as make:
        yield make


@pytest.mark.parametrize("files, message", [
    ({"/opt/bakery/other.txt": b"no sbom here"}, f"has no {SBOM_PATH}"),
    ({SBOM_PATH: b"this is not JSON"}, "not JSON"),
    ({SBOM_PATH: json.dumps({"bomFormat": "SPDX", "specVersion": "2.3"}).encode()}, "not a CycloneDX 1.x document"),
    ({SBOM_PATH: b"[1, 2, 3]"}, "not a CycloneDX document"),
    ({SBOM_PATH: json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.6", "components": [
        {"name": "vastai", "version": "1.9.1", "purl": "pkg:pypi/vastai@9.9.9"}]}).encode()},
     "disagrees with its purl"),
], ids=["no-sbom", "not-json", "spdx", "not-an-object", "purl-disagrees"])
def test_an_image_without_a_cyclonedx_sbom_is_refused(planted, files: dict[str, bytes], message: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    image_id = planted(files)
    out = tmp_path / "planted.cdx.json"
    code, errors = sbom_cli(capsys, "--image", image_id, "--out", str(out))
    assert code == 1
    assert len(errors) == 1 and message in errors[0], errors
    assert not out.exists(), "nothing is written for a refused image"


def test_an_image_the_engine_does_not_have_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                        docker_client: docker.DockerClient) -> None:
    code, errors = sbom_cli(capsys, "--image", "bakery-test/no-such-image:never", "--out", str(tmp_path / "x.json"))
    assert code == 2 and len(errors) == 1 and "is not on the Docker engine" in errors[0], errors
