"""Load and validate engine specs (`images/<engine>.yaml`) into typed `EngineSpec` records.

Validation is declarative (pydantic models); every failure becomes one `InputError` line of the form
`images/llama.yaml: bake.env.MODEL_LOG: must be an absolute path`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any

import yaml

# pydantic scans every installed distribution's entry points for plugins at import (~45 ms of a
# ~0.5 s render); bakery uses none. setdefault: a user who sets it keeps their choice.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from bakery.errors import InputError
from bakery.paths import IMAGES_DIR, REPO_ROOT
from bakery.spec import cuda, dockerfile_values
from bakery.spec.image_ref import ReferenceRefused, check_reference, explicit_tag
from bakery.spec.secrets import secret_reason, secret_value_reason

# Where the specs are when no directory is passed: build.py --images-dir hands it to the gate this way.
IMAGES_DIR_VAR = "BAKERY_IMAGES_DIR"

# The worker's log-grammar variables: lists of lines, baked as JSON arrays.
LIST_VARS = ("MODEL_LOAD_LOG_MSG", "MODEL_ERROR_LOG_MSGS", "MODEL_INFO_LOG_MSGS")
# Optional lines that mark the load's stages in the engine's log (the worker names the moment it reads
# each, for the time-to-ready split: docs/cold-start.md); lists too.
STAGE_VARS = ("BAKERY_LOAD_BEGIN_LOG_MSGS", "BAKERY_WEIGHTS_LOADED_LOG_MSGS")
LINE_LIST_VARS = (*LIST_VARS, *STAGE_VARS)
# The lines held to the engine's pinned source by bakery.upkeep.drift (and that upstream.lines may declare):
# the load and error lines the worker decides on, and the stage lines time to ready is split by.
DRIFT_VARS = ("MODEL_LOAD_LOG_MSG", "MODEL_ERROR_LOG_MSGS", *STAGE_VARS)
# What every engine must bake for the shared worker to resolve (docs/engines.md, "Upstream's worker").
REQUIRED_BAKE = ("BACKEND", "MODEL_LOG", *LIST_VARS, "MODEL_HEALTH_ENDPOINT")
# Other variables the worker reads; a MODEL_* name outside this set is most likely a typo.
KNOWN_MODEL_VARS = frozenset({*REQUIRED_BAKE, "MODEL_NAME", "MODEL_SERVER_URL"})
# Launch-time variables a template must set; baking them would pin one model into the image.
LAUNCH_ONLY = ("SERVERLESS",)
# Baked by bakery.recipe.render from `name` and `engine:`; a spec stating them again could only disagree.
BAKERY_OWN = ("BAKERY_ENGINE_CMD", "BAKERY_ENGINE_ARGS_VAR", "BAKERY_ENGINE_PROGRAM", "BAKERY_MODEL_VAR",
              cuda.VERSION_VAR, cuda.MIN_DRIVER_VAR)

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A template under templates/: path components that cannot climb out or hold blanks.
TEMPLATE_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_][A-Za-z0-9_.-]*)*\.j2"
VAR_TOKEN = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


def env_names(env: dict[str, str]) -> dict[str, str]:
    """`env` when every key is a variable name; else ValueError naming the first that is not."""
    for name in env:
        if not ENV_NAME.match(name):
            raise ValueError(f"env.{name}: not a valid environment variable name")
    return env


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LocalFailure(_Strict):
    """What makes the engine fail to load on its local base: another model value, extra variables, or both."""

    model: StrictStr | None = Field(default=None, description="a model value the engine cannot load")
    env: dict[StrictStr, StrictStr] = Field(default_factory=dict, description="variables set at launch")

    @model_validator(mode="after")
    def _something(self) -> LocalFailure:
        if self.model is None and not self.env:
            raise ValueError("set model (a model that cannot load) or env (variables that make loading fail)")
        env_names(self.env)
        return self


class LocalRoute(_Strict):
    """A route beyond the worker's default that the gate proves on the local base: a launch serving and
    benchmarking only this route (OPENAI_ROUTES, BENCHMARK_ROUTE) with `env` added must become ready and
    answer one signed request with `payload` through :3000."""

    route: StrictStr = Field(description="the worker route, e.g. /v1/embeddings (docs/routes.md)")
    env: dict[StrictStr, StrictStr] = Field(default_factory=dict, description="extra launch variables it needs")
    payload: dict[StrictStr, Any] = Field(description="the OpenAI body of the signed request")
    embedding_dimension: int | None = Field(
        default=None, gt=0, description="an embeddings answer: the length every returned vector must have"
    )

    @field_validator("route")
    @classmethod
    def _route(cls, value: str) -> str:
        if not re.fullmatch(r"/v1/[a-z0-9/_.-]+", value):
            raise ValueError(f"{value!r}: a worker route starts with /v1/ (docs/routes.md)")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        return env_names(value)


class LocalLongAnswer(_Strict):
    """A streamed chat answer that stays in flight for seconds on the local base: the gate's drain
    check stops the container while it streams, and the answer must still arrive whole."""

    env: dict[StrictStr, StrictStr] = Field(
        default_factory=dict, description="launch variables that make the answer long (a stand-in's token delay)")
    payload: dict[StrictStr, Any] = Field(
        default_factory=dict, description="fields added to the streamed chat request (max_tokens, ...)")
    tokens: int = Field(gt=0, description="the completion_tokens the answer's usage chunk must report")

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        return env_names(value)


class CudaLine(_Strict):
    """One CUDA line an engine publishes and this project carries: its CUDA version and its upstream base.

    The default line's base is base.image (stated once); every other line names its own, tag-pinned (CI
    resolves and records its digest at release, as for base.image).
    """

    cuda: StrictStr = Field(description="the line's CUDA version, major.minor (its driver floor: bakery/spec/cuda.py)")
    image: StrictStr | None = Field(default=None, description="this line's upstream base, name:tag (not the default)")
    default: StrictBool = Field(default=False, description="the line base.image is, named by the unsuffixed tags")

    @field_validator("cuda")
    @classmethod
    def _cuda(cls, value: str) -> str:
        cuda.min_driver(value)  # a version the driver table does not hold is refused here
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            check_reference(value)
        except ReferenceRefused as exc:
            raise ValueError(f"{value!r}: not a valid image reference: {exc}") from None
        if explicit_tag(value) is None:
            raise ValueError(f"{value!r}: pin the line's base by its upstream tag (name:tag); the digest is "
                             "recorded at release")
        return value

    @model_validator(mode="after")
    def _base(self) -> CudaLine:
        if self.default and self.image is not None:
            raise ValueError(f"image: the default line's base is base.image; remove image from line {self.cuda}")
        if not self.default and self.image is None:
            raise ValueError(f"image: missing: line {self.cuda} is not the default, so it needs its own upstream "
                             "base (name:tag), or mark it default: true")
        return self


class BaseImage(_Strict):
    """The production base image and where it runs."""

    image: StrictStr = Field(description="pinned production base image (name:tag@sha256:digest)")
    local: StrictStr | None = Field(
        default=None, description="local base from bakery.bases used when no registry is reachable"
    )
    platforms: list[StrictStr] = Field(default_factory=lambda: ["linux/amd64"], min_length=1)
    local_model: StrictStr | None = Field(
        default=None, description="the model the local base serves: what the gate sets as engine.model_var"
    )
    local_fail_load: list[LocalFailure] | None = Field(
        default=None, description="how the gate makes the engine fail to load on the local base (one way, or a list)"
    )
    local_env: dict[StrictStr, StrictStr] = Field(
        default_factory=dict,
        description="launch variables every gate launch on the local base sets (serving flags that base needs)",
    )
    local_shm_size: StrictStr | None = Field(
        default=None, description="the /dev/shm the gate gives the local base's containers (docker run --shm-size)"
    )
    local_launches: int | None = Field(
        default=None, gt=0,
        description="at most this many gate containers of the local base at once (a heavy engine); none: no bound",
    )
    local_route: LocalRoute | None = Field(
        default=None, description="a non-default route the gate proves on the local base (none: that check skips)"
    )
    local_long_answer: LocalLongAnswer | None = Field(
        default=None, description="a streamed answer in flight for seconds on the local base (the drain check)"
    )
    cuda_lines: list[CudaLine] = Field(
        default_factory=list,
        description="the CUDA lines this project carries, one marked default (its base is base.image); none: "
                    "the engine has no CUDA line (a CPU image) and is built once",
    )

    @field_validator("cuda_lines")
    @classmethod
    def _one_default(cls, lines: list[CudaLine]) -> list[CudaLine]:
        if not lines:
            return lines
        defaults = [line.cuda for line in lines if line.default]
        if len(defaults) != 1:
            found = f"{len(defaults)} are ({', '.join(defaults)})" if defaults else "none is"
            raise ValueError(f"exactly one line must be default: true (the one base.image is); {found}")
        seen: set[str] = set()
        for line in lines:
            if line.cuda in seen:
                raise ValueError(f"CUDA {line.cuda} is listed twice; keep one line per CUDA version")
            seen.add(line.cuda)
        return lines

    @property
    def cuda_variants(self) -> tuple[cuda.CudaVariant, ...]:
        """The CUDA lines resolved (base, floor), the default first; empty for an engine without CUDA lines."""
        resolved = [cuda.CudaVariant(line.cuda, line.image or self.image, line.default, cuda.min_driver(line.cuda))
                    for line in self.cuda_lines]
        return tuple(sorted(resolved, key=lambda v: not v.default))

    def cuda_variant(self, version: str | None) -> cuda.CudaVariant | None:
        """The CUDA line `version` names (None: the default line); None for an engine without CUDA lines.
        ValueError naming the lines there are when `version` is not one of them."""
        if not self.cuda_variants:
            if version is not None:
                raise ValueError(f"CUDA {version}: this engine has no CUDA lines (base.cuda_lines)")
            return None
        for item in self.cuda_variants:
            if (version is None and item.default) or item.cuda == version:
                return item
        raise ValueError(f"CUDA {version}: not a line of this engine; choose one of "
                         f"{', '.join(v.cuda for v in self.cuda_variants)}")

    @field_validator("image")
    @classmethod
    def _reference(cls, value: str) -> str:
        try:
            return check_reference(value)
        except ReferenceRefused as exc:
            raise ValueError(f"{value!r}: not a valid image reference: {exc}") from None

    @field_validator("local")
    @classmethod
    def _local_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[a-z][a-z0-9-]*", value):
            raise ValueError("must name a local base of bakery.bases (lower-case letters, digits, '-')")
        return value

    @field_validator("local_env")
    @classmethod
    def _local_env(cls, value: dict[str, str]) -> dict[str, str]:
        return env_names(value)

    @field_validator("local_fail_load", mode="before")
    @classmethod
    def _failures(cls, value: Any) -> Any:
        # One way is written as a mapping, several as a list of them (item N's errors name it as .N-1).
        if isinstance(value, dict):
            return [value]
        if isinstance(value, list) and not value:
            raise ValueError("an empty list: name at least one way loading fails, or leave the key out")
        return value

    @field_validator("local_shm_size")
    @classmethod
    def _shm_size(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[1-9][0-9]*[kmg]?", value):
            raise ValueError(f"{value!r}: a size as docker run --shm-size takes it (e.g. 512m, 1g)")
        return value

    @property
    def fail_loads(self) -> tuple[LocalFailure, ...]:
        """Every way local_fail_load names, in order (none when unset)."""
        return tuple(self.local_fail_load or ())

    @field_validator("platforms")
    @classmethod
    def _platforms(cls, value: list[str]) -> list[str]:
        for plat in value:
            if not re.fullmatch(r"linux/(amd64|arm64)", plat):
                raise ValueError(f"unsupported platform {plat!r}: use linux/amd64 or linux/arm64")
        return value

    @model_validator(mode="after")
    def _local_facts(self) -> BaseImage:
        if self.local is not None:
            for key in ("local_model", "local_fail_load", "local_long_answer"):
                if getattr(self, key) is None:
                    raise ValueError(f"{key}: required with base.local (the gate launches the local base with it)")
        return self


# The model formats `build.py --model` can bake (bakery.model.source reads each one).
MODEL_FORMATS = ("gguf", "safetensors")


class EngineLaunch(_Strict):
    """How the entry point starts the engine on 127.0.0.1:18000."""

    command: list[StrictStr] = Field(min_length=1)
    model_var: StrictStr
    args_var: StrictStr
    model_format: StrictStr | None = Field(
        default=None, description=f"the model format the engine serves, one of {', '.join(MODEL_FORMATS)}: what "
                                  "build.py --model may bake (none: --model is refused)")

    @field_validator("model_format")
    @classmethod
    def _model_format(cls, value: str | None) -> str | None:
        if value is not None and value not in MODEL_FORMATS:
            raise ValueError(f"{value!r}: choose one of {', '.join(MODEL_FORMATS)}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> EngineLaunch:
        for name in (self.model_var, self.args_var):
            if not ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
        tokens = {m.group(1) for arg in self.command if (m := VAR_TOKEN.match(arg))}
        if self.model_var not in tokens:
            raise ValueError(f"command must contain the token '${{{self.model_var}}}' for the model")
        for index, arg in enumerate(self.command):
            if "$" in arg and not VAR_TOKEN.match(arg):
                raise ValueError(f"command argument {arg!r}: only whole-argument ${{NAME}} tokens expand")
            if "\x00" in arg:
                raise ValueError(f"command[{index}]: contains a NUL byte, which no program argument can hold")
            if why := secret_value_reason(arg):
                raise ValueError(f"command[{index}]: {why}; {_SECRETS_HINT}")
        return self


BakeValue = StrictStr | list[StrictStr]


class Bake(_Strict):
    """What the image bakes: environment (in order) and exposed ports."""

    env: dict[StrictStr, BakeValue]
    expose: list[Annotated[StrictInt, Field(ge=1, le=65535)]] = Field(min_length=1)

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, Any]) -> dict[str, Any]:
        for name in REQUIRED_BAKE:
            if name not in env:
                raise ValueError(f"missing required variable {name}")
        for name, value in env.items():
            _check_env_item(name, value)
        return env

    @field_validator("expose")
    @classmethod
    def _worker_port(cls, ports: list[int]) -> list[int]:
        if 3000 not in ports:
            raise ValueError("must include 3000: the platform maps only exposed ports (VAST_TCP_PORT_3000)")
        return ports


# Who writes a log line when the engine itself does not (bakery.upkeep.drift skips these in the engine's source).
LINE_ORIGINS = ("bakery", "supervisord", "python", "uvicorn")
# The line bakery's entry point writes into MODEL_LOG when the engine's program exits (worker/boot/supervise.py).
EXIT_LINE = "INFO exited: {name}"


class LineSource(_Strict):
    """Where one baked log line is found: written by someone other than the engine, or in the engine's source
    (by a pattern, and/or only in the file that prints it)."""

    origin: StrictStr | None = Field(default=None, description=f"one of {', '.join(LINE_ORIGINS)}")
    pattern: StrictStr | None = Field(default=None, description="a regular expression found in the engine's source")
    file: StrictStr | None = Field(
        default=None, description="the source file that prints the line, as the end of its path (e.g. "
                                  "tools/server/server.cpp): the line counts only there"
    )
    why: StrictStr | None = None

    @model_validator(mode="after")
    def _one(self) -> LineSource:
        if (self.origin is None) == (self.pattern is None and self.file is None):
            raise ValueError("set either origin (who writes the line) or pattern and/or file (where the engine's "
                             "source holds it)")
        if self.file is not None and (not re.fullmatch(r"[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*", self.file)
                                      or ".." in self.file.split("/")):
            raise ValueError(f"file {self.file!r}: a relative path inside the source tree "
                             "(e.g. tools/server/server.cpp)")
        if self.origin is not None and self.origin not in LINE_ORIGINS:
            raise ValueError(f"origin {self.origin!r}: choose one of {', '.join(LINE_ORIGINS)}")
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"pattern {self.pattern!r}: not a regular expression: {exc}") from None
        return self


class ReleaseFeed(_Strict):
    """Where the engine announces its releases, and how the spec spells one (python -m bakery.upkeep.bump)."""

    pypi: StrictStr | None = Field(default=None, description="the PyPI project whose releases are the engine's")
    registry: StrictStr | None = Field(
        default=None, description="an image repository (host/owner/name) whose tags announce the engine's builds"
    )
    tag: StrictStr | None = Field(default=None, description="with registry: a build's tag, e.g. server-b{release}")
    version: StrictStr = Field(default="{release}", description="how `version` spells a release, e.g. v{release}")

    @model_validator(mode="after")
    def _one_feed(self) -> ReleaseFeed:
        if (self.pypi is None) == (self.registry is None):
            raise ValueError("set exactly one of pypi (a PyPI project) or registry (an image repository)")
        if self.pypi is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.pypi):
            raise ValueError(f"pypi {self.pypi!r}: not a PyPI project name")
        if self.pypi is not None and self.tag is not None:
            raise ValueError("tag: only with registry (a PyPI release names no image tag)")
        if self.registry is not None:
            if not re.fullmatch(r"[a-z0-9.-]+(?::\d+)?(?:/[a-z0-9._-]+)+", self.registry):
                raise ValueError(f"registry {self.registry!r}: must be host/owner/name "
                                 "(e.g. ghcr.io/ggml-org/llama.cpp)")
            if self.tag is None or self.tag.count("{release}") != 1:
                raise ValueError("tag: with registry, the build's tag with {release} once (e.g. server-b{release})")
        if self.version.count("{release}") != 1:
            raise ValueError(f"version {self.version!r}: must hold {{release}} once (e.g. v{{release}})")
        return self


class Upstream(_Strict):
    """The engine's source at the pinned version, and how each baked line is found in it (bakery.upkeep.drift)."""

    repository: StrictStr | None = Field(
        default=None, description="GitHub owner/name; default: taken from `source` when it is a GitHub URL"
    )
    tag: StrictStr | None = Field(default=None, description="the git tag of the pinned release; default: version")
    lines: dict[StrictStr, LineSource] = Field(default_factory=dict)
    releases: ReleaseFeed | None = Field(default=None, description="the release feed bakery.upkeep.bump follows")

    @field_validator("repository")
    @classmethod
    def _repository(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*", value):
            raise ValueError(f"{value!r}: must be a GitHub owner/name")
        return value

    @field_validator("tag")
    @classmethod
    def _tag(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/+-]{0,127}", value):
            raise ValueError(f"{value!r}: not a git tag name")
        return value


class EngineSpec(_Strict):
    """One engine image: the validated content of `images/<name>.yaml`."""

    name: StrictStr
    description: StrictStr
    version: StrictStr = Field(description="engine version, used in tags and labels")
    source: StrictStr = Field(description="the engine's project URL (OCI source label)")
    base: BaseImage
    engine: EngineLaunch
    bake: Bake
    template: StrictStr | None = None
    aliases: list[StrictStr] = Field(
        default_factory=list, description="other BACKEND values that mean this engine (e.g. openai for vllm)"
    )
    upstream: Upstream = Field(default_factory=Upstream)
    notes: dict[StrictStr, StrictStr] = Field(
        default_factory=dict, description="why a baked value differs from upstream, per variable"
    )
    _path: str | None = PrivateAttr(default=None)  # the file it was read from, as messages show it

    @property
    def spec_path(self) -> str:
        """The spec file as messages name it (`images/<name>.yaml` for the repository's own)."""
        return self._path or f"images/{self.name}.yaml"

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9-]*", value):
            raise ValueError("must be lower-case letters, digits and '-'")
        return value

    @field_validator("description")
    @classmethod
    def _description(cls, value: str) -> str:
        return _bakeable(value)

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}", value):
            raise ValueError(f"{value!r} is not a version: letters, digits, '.', '_', '+', '-' (it goes into tags)")
        return _bakeable(value)

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        if not re.fullmatch(r"https?://[^\s\"'\\]+", value):
            raise ValueError("must be the project's http(s) URL, without blanks or quotes")
        return _bakeable(value)

    @field_validator("template")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(TEMPLATE_NAME, value):
            raise ValueError(f"{value!r} must be a file name under templates/ ending in .j2 (no '..', no blanks)")
        return value

    @model_validator(mode="after")
    def _backend_matches(self) -> EngineSpec:
        backend = self.bake.env["BACKEND"]
        if not isinstance(backend, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", backend):
            raise ValueError("bake.env.BACKEND: must name a worker backend (workers/<name>/worker.py)")
        for alias in self.aliases:
            if not re.fullmatch(r"[a-z][a-z0-9_]*", alias) or alias in (self.name, backend):
                raise ValueError(f"aliases: {alias!r} must be another BACKEND name (lower-case letters, digits, '_')")
        exit_line = EXIT_LINE.format(name=self.name)
        if exit_line not in self.bake.env["MODEL_ERROR_LOG_MSGS"]:
            raise ValueError(f"bake.env.MODEL_ERROR_LOG_MSGS: must contain {exit_line!r}, the line bakery's entry "
                             "point writes when the engine exits (else the worker waits out its load timeout)")
        # The lines bakery.upkeep.drift looks for; the stage lines are optional, so a spec may bake none.
        baked = {line for var in DRIFT_VARS for line in self.bake.env.get(var, [])}
        for line in self.upstream.lines:
            if line not in baked:
                raise ValueError(f"upstream.lines: {line!r} is not a baked load, error or stage line; remove it or "
                                 "bake it")
        return self

    @property
    def template_name(self) -> str:
        """The Jinja2 template this engine renders with."""
        return self.template or f"{self.name}.Dockerfile.j2"


_SECRETS_HINT = "secrets are never baked: set it in the launch template at run time"


def _bakeable(value: str) -> str:
    """A scalar that reaches the image (label or ENV): exact in a Dockerfile and not a credential."""
    try:
        dockerfile_values.check_representable(value)
        dockerfile_values.check_no_secret(value)
    except dockerfile_values.ValueRefused as exc:
        raise ValueError(str(exc)) from None
    return value


def _check_env_item(name: str, value: Any) -> None:
    where = f"{name}: "
    if not ENV_NAME.match(name):
        raise ValueError(f"{where}not a valid environment variable name")
    if why := secret_reason(name):
        raise ValueError(
            f"{where}looks like a credential by its name ({why}); {_SECRETS_HINT}"
        )
    if name in BAKERY_OWN:
        raise ValueError(f"{where}is baked by bakery itself from the spec (name and engine:); remove it")
    if name in LAUNCH_ONLY:
        raise ValueError(f"{where}is set by the launch template, not baked")
    if name.startswith("MODEL_") and name not in KNOWN_MODEL_VARS:
        import difflib  # only on this error path: it costs 15 ms at import

        close = difflib.get_close_matches(name, sorted(KNOWN_MODEL_VARS), n=1)
        hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(sorted(KNOWN_MODEL_VARS))}"
        raise ValueError(f"{where}unknown worker variable; {hint}")
    try:
        if name in LINE_LIST_VARS:
            if not isinstance(value, list):
                raise ValueError("must be a list of log lines")
            dockerfile_values.check_log_lines(value)
            for index, line in enumerate(value):
                if why := secret_value_reason(line):
                    raise ValueError(f"item {index}: {why}; {_SECRETS_HINT}")
        else:
            if not isinstance(value, str):
                raise ValueError("must be a string (only the log-line variables are lists)")
            _bakeable(value)
    except ValueError as exc:
        raise ValueError(f"{where}{exc}") from None
    if name == "MODEL_LOG" and not (value.startswith("/") and value == value.strip()):
        raise ValueError(f"{where}must be an absolute path")
    if name == "MODEL_HEALTH_ENDPOINT" and not re.match(r"^(/|https?://)\S*$", value):
        raise ValueError(f"{where}must be a path starting with '/' or a full http(s) URL")


# ---- loading -------------------------------------------------------------------------------------


# libyaml's parser when PyYAML has it (its wheels do): about ten times faster than the pure-Python one.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeyLoader(_SafeLoader):  # type: ignore[misc,valid-type]
    """SafeLoader that refuses duplicate keys (PyYAML keeps the last one silently)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (line {mark.line + 1})", mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def display_path(path: Path) -> str:
    """A path as users should see it in messages: relative to the repo when inside it."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _describe(error: dict[str, Any]) -> str:
    loc = ".".join(str(part) for part in error["loc"])
    kind, msg = error["type"], error["msg"]
    if kind == "missing":
        text = "missing required key"
    elif kind == "extra_forbidden":
        text = "unknown key"
    elif kind.endswith("_type") or kind == "list_type":
        got = type(error.get("input")).__name__
        text = msg.replace("Input should be a valid", "must be a") + f" (got {got})"
    else:
        text = msg.removeprefix("Value error, ")
    return f"{loc}: {text}" if loc else text


def parse_spec(data: Any, source: str) -> EngineSpec:
    """Validate already-parsed YAML data; `source` names the file in error messages."""
    if not isinstance(data, dict):
        raise InputError(f"{source}: the top level must be a mapping of keys (name, base, engine, bake, ...)")
    try:
        return EngineSpec.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        # Report the first error; a union of str|list yields one error per branch: keep the first.
        first = _describe(errors[0])
        more = len({tuple(e["loc"][:3]) for e in errors}) - 1
        suffix = f" (and {more} more)" if more > 0 else ""
        raise InputError(f"{source}: {first}{suffix}") from None


def load_spec_file(path: Path) -> EngineSpec:
    """Read and validate one spec file."""
    source = display_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{source}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{source}: cannot read: {exc}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(f"{source}{where}: invalid YAML: {problem}") from None
    spec = parse_spec(data, source)
    if spec.name != path.stem:
        raise InputError(f"{source}: name: is {spec.name!r} but the file is {path.name}; make them agree")
    spec._path = source
    return spec


def images_dir(given: Path | None = None) -> Path:
    """The directory of spec files: `given`, else $BAKERY_IMAGES_DIR, else the repository's images/."""
    if given is not None:
        return given
    from_env = os.environ.get(IMAGES_DIR_VAR, "")
    return Path(from_env) if from_env else IMAGES_DIR


def available_engines(directory: Path | None = None) -> list[str]:
    """Engine names, one per `<name>.yaml` of the images directory; InputError when it does not exist."""
    directory = images_dir(directory)
    if not directory.is_dir():
        raise InputError(f"{display_path(directory)}: the images directory does not exist (--images-dir, "
                         f"${IMAGES_DIR_VAR})")
    return sorted(p.stem for p in directory.glob("*.yaml"))


def load_engine(name: str, directory: Path | None = None) -> EngineSpec:
    """Load `<images dir>/<name>.yaml`; an unknown name is an InputError listing the valid ones."""
    directory = images_dir(directory)
    engines = available_engines(directory)
    if name not in engines:
        choices = f"choose one of {', '.join(engines)}" if engines else "it holds no <engine>.yaml"
        raise InputError(f"unknown engine {name!r}: {choices} (files in {display_path(directory)}/)")
    return load_spec_file(directory / f"{name}.yaml")
