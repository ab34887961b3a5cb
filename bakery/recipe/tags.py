"""The tag scheme: computed from the spec, the bakery version, the base variant, the commit and the platform.

For engine `llama` at engine version `b11434`, bakery 0.1.0, commit abc1234, repository `bakery`:

| tag | moves when | use it to |
|---|---|---|
| `bakery/llama:b11434-bakery0.1.0-gabc1234` | never (one commit's build) | pin an exact build |
| `bakery/llama:b11434-bakery0.1.0` | a rebuild of the same versions | pin engine + bakery versions |
| `bakery/llama:b11434` | a new bakery release | follow bakery fixes for one engine version |
| `bakery/llama:latest` | any release | try things out (production base only) |
| `bakery/llama:b11434-bakery0.1.0-gabc1234-arm64` | never | pin one architecture's verified image |

An image built on another base than the spec's production one gets the variant in every tag
(`-local` for this machine's bases, `-custom` for --base-image) and never `latest`, so a stand-in
build can never be mistaken for a production one. An image with a baked model (build.py --model) carries
`-model-<name>-<digest12>` in every tag too, and never `latest`, so it is never taken for the plain
engine image. A build from a dirty tree or outside git has no
commit tag (its revision label says `-dirty` / `unknown`).

Release tags go only to an image that passed the gate (bakery.build.publish). Before that, a build made
from a bake file carries one **candidate** tag (`bakery/llama:candidate-b11434-bakery0.1.0-gabc1234-amd64`)
that no release tag ever equals, so an unverified image can never be mistaken for a release.
The strongest pin is the digest (`bakery/llama@sha256:...`), which `build.py --push` prints.

An engine with CUDA lines (spec `base.cuda_lines`) gets one image per line, and every tag of a line's
image carries `-cuda<major.minor>` (`bakery/vllm:v0.33.0-cuda12.9`, `...-bakery0.1.0-gabc1234-cuda12.9`);
the default line's image also gets the unsuffixed tags above (and `latest`), so a template that names no
CUDA line keeps getting the engine's default one. An engine without CUDA lines is tagged as above.
"""

from __future__ import annotations

import re

from bakery import __version__
from bakery.errors import InputError
from bakery.spec.cuda import CudaVariant
from bakery.spec.engine_spec import EngineSpec

VARIANTS = ("production", "local", "custom")
# A repository prefix: an optional registry host[:port], then lower-case path components.
_REPOSITORY = re.compile(
    r"^(?:(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+|[A-Za-z0-9-]+(?=:))(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$"
)
_ARCH = {"linux/amd64": "amd64", "linux/arm64": "arm64"}


def _clean(text: str) -> str:
    # A Docker tag: [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text).lstrip(".-")[:128]


def check_repository(repository: str) -> str:
    """Return the repository prefix without a trailing '/'; InputError when Docker would refuse it."""
    repo = repository.rstrip("/")
    if not _REPOSITORY.match(repo):
        raise InputError(f"--repository {repository!r} is not a valid image repository prefix: use lower-case "
                         "path components, optionally after a registry host (e.g. ghcr.io/acme)")
    return repo


def image_repository(spec: EngineSpec, repository: str = "bakery") -> str:
    """`<repository>/<engine>`: where every tag of this engine's image lives."""
    return f"{check_repository(repository)}/{spec.name}"


def arch(platform: str) -> str:
    """The short architecture of a Docker platform (`linux/arm64` → `arm64`)."""
    if platform not in _ARCH:
        raise InputError(f"unsupported platform {platform!r}: use {' or '.join(_ARCH)}")
    return _ARCH[platform]


def has_commit(revision: str) -> bool:
    """True when `revision` is a clean commit, so its tags include the commit tag (never moved)."""
    return bool(revision) and revision != "unknown" and not revision.endswith("-dirty")


def _check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}")
    return "" if variant == "production" else f"-{variant}"


def _tag_set(spec: EngineSpec, revision: str, suffix: str) -> list[str]:
    """The commit, versions and version tags with `suffix`, most specific first."""
    versions = f"{spec.version}-bakery{__version__}"
    tags = [f"{versions}-g{revision[:7]}{suffix}"] if has_commit(revision) else []
    return [*tags, f"{versions}{suffix}", f"{spec.version}{suffix}"]


def release_tags(spec: EngineSpec, *, repository: str = "bakery", variant: str = "production",
                 revision: str = "unknown", model: str | None = None, cuda: CudaVariant | None = None) -> list[str]:
    """All release tags for one verified image, most specific first; `model` is a baked model's tag
    variant (bakery.model.manifest.BakedModel.tag_variant), which every tag then carries; `cuda` the CUDA
    line the image is of (every tag carries -cuda<version>; the default line's also gets the plain tags)."""
    suffix = _check_variant(variant) + (f"-{model}" if model else "")
    repo = image_repository(spec, repository)
    # The default line's plain tags come first: its platform, candidate and commit tags stay as they were
    # before the engine had CUDA lines, and every other line's are told apart by their suffix.
    tags = _tag_set(spec, revision, suffix) if cuda is None or cuda.default else []
    if cuda is not None:
        tags += _tag_set(spec, revision, f"-{cuda.tag_suffix}{suffix}")
    if variant == "production" and not model and (cuda is None or cuda.default):
        tags.append("latest")
    return [f"{repo}:{_clean(tag)}" for tag in tags]


def platform_tag(spec: EngineSpec, platform: str, *, repository: str = "bakery", variant: str = "production",
                 revision: str = "unknown", model: str | None = None, cuda: CudaVariant | None = None) -> str:
    """The per-platform tag of one verified single-platform image: the most specific release tag + `-<arch>`.

    A multi-arch release pushes each platform's verified image under this tag, then assembles the
    release tags as a manifest list of exactly those digests.
    """
    most_specific = release_tags(spec, repository=repository, variant=variant, revision=revision, model=model,
                                 cuda=cuda)[0]
    return f"{most_specific}-{arch(platform)}"


def candidate_tag(spec: EngineSpec, platform: str, *, repository: str = "bakery", variant: str = "production",
                  revision: str = "unknown", model: str | None = None, cuda: CudaVariant | None = None) -> str:
    """The one tag a not-yet-verified build carries (bake files tag with it; never a release tag)."""
    most_specific = release_tags(spec, repository=repository, variant=variant, revision=revision, model=model,
                                 cuda=cuda)[0]
    repo, _, tag = most_specific.rpartition(":")
    return f"{repo}:{_clean(f'candidate-{tag}-{arch(platform)}')}"


def repository_prefix(repository: str, spec: EngineSpec) -> str:
    """The prefix an image repository (`<prefix>/<engine>`, image_repository's form) was made from;
    InputError when it is not this engine's."""
    prefix, slash, engine = repository.rpartition("/")
    if not slash or engine != spec.name:
        raise InputError(f"{repository!r} is not a repository of engine {spec.name!r} (<prefix>/{spec.name})")
    return check_repository(prefix)


def candidate_prefix(ref: str, spec: EngineSpec) -> str:
    """The repository prefix a candidate tag of `spec` (candidate_tag's form) was made with."""
    repository, _, tag = ref.rpartition(":")
    if not tag.startswith("candidate-"):
        raise InputError(f"{ref!r} is not a candidate tag (<prefix>/{spec.name}:candidate-...)")
    return repository_prefix(repository, spec)


def is_release_tag(ref: str) -> bool:
    """False for candidate tags: the one check a publisher needs before moving a tag."""
    return not ref.rpartition(":")[2].startswith("candidate-")
