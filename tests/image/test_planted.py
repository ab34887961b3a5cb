"""The gate can fail: defects planted in a rendered Dockerfile are each caught, by a named check.

Built on the vLLM stand-in base (the fastest engine to boot); every build reuses the cached worker
layers, so each defect costs one cheap rebuild plus one gate run.
"""

from __future__ import annotations

import os

import pytest

from bakery import bases
from bakery.builder import build_args, build_context, context_dir
from bakery.render import RenderOptions, render, write_context
from bakery.spec import load_engine
from bakery.verify import run_gate
from bakery.wheelhouse import wheelhouse

pytestmark = pytest.mark.planted

ENGINE = "vllm"


def _drop_env(name: str):
    def plant(dockerfile: str) -> str:
        lines = dockerfile.split("\n")
        index = next(i for i, line in enumerate(lines) if f"{name}=" in line)
        line = lines[index]
        if line.startswith("ENV "):  # first of a continued ENV: keep the instruction, drop the pair
            lines[index + 1] = "ENV " + lines[index + 1].strip()
        elif not line.rstrip().endswith("\\"):  # last pair: end the instruction on the line before
            lines[index - 1] = lines[index - 1].rstrip().removesuffix("\\").rstrip()
        del lines[index]
        return "\n".join(lines)
    return plant


# defect name -> (how to plant it, the checks that must catch it)
DEFECTS = {
    "no BACKEND": (_drop_env("BACKEND"), {"test_baked_env_is_exact", "test_backend_resolves_to_worker"}),
    "wrong MODEL_LOG": (lambda d: d.replace("/var/log/portal/vllm.log", "/var/log/portal/wrong.log"),
                        {"test_baked_env_is_exact"}),
    "no EXPOSE": (lambda d: d.replace("\nEXPOSE 3000\n", "\n"), {"test_worker_port_exposed"}),
    "missing worker": (lambda d: d.replace("COPY worker/ /opt/bakery/worker/\n", ""),
                       {"test_backend_resolves_to_worker", "test_worker_listens_on_3000"}),
    "engine not on 18000": (lambda d: d.replace('"--port","18000"', '"--port","18001"'),
                            {"test_engine_listens_on_18000", "test_worker_ready_benchmark_written"}),
}


@pytest.fixture(scope="module")
def pristine(docker_client):
    spec = load_engine(ENGINE)
    bases.ensure_base("debian")
    return render(spec, RenderOptions(base_image=bases.ensure_base(spec.base.local)))


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_planted_defect_is_caught(defect: str, pristine, monkeypatch: pytest.MonkeyPatch, docker_client) -> None:
    plant, catchers = DEFECTS[defect]
    planted = plant(pristine.dockerfile)
    assert planted != pristine.dockerfile, f"the defect {defect!r} was not planted"
    context = write_context(pristine, context_dir(f"planted-{ENGINE}"), wheelhouse())
    (context / "Dockerfile").write_text(planted)
    image_id = build_context(context, lambda _m: None, build_args()).image_id
    # A broken worker never gets ready: a short bound keeps each defect's gate run quick.
    monkeypatch.setenv("BAKERY_GATE_READY_TIMEOUT", os.environ.get("BAKERY_PLANTED_READY_TIMEOUT", "40"))
    try:
        gate = run_gate(image_id, ENGINE, variant="local", quiet=True)
    finally:
        docker_client.images.remove(image_id, force=True)
    assert not gate.passed, f"the gate passed an image with {defect!r}"
    failed = {name.split("[")[0] for name in gate.failed}
    assert catchers <= failed, f"{defect!r}: expected {sorted(catchers)} to fail, failed: {sorted(failed)}"


def test_pristine_image_passes_the_same_gate(pristine) -> None:
    # The control: without a defect the very same path passes, so the failures above are the defects'.
    context = write_context(pristine, context_dir(f"planted-{ENGINE}"), wheelhouse())
    image_id = build_context(context, lambda _m: None, build_args()).image_id
    gate = run_gate(image_id, ENGINE, variant="local", quiet=True)
    assert gate.passed, f"failed: {gate.failed}\n{gate.output[-3000:]}"
