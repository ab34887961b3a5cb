"""`docker buildx bake` builds the bake file `build.py --bake-file` writes, and its images pass the gate.

For real, on this machine's Docker engine: buildx (Debian 13's docker-buildx, from scripts/setup-host)
with its default `docker` driver builds the local targets in the engine's own BuildKit, which sees
the locally made bases (a docker-container builder would need the moby/buildkit image, which cannot
be pulled here). Each loaded image must carry exactly the candidate tag and labels its plan gives
(bakery.release.bakefile.read_target), bake's metadata must name that image, and
`bakery.release verify` (the release job's step after bake) must pass the real gate on it and
record it. A missing buildx fails under CI=true. The SGLang stand-in is the default
(the fastest to gate); BAKERY_BAKE_TEST_ENGINES="sglang llama" builds llama.cpp too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bakery.bases import make as bases
from bakery.paths import REPO_ROOT
from bakery.recipe.plan import host_platform
from bakery.release.bakefile import load_bake_file, read_target, target_name
from bakery.release.ci import VerifiedRecord, verify_target
from bakery.spec.engine_spec import available_engines, load_engine
from tests.host_tools import require_buildx
from tests.image.real_registry import remove_tags

REPOSITORY = "bakery-test-bake"  # tags of this test only, removed afterwards
ENGINES = os.environ.get("BAKERY_BAKE_TEST_ENGINES", "sglang").split()
ARCH = host_platform().split("/")[1]


def build_py_bake_file(directory: Path, engines: list[str]) -> Path:
    """`python build.py --engine E... --local --bake-file DIR/docker-bake.json`: the file users build."""
    path = directory / "docker-bake.json"
    args = [arg for name in engines for arg in ("--engine", name)]
    proc = subprocess.run([sys.executable, "build.py", *args, "--local", "--repository", REPOSITORY,
                           "--bake-file", str(path)], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return path


@pytest.fixture(scope="module")
def every_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A --local bake file of every engine (only its layout is checked)."""
    return build_py_bake_file(tmp_path_factory.mktemp("bake-all"), available_engines())


def test_every_engine_has_a_target_for_this_machine(every_target: Path) -> None:
    bake = load_bake_file(every_target)
    specs = [load_engine(name) for name in available_engines()]  # one target per engine and CUDA line
    assert sorted(bake["target"]) == sorted(target_name(spec, host_platform(), line) for spec in specs
                                            for line in (spec.base.cuda_variants or (None,)))
    assert {f"{spec.name}-{ARCH}" for spec in specs} <= set(bake["target"])  # the default line keeps its name
    for name, target in bake["target"].items():
        context = every_target.parent / target["context"]
        assert (context / target["dockerfile"]).is_file() and any((context / "wheels").glob("pip-*.whl"))
        assert target["platforms"] == [host_platform()], name


def test_buildx_accepts_the_file(every_target: Path) -> None:
    proc = subprocess.run([*require_buildx(), "bake", "-f", every_target.name, "--print"],
                          cwd=every_target.parent, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads(proc.stdout)["target"]) == set(load_bake_file(every_target)["target"])


@pytest.fixture(scope="module")
def baked(tmp_path_factory: pytest.TempPathFactory, docker_client) -> dict:
    """`docker buildx bake --load --metadata-file M T...` for real, from the bake file's directory."""
    buildx = require_buildx()
    builder = subprocess.run([*buildx, "inspect"], capture_output=True, text=True, check=False).stdout
    assert "Driver:" in builder and "docker\n" in builder.split("Driver:", 1)[1][:40], builder
    for name in ENGINES:
        bases.ensure_base("debian")
        bases.ensure_base(load_engine(name).base.local)
    path = build_py_bake_file(tmp_path_factory.mktemp("bake"), ENGINES)
    targets = [f"{name}-{ARCH}" for name in ENGINES]
    metadata = path.parent / "metadata.json"
    proc = subprocess.run([*buildx, "bake", "--load", "--progress", "plain", "--metadata-file", metadata.name,
                           *targets], cwd=path.parent, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    yield {"path": path, "targets": targets, "metadata": metadata}
    remove_tags(docker_client, f"{REPOSITORY}/")


@pytest.mark.parametrize("engine_name", ENGINES)
def test_baked_image_carries_its_plan_and_passes_the_gate(engine_name: str, baked: dict, docker_client,
                                                          tmp_path: Path) -> None:
    target_name = f"{engine_name}-{ARCH}"
    planned = read_target(baked["path"], target_name)  # the plan the target was written from
    target = load_bake_file(baked["path"])["target"][target_name]
    image = docker_client.images.get(planned.tag)
    assert target["tags"] == [planned.tag] and image.tags == [planned.tag], "only the candidate tag"
    # The engine's BuildKit writes the image into the engine's store: its id is the config digest.
    assert json.loads(baked["metadata"].read_text())[target_name]["containerimage.digest"] == image.id
    labels = image.labels
    assert {k: labels.get(k) for k in target["labels"]} == target["labels"], "the file's labels"
    assert labels["ai.bakery.variant"] == planned.plan.variant == "local"
    assert labels["ai.bakery.engine"] == engine_name
    assert labels["org.opencontainers.image.revision"] == target["args"]["BAKERY_REVISION"]
    assert labels["org.opencontainers.image.created"] == target["args"]["BAKERY_CREATED"]
    assert f"{image.attrs['Os']}/{image.attrs['Architecture']}" == planned.platform == host_platform()

    # The release job's step after bake: the real gate (bakery.build.verify.run_gate) on THAT image,
    # then its (local) release tags and a record.
    record = verify_target(baked["path"], target_name, records=tmp_path / "records")
    assert record.image_id == image.id and record.checks_run > 0
    assert VerifiedRecord.read(tmp_path / "records" / f"{target_name}.json") == record
    assert sorted(docker_client.images.get(image.id).tags) == sorted([planned.tag, *planned.plan.tags])
