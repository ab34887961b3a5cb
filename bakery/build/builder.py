"""Build a rendered engine image on the local Docker engine, offline, with progress; returns the image id.

The image is built untagged: only the verification gate's pass gives it a release tag (tags.py),
so a failed build or a failed gate can never leave a half-tagged image behind. The build itself
(and the reading of its output) is the Docker layer's, bakery.docker.build.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bakery.docker.build import BuildResult, build
from bakery.host.relay import relay_program
from bakery.host.wheelhouse import wheelhouse
from bakery.paths import cache_path
from bakery.recipe.build_facts import BuildFacts
from bakery.recipe.render import Rendered, write_context

Progress = Callable[[str], None]

def build_args() -> dict[str, str]:
    """This checkout's build arguments now (the revision and created labels); a run that plans its
    builds takes them from its BuildPlan instead, so its tags and labels name one commit."""
    return BuildFacts.of_checkout().build_args()


def context_dir(name: str) -> Path:
    """Where the build context for `name` is laid out."""
    return cache_path("contexts", name)


def build_image(rendered: Rendered, progress: Progress, platform: str = "linux/amd64",
                buildargs: dict[str, str] | None = None) -> BuildResult:
    """Lay out the context for `rendered` (with `platform`'s wheels) and build it, untagged;
    `buildargs` default to this checkout's (build_args())."""
    context = write_context(rendered, context_dir(rendered.spec.name), wheelhouse(platform),
                            relay_program(platform))
    return build(context, progress, buildargs=build_args() if buildargs is None else buildargs)
