"""The tag scheme (bakery/recipe/tags.py, docs/tags.md): computed from the spec, tested as a table."""

from __future__ import annotations

import re

import pytest

from bakery import __version__
from bakery.errors import InputError
from bakery.recipe.tags import (
    arch,
    candidate_tag,
    check_repository,
    image_repository,
    is_release_tag,
    platform_tag,
    release_tags,
)
from bakery.spec.engine_spec import available_engines, load_engine

REV = "abc1234def5678900000000000000000000000000"
# The pinned engine version, read from the spec: a version bump (python -m bakery.upkeep.bump) keeps these true.
V = load_engine("llama").version
DOCKER_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


@pytest.fixture
def llama():
    return load_engine("llama")


def test_production_tags_most_specific_first(llama) -> None:
    assert release_tags(llama, repository="ghcr.io/acme", revision=REV) == [
        f"ghcr.io/acme/llama:{V}-bakery{__version__}-gabc1234",
        f"ghcr.io/acme/llama:{V}-bakery{__version__}",
        f"ghcr.io/acme/llama:{V}",
        "ghcr.io/acme/llama:latest",
    ]


@pytest.mark.parametrize("variant", ["local", "custom"])
def test_other_bases_carry_the_variant_everywhere_and_never_latest(llama, variant: str) -> None:
    tags = release_tags(llama, variant=variant, revision=REV)
    assert tags == [f"bakery/llama:{V}-bakery{__version__}-gabc1234-{variant}",
                    f"bakery/llama:{V}-bakery{__version__}-{variant}", f"bakery/llama:{V}-{variant}"]
    assert not any(t.endswith(":latest") for t in tags)


@pytest.mark.parametrize("revision", ["unknown", "", REV + "-dirty"])
def test_no_commit_tag_without_a_clean_commit(llama, revision: str) -> None:
    tags = release_tags(llama, revision=revision)
    assert not any("-g" in t.rpartition(":")[2] for t in tags), tags
    assert tags[0] == f"bakery/llama:{V}-bakery{__version__}"


def test_unknown_variant_is_refused(llama) -> None:
    with pytest.raises(ValueError, match="variant"):
        release_tags(llama, variant="staging")


@pytest.mark.parametrize("engine", available_engines())
def test_every_tag_of_every_engine_is_a_valid_docker_tag(engine: str) -> None:
    spec = load_engine(engine)
    for variant in ("production", "local", "custom"):
        tags = release_tags(spec, variant=variant, revision=REV)
        tags += [platform_tag(spec, p, variant=variant, revision=REV) for p in spec.base.platforms]
        tags += [candidate_tag(spec, p, variant=variant, revision=REV) for p in spec.base.platforms]
        for ref in tags:
            repo, _, tag = ref.rpartition(":")
            assert repo == f"bakery/{engine}"
            assert DOCKER_TAG.match(tag), ref
        assert len(set(tags)) == len(tags), "two kinds of tag collide"


def test_odd_versions_are_cleaned_into_valid_tags(llama) -> None:
    odd = llama.model_copy(update={"version": "1.2+cu121/rc 1"})
    tag = release_tags(odd, revision=REV)[0].rpartition(":")[2]
    assert DOCKER_TAG.match(tag)
    assert tag.startswith("1.2-cu121-rc-1-bakery")


def test_platform_tag_pins_one_architecture(llama) -> None:
    assert platform_tag(llama, "linux/arm64", repository="ghcr.io/acme", revision=REV) == \
        f"ghcr.io/acme/llama:{V}-bakery{__version__}-gabc1234-arm64"
    assert platform_tag(llama, "linux/amd64", variant="local", revision=REV).endswith("-gabc1234-local-amd64")


def test_candidate_tags_are_never_release_tags(llama) -> None:
    candidate = candidate_tag(llama, "linux/amd64", revision=REV)
    assert candidate == f"bakery/llama:candidate-{V}-bakery{__version__}-gabc1234-amd64"
    assert not is_release_tag(candidate)
    assert all(is_release_tag(t) for t in release_tags(llama, revision=REV))
    assert is_release_tag(platform_tag(llama, "linux/amd64", revision=REV))


def test_arch_names() -> None:
    assert arch("linux/amd64") == "amd64"
    assert arch("linux/arm64") == "arm64"
    with pytest.raises(InputError, match="unsupported platform"):
        arch("linux/s390x")


@pytest.mark.parametrize("good", ["bakery", "ghcr.io/acme", "ghcr.io/acme/", "localhost:5000/a/b",
                                  "registry.example.com:443/team/images", "docker.io/library", "a_b/c-d"])
def test_valid_repository_prefixes(good: str) -> None:
    assert check_repository(good) == good.rstrip("/")


@pytest.mark.parametrize("bad", ["", "Acme", "ghcr.io/Acme", "a b", "-x", "x//y", "ghcr.io/acme/UPPER"])
def test_invalid_repository_prefixes_are_input_errors(bad: str, llama) -> None:
    with pytest.raises(InputError, match="--repository"):
        check_repository(bad)
    with pytest.raises(InputError):
        release_tags(llama, repository=bad)


def test_image_repository(llama) -> None:
    assert image_repository(llama, "ghcr.io/acme/") == "ghcr.io/acme/llama"
