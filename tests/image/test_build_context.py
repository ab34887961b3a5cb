"""An untracked file planted in worker/ reaches neither the build context nor the image.

A real build on the vLLM stand-in base (issue 12: `COPY worker/` used to bake a stray worker/.env).
The image's /opt/bakery/worker must hold exactly the tracked files the context lists, and the
byte-code of its Python modules.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import PurePosixPath

import docker.errors
import pytest

from bakery.bases import make as bases
from bakery.build.builder import build_args, context_dir
from bakery.docker.build import build
from bakery.host.wheelhouse import wheelhouse
from bakery.recipe.render import RenderOptions, context_files, render, write_context
from bakery.spec.engine_spec import REPO_ROOT, load_engine

FAKE_SECRET = b"HF_TOKEN=hf_FakeTokenPlantedInTheWorkerDir42"


@pytest.fixture
def planted_env():
    """worker/.env (or a uniquely named sibling if a developer has a real one), removed afterwards."""
    path = REPO_ROOT / "worker" / ".env"
    if path.exists():
        path = REPO_ROOT / "worker" / f".env.planted-{os.getpid()}"
    path.write_bytes(FAKE_SECRET + b"\n")
    try:
        yield path
    finally:
        path.unlink()


def test_untracked_file_is_absent_from_context_and_image(docker_client, planted_env) -> None:
    spec = load_engine("vllm")
    bases.ensure_base("debian")
    rendered = render(spec, RenderOptions(base_image=bases.ensure_base("vllm-standin")))
    suite = os.environ.get("BAKERY_SUITE_TAG", "suite")
    context = write_context(rendered, context_dir(f"hygiene-{suite}"), wheelhouse())
    name = planted_env.name
    assert not (context / "worker" / name).exists()
    assert all(FAKE_SECRET not in p.read_bytes() for p in context.rglob("*") if p.is_file())

    image_id = build(context, lambda _m: None, buildargs=build_args()).image_id
    container = docker_client.containers.create(image_id, command=["true"])
    try:
        with pytest.raises(docker.errors.NotFound):
            container.get_archive(f"/opt/bakery/worker/{name}")
        stream, _ = container.get_archive("/opt/bakery/worker")
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            members = [m for m in tar.getmembers() if m.isfile()]
            assert all(FAKE_SECRET not in tar.extractfile(m).read() for m in members)
            names = [m.name.removeprefix("worker/") for m in members]
            # The byte-code the worker-build stage compiled: one file per module of the context, nothing else.
            compiled = sorted(name for name in names if "/__pycache__/" in f"/{name}")
            in_image = sorted(name for name in names if name not in compiled)
    finally:
        container.remove(force=True)
        docker_client.images.remove(image_id, force=True)
    expected = sorted(p.removeprefix("worker/") for p in context_files() if p.startswith("worker/"))
    assert in_image == expected
    # <dir>/__pycache__/<module>.cpython-3XY.pyc -> <dir>/<module>.py
    sources = {str(PurePosixPath(name).parent.parent / PurePosixPath(name).name.split(".")[0]) + ".py"
               for name in compiled}
    assert compiled and all(name.endswith(".pyc") for name in compiled), compiled
    assert sources == {name for name in expected if name.endswith(".py")}, sorted(sources ^ set(expected))
