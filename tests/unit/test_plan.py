"""bakery.recipe.plan: one BuildPlan per engine, made once from the spec, the typed options and the run's facts.

No Docker here. The pipeline, the bake file and the release read the plan; these checks pin what it
decides (base, variant, platforms, tags, render options) and that a bake target's plan is made again
from the file exactly, or refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bakery import __version__
from bakery.errors import InputError
from bakery.recipe.build_facts import BuildFacts
from bakery.recipe.plan import BuildOptions, choose_base, host_platform, make_plan
from bakery.recipe.render import render
from bakery.recipe.tags import candidate_prefix, release_tags, repository_prefix
from bakery.release.bakefile import read_target, write_bake_file
from bakery.spec.base_catalogue import BASES
from bakery.spec.engine_spec import load_engine
from bakery.spec.image_ref import name_and_tag

REV = "abc1234def5678900000000000000000000000000"
FACTS = BuildFacts(revision=REV, created="2026-01-02T03:04:05Z")


@pytest.fixture
def spec():
    return load_engine("vllm")


def test_production_plan(spec) -> None:
    plan = make_plan(spec, BuildOptions(repository="ghcr.io/acme/"), FACTS)
    assert (plan.base.ref, plan.variant, plan.base.local) == (spec.base.image, "production", None)
    assert plan.base.source == f"{spec.spec_path}: base.image"
    assert plan.platforms == tuple(spec.base.platforms)
    assert plan.repository == "ghcr.io/acme" and plan.image_repository == "ghcr.io/acme/vllm"
    default = spec.base.cuda_variant(None)
    assert plan.cuda == default and default is not None and default.default
    assert plan.tags == tuple(release_tags(spec, repository="ghcr.io/acme", variant="production", revision=REV,
                                           cuda=default))
    assert plan.tags[-1] == "ghcr.io/acme/vllm:latest"
    # The default line keeps the plain tags first, and gets its -cuda<version> ones too.
    plain = release_tags(spec, repository="ghcr.io/acme", variant="production", revision=REV)
    assert plan.tags[:3] == tuple(plain[:3]) and f"ghcr.io/acme/vllm:{spec.version}-cuda{default.cuda}" in plan.tags
    assert plan.platform_tag("linux/arm64") == f"{plan.tags[0]}-arm64"
    candidate = f"ghcr.io/acme/vllm:candidate-{spec.version}-bakery{__version__}-gabc1234-amd64"
    assert plan.candidate_tag("linux/amd64") == candidate
    assert (plan.verify, plan.push, plan.facts.build_args()) == (True, False, {
        "BAKERY_REVISION": REV, "BAKERY_CREATED": "2026-01-02T03:04:05Z"})
    # The plan renders what --render-only renders (the spec's own base when none is chosen).
    assert render(spec, plan.render).dockerfile == render(spec).dockerfile


def test_each_cuda_line_plans_its_own_base_tags_and_floor(spec) -> None:
    for line in spec.base.cuda_variants:
        plan = make_plan(spec, BuildOptions(cuda=line.cuda), FACTS)
        assert plan.cuda == line and plan.base.ref == line.image
        assert plan.render.cuda == line.cuda and plan.render.base_image == line.image
        suffixed = [t for t in plan.tags if t.endswith(f"-cuda{line.cuda}")]
        assert suffixed and (set(plan.tags) == set(suffixed)) != line.default  # only the default has plain tags
        assert ("bakery/vllm:latest" in plan.tags) == line.default
        rendered = render(spec, plan.render)
        assert rendered.baked_env["BAKERY_CUDA_MIN_DRIVER"] == str(line.min_driver)
        assert rendered.labels["ai.bakery.cuda.version"] == line.cuda
        local = make_plan(spec, BuildOptions(cuda=line.cuda, local=True), FACTS)
        assert local.cuda == line and all(t.endswith(f"-cuda{line.cuda}-local") for t in local.tags
                                          if f"cuda{line.cuda}" in t)
    with pytest.raises(InputError, match=r"--cuda 9\.9: images/vllm\.yaml: base\.cuda_lines: CUDA 9\.9: not a line"):
        make_plan(spec, BuildOptions(cuda="9.9"), FACTS)
    assert len({make_plan(spec, BuildOptions(cuda=line.cuda), FACTS).candidate_tag("linux/amd64")
                for line in spec.base.cuda_variants}) == len(spec.base.cuda_variants)


def test_local_and_custom_plans(spec) -> None:
    local = make_plan(spec, BuildOptions(local=True, verify=False, push=True), FACTS)
    assert (local.base.ref, local.variant, local.base.local) == (BASES[spec.base.local].ref, "local",
                                                                 spec.base.local)
    assert local.platforms == (host_platform(),) and all(t.endswith("-local") for t in local.tags)
    assert (local.verify, local.push) == (False, True)
    # --base-image wins over --local, and says so in messages.
    custom = make_plan(spec, BuildOptions(local=True, base_image="example/base:1"), FACTS)
    assert (custom.base.ref, custom.variant, custom.base.source, custom.base.local) == (
        "example/base:1", "custom", "--base-image", None)
    assert custom.render.base_image == "example/base:1" and "latest" not in " ".join(custom.tags)


def test_bad_choices_are_one_line(spec) -> None:
    nolocal = spec.model_copy(update={"base": spec.base.model_copy(update={"local": None})})
    with pytest.raises(InputError, match=r"base\.local is not set, so --local has no base to use"):
        choose_base(nolocal, BuildOptions(local=True))
    unknown = spec.model_copy(update={"base": spec.base.model_copy(update={"local": "nope"})})
    with pytest.raises(InputError, match="unknown local base 'nope'; choose one of debian"):
        choose_base(unknown, BuildOptions(local=True))
    with pytest.raises(InputError, match="--repository 'Acme'"):
        make_plan(spec, BuildOptions(repository="Acme"), FACTS)
    assert choose_base(nolocal, BuildOptions()).variant == "production"  # only --local needs base.local


def _bake(tmp_path: Path, spec, **options) -> Path:
    (tmp_path / "wheels").mkdir(exist_ok=True)
    return write_bake_file([make_plan(spec, BuildOptions(**options), FACTS)], tmp_path / "bake" / "docker-bake.json",
                           wheelhouse=lambda _platform: tmp_path / "wheels", quiet=True)


@pytest.mark.parametrize("options", [{"repository": "127.0.0.1:5000/acme"}, {"local": True},
                                     {"local": True, "repository": "localhost:5000/a/b"}])
def test_a_bake_target_gives_back_the_plan_it_was_written_from(tmp_path: Path, spec, options: dict) -> None:
    written = make_plan(spec, BuildOptions(**options), FACTS)
    bake_file = _bake(tmp_path, spec, **options)
    for platform in written.platforms:
        name = f"vllm-{platform.split('/')[1]}"
        target = read_target(bake_file, name)
        assert (target.name, target.platform) == (name, platform)
        assert target.plan.tags == written.tags and target.plan.facts == written.facts
        assert target.plan.repository == written.repository and target.plan.variant == written.variant


def test_a_bake_target_that_is_not_bakerys_is_refused(tmp_path: Path, spec) -> None:
    bake_file = _bake(tmp_path, spec, repository="ghcr.io/acme")
    data = json.loads(bake_file.read_text())
    data["target"]["vllm-amd64"]["args"]["BAKERY_REVISION"] = "f" * 40  # tag and args disagree
    bake_file.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"target 'vllm-amd64' is tagged .*but its plan gives"):
        read_target(bake_file, "vllm-amd64")
    data["target"]["vllm-amd64"]["tags"] = ["ghcr.io/acme/llama:candidate-x"]
    bake_file.write_text(json.dumps(data))
    with pytest.raises(InputError, match="is not a repository of engine 'vllm'"):
        read_target(bake_file, "vllm-amd64")
    with pytest.raises(InputError, match="no target 'nope-amd64'"):
        read_target(bake_file, "nope-amd64")


def test_tags_read_their_own_prefixes_back(spec) -> None:
    assert repository_prefix("127.0.0.1:5000/acme/vllm", spec) == "127.0.0.1:5000/acme"
    assert candidate_prefix("bakery/vllm:candidate-v1-amd64", spec) == "bakery"
    with pytest.raises(InputError, match="not a candidate tag"):
        candidate_prefix("bakery/vllm:v1", spec)
    with pytest.raises(InputError, match="not a repository of engine 'vllm'"):
        repository_prefix("vllm", spec)


@pytest.mark.parametrize(("ref", "expected"), [
    ("localhost:5000/acme/vllm:1", ("localhost:5000/acme/vllm", "1")),
    ("localhost:5000/acme/vllm", ("localhost:5000/acme/vllm", "latest")),
    ("bakery-local/debian:bookworm", ("bakery-local/debian", "bookworm")),
    ("[::1]:5000/x:y", ("[::1]:5000/x", "y")),
])
def test_name_and_tag_follows_the_grammar(ref: str, expected: tuple[str, str]) -> None:
    assert name_and_tag(ref) == expected
