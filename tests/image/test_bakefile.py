"""Each bake target, built exactly as the bake file defines it, yields an image that passes the gate.

This machine has no buildx (Docker 20.10, classic builder), so the target is built through the
Docker SDK from the file's own values: context, dockerfile, args, tags, labels (its platform is this
machine's, which the file says). Where buildx exists, `docker buildx bake --print` must accept the file.
Only local-base targets can build here (no registry); vLLM's stand-in is the default, the fastest.
BAKERY_BAKE_TEST_ENGINES="llama sglang vllm" builds the others too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bakery.bases import make as bases
from bakery.build.verify import run_gate
from bakery.docker.build import build
from bakery.recipe.build_facts import BuildFacts
from bakery.recipe.plan import BuildOptions, host_platform, make_plan
from bakery.release.bakefile import engine_of, load_bake_file, write_bake_file
from bakery.release.ci import VerifiedRecord, verify_target
from bakery.spec.engine_spec import available_engines, load_engine

REPOSITORY = "bakery-test-bake"  # tags of this test only, removed afterwards
ENGINES = os.environ.get("BAKERY_BAKE_TEST_ENGINES", "vllm").split()


@pytest.fixture(scope="module")
def bake_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A --local bake file for every engine (all targets are written; the chosen ones are built)."""
    path = tmp_path_factory.mktemp("bake") / "docker-bake.json"
    options, facts = BuildOptions(local=True, repository=REPOSITORY), BuildFacts.of_checkout()
    return write_bake_file([make_plan(load_engine(name), options, facts) for name in available_engines()], path,
                           quiet=True)


def test_every_engine_has_a_target_for_this_machine(bake_file: Path) -> None:
    bake = load_bake_file(bake_file)
    arch = host_platform().split("/")[1]
    assert sorted(bake["target"]) == [f"{name}-{arch}" for name in available_engines()]
    for name, target in bake["target"].items():
        context = bake_file.parent / target["context"]
        assert (context / target["dockerfile"]).is_file() and any((context / "wheels").glob("pip-*.whl"))
        assert target["platforms"] == [host_platform()], name


def test_buildx_accepts_the_file_where_it_exists(bake_file: Path) -> None:
    docker = shutil.which("docker")
    if not docker or subprocess.run([docker, "buildx", "version"], capture_output=True, check=False).returncode:
        pytest.skip("docker buildx is not installed here (GitHub's runners have it; images.yml runs --print)")
    proc = subprocess.run([docker, "buildx", "bake", "-f", bake_file.name, "--print"], cwd=bake_file.parent,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("engine_name", ENGINES)
def test_target_built_as_defined_passes_the_gate(engine_name: str, bake_file: Path, docker_client,
                                                 tmp_path: Path) -> None:
    bake = load_bake_file(bake_file)
    target_name = f"{engine_name}-{host_platform().split('/')[1]}"
    target = bake["target"][target_name]
    spec = load_engine(engine_of(target_name))
    bases.ensure_base("debian")
    bases.ensure_base(spec.base.local)
    built = build(bake_file.parent / target["context"], lambda _m: None, buildargs=target["args"],
                  tag=target["tags"][0], labels=target["labels"], dockerfile=target["dockerfile"])
    try:
        for extra in target["tags"][1:]:
            repo, _, tag = extra.rpartition(":")
            docker_client.images.get(built.image_id).tag(repo, tag)
        image = docker_client.images.get(built.image_id)
        assert set(target["tags"]) <= set(image.tags)
        labels = image.labels
        assert {k: labels.get(k) for k in target["labels"]} == target["labels"], "the file's labels"
        assert labels["org.opencontainers.image.revision"] == target["args"]["BAKERY_REVISION"]
        assert labels["org.opencontainers.image.created"] == target["args"]["BAKERY_CREATED"]
        assert f"{image.attrs['Os']}/{image.attrs['Architecture']}" == target["platforms"][0]

        gate = run_gate(built.image_id, spec.name, variant="local", quiet=True)
        assert gate.passed, f"failed: {gate.failed}\n{gate.output[-3000:]}"

        # The CI step after the build: record the verified image and give it its (local) release tags.
        record = verify_target(bake_file, target_name, records=tmp_path / "records", gate=lambda *_a, **_k: gate)
        assert record.image_id == built.image_id and record.checks_run == gate.ran
        assert VerifiedRecord.read(tmp_path / "records" / f"{target_name}.json") == record
        assert set(record.tags) <= set(docker_client.images.get(built.image_id).tags)
    finally:
        for ref in docker_client.images.get(built.image_id).tags:
            if ref.startswith(f"{REPOSITORY}/"):
                docker_client.images.remove(ref)
