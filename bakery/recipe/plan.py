"""The build plan: what one engine's build is, decided once from its spec and the typed options.

build.py's flags become `BuildOptions` (bakery.cli, the only module that sees argparse);
`make_plan(spec, options, facts)` turns each spec into a frozen `BuildPlan`: the base (ref, variant,
where the choice came from), the platforms, the release tags, the render options and what to do.
Everything after reads the plan: the pipeline builds, gates, tags and pushes it (bakery.build.pipeline),
the bake file writes one target per platform of it (bakery.release.bakefile), and the release re-makes it
from a bake target to know the tags it may publish (bakery.release).

Nothing here needs Docker: a local base is named from the catalogue (bakery.spec.base_catalogue), and
made, if need be, by whoever builds the plan.
"""

from __future__ import annotations

import platform as host
from dataclasses import dataclass, replace
from pathlib import Path

from bakery.errors import InputError
from bakery.model.manifest import BakedModel, bake
from bakery.model.source import find_model
from bakery.recipe.build_facts import BuildFacts
from bakery.recipe.render import RenderOptions
from bakery.recipe.tags import candidate_tag, check_repository, image_repository, platform_tag, release_tags
from bakery.spec.cuda import CudaVariant
from bakery.spec.engine_spec import EngineSpec

_MACHINES = {"x86_64": "linux/amd64", "amd64": "linux/amd64", "aarch64": "linux/arm64", "arm64": "linux/arm64"}


def host_platform() -> str:
    """The Docker platform of this machine: the only one its local bases exist for."""
    machine = host.machine().lower()
    if machine not in _MACHINES:
        raise InputError(f"this machine's architecture {machine!r} has no local bases (amd64 and arm64 do)")
    return _MACHINES[machine]


@dataclass(frozen=True)
class BuildOptions:
    """The choices that are not in the spec (build.py's flags, typed)."""

    local: bool = False  # build on the base made on this machine (spec base.local)
    base_image: str | None = None  # build on this image instead (wins over `local`)
    base_model: str | None = None  # the model `base_image` serves (its model variable's value), if known
    repository: str = "bakery"  # the tags' repository prefix, e.g. ghcr.io/acme
    templates_dir: Path | None = None  # a team's templates, searched before the repository's
    images_dir: Path | None = None  # where the specs were read from (the gate reads the spec again)
    verify: bool = True  # run the gate (only a verified image gets release tags)
    push: bool = False  # after a pass, push the release tags
    model: Path | None = None  # a model file or directory to bake into the image's own layer (--model)
    cuda: str | None = None  # the CUDA line (spec base.cuda_lines) to build; None: the default line (--cuda)


@dataclass(frozen=True)
class BaseChoice:
    """The image a build starts FROM, which kind of base it is, and where that choice was made."""

    ref: str
    variant: str  # production | local | custom (bakery.recipe.tags.VARIANTS)
    source: str  # the spec key or flag that chose it, for messages
    local: str | None = None  # the catalogue name of a base made here (bakery.bases), else None
    model: str | None = None  # a custom base: the model it serves (--base-model), so the gate can serve it

    cuda: CudaVariant | None = None  # the CUDA line the image is of (its floor is baked); None: no CUDA lines

    def render_options(self, templates_dir: Path | None, model: BakedModel | None = None) -> RenderOptions:
        """The render options for a Dockerfile FROM this base (with `model` baked, if any)."""
        return RenderOptions(base_image=self.ref, base_image_source=self.source, templates_dir=templates_dir,
                             model=model, cuda=self.cuda.cuda if self.cuda else None)


def baked_model(spec: EngineSpec, options: BuildOptions) -> BakedModel | None:
    """The model `options` bake into `spec`'s image, checked and hashed (bakery.model); None without --model."""
    return bake(find_model(options.model, spec)) if options.model is not None else None


def cuda_line(spec: EngineSpec, cuda: str | None) -> CudaVariant | None:
    """The CUDA line `cuda` names (None: the default one; None for an engine without lines); InputError
    naming the lines the spec has otherwise."""
    try:
        return spec.base.cuda_variant(cuda)
    except ValueError as exc:
        raise InputError(f"--cuda {cuda}: {spec.spec_path}: base.cuda_lines: {exc}") from None


def choose_base(spec: EngineSpec, options: BuildOptions) -> BaseChoice:
    """The base `options` choose for `spec`; InputError (naming the spec key) for a missing local base.

    Every path (render, bake file, build) chooses here, so each names a bad base.local the same way. The
    CUDA line's floor is baked whatever the base: a local or custom build of a line is that line's image.
    """
    line = cuda_line(spec, options.cuda)
    base = _choose_base(spec, options, line)
    return replace(base, cuda=line)


def _choose_base(spec: EngineSpec, options: BuildOptions, line: CudaVariant | None) -> BaseChoice:
    if options.base_image is not None:
        return BaseChoice(options.base_image, "custom", "--base-image", model=options.base_model)
    if options.local:
        from bakery.spec.base_catalogue import BASES  # the catalogue only: choosing a base needs no Docker

        where = f"{spec.spec_path}: base.local"
        if not spec.base.local:
            raise InputError(f"{where} is not set, so --local has no base to use")
        if spec.base.local not in BASES:
            raise InputError(f"{where}: unknown local base {spec.base.local!r}; choose one of {', '.join(BASES)}")
        return BaseChoice(BASES[spec.base.local].ref, "local", f"{where} ({spec.base.local!r})", spec.base.local)
    if line is not None and not line.default:
        index = next(i for i, item in enumerate(spec.base.cuda_lines) if item.cuda == line.cuda)
        return BaseChoice(line.image, "production", f"{spec.spec_path}: base.cuda_lines.{index}.image")
    return BaseChoice(spec.base.image, "production", f"{spec.spec_path}: base.image")


def platforms_for(spec: EngineSpec, base: BaseChoice) -> tuple[str, ...]:
    """The platforms a build on `base` is for: a production base's are the spec's; a base made or
    loaded here exists for this machine's platform only."""
    return tuple(spec.base.platforms) if base.variant == "production" else (host_platform(),)


@dataclass(frozen=True)
class BuildPlan:
    """One engine's build, decided: what it starts from, for which platforms, what it is tagged, what to do."""

    spec: EngineSpec
    base: BaseChoice
    platforms: tuple[str, ...]  # a production base: the spec's; a local or custom one: this machine's
    repository: str  # the tags' repository prefix (checked)
    facts: BuildFacts  # the commit and created time its labels and tags name
    tags: tuple[str, ...]  # the release tags a verified image gets, most specific first
    render: RenderOptions
    verify: bool
    push: bool
    images_dir: Path | None = None
    model: BakedModel | None = None  # baked into its own layer (--model); its variant is in every tag

    @property
    def model_variant(self) -> str | None:
        """`model-<name>-<digest12>` when a model is baked, else None."""
        return self.model.tag_variant if self.model is not None else None

    @property
    def cuda(self) -> CudaVariant | None:
        """The CUDA line this image is of (None: an engine without CUDA lines)."""
        return self.base.cuda

    @property
    def variant(self) -> str:
        """production, local or custom: which kind of base (it goes into every tag but production's)."""
        return self.base.variant

    @property
    def image_repository(self) -> str:
        """`<repository>/<engine>`: where every tag of this plan's image lives."""
        return image_repository(self.spec, self.repository)

    def platform_tag(self, platform: str) -> str:
        """The tag one platform's verified image is pushed under before a multi-platform release."""
        return platform_tag(self.spec, platform, repository=self.repository, variant=self.variant,
                            revision=self.facts.revision, model=self.model_variant, cuda=self.cuda)

    def candidate_tag(self, platform: str) -> str:
        """The one tag a not-yet-verified build of `platform` carries (bake targets)."""
        return candidate_tag(self.spec, platform, repository=self.repository, variant=self.variant,
                             revision=self.facts.revision, model=self.model_variant, cuda=self.cuda)


def make_plan(spec: EngineSpec, options: BuildOptions, facts: BuildFacts,
              model: BakedModel | None = None) -> BuildPlan:
    """The one way a BuildPlan is made: from the spec, the options and this run's checkout facts (and the
    model options.model names, checked and hashed here unless the caller did it already)."""
    base = choose_base(spec, options)
    repository = check_repository(options.repository)
    if model is None:
        model = baked_model(spec, options)
    variant = model.tag_variant if model is not None else None
    return BuildPlan(
        spec=spec, base=base, platforms=platforms_for(spec, base), repository=repository, facts=facts,
        tags=tuple(release_tags(spec, repository=repository, variant=base.variant, revision=facts.revision,
                                model=variant, cuda=base.cuda)),
        render=base.render_options(options.templates_dir, model), verify=options.verify, push=options.push,
        images_dir=options.images_dir, model=model,
    )


def every_line(spec: EngineSpec, options: BuildOptions, facts: BuildFacts) -> list[BuildPlan]:
    """One plan per CUDA line of `spec` (the default first), or the one plan of an engine without lines:
    what a bake file and the release matrix hold. `options.cuda`, when set, keeps only that line."""
    if options.cuda is not None or not spec.base.cuda_variants:
        return [make_plan(spec, options, facts)]
    return [make_plan(spec, replace(options, cuda=line.cuda), facts) for line in spec.base.cuda_variants]
