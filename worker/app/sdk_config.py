"""The SDK's WorkerConfig made from the settings (one handler per served route, the benchmark on one,
readiness), the SDK's own handlers of each route, and its envelope type made cheaper to parse."""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.output import EXIT_SDK, fail
from app.worker_config import Settings
from config import routes, uploads
from control import sdk_seam
from engine import forward
from policy import guards

# Upstream handler settings: requests may run in parallel, queued up to 10 minutes.
MAX_QUEUE_TIME = 600.0


WORDS_FILE = Path(__file__).with_name("benchmark_words.txt")


# Where the SDK's request envelope type lives; its from_json_msg calls inspect.signature 7x per request.
SDK_AUTH_DATA = (sdk_seam.DATA_TYPES_MODULE, sdk_seam.hook("auth_signature").attr)


SDK_JSON_ERROR = sdk_seam.hook("json_data_exception").attr  # what that from_json_msg raises for missing fields


def readiness_kwargs(settings: Settings, config_cls: Any) -> tuple[dict[str, Any], str]:
    """The readiness arguments `config_cls` (the SDK's WorkerConfig) accepts, and a note to print.

    Feature-detected with inspect.signature: an SDK without health-gated readiness (vastai 1.9.1)
    gets no readiness argument at all and the worker runs in log mode.
    """
    params = inspect.signature(config_cls).parameters
    if "readiness" not in params:
        note = "readiness: logs (this vastai SDK has no health-gated readiness"
        if settings.readiness != "logs":
            note += f"; READINESS={settings.readiness} ignored"
        return {}, note + ")"
    wanted = {
        "readiness": settings.readiness,
        "readiness_timeout": settings.readiness_timeout,
        "healthcheck_probe_timeout": settings.healthcheck_probe_timeout,
    }
    kwargs = {k: v for k, v in wanted.items() if k in params}
    extra = "".join(f", {k}={v:g}" for k, v in kwargs.items() if k != "readiness")
    return kwargs, f"readiness: {settings.readiness}{extra}"


def load_words(path: Path = WORDS_FILE) -> list[str]:
    """The benchmark vocabulary shipped with the worker (one word a line, `#` comments)."""
    stripped = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [word for word in stripped if word and not word.startswith("#")]


def import_sdk() -> Any:
    """The vastai module, with its serverless names checked (vastai turns an ImportError into None)."""
    try:
        import vastai
    except ImportError as exc:
        fail(f"the vastai SDK is not importable in {sys.executable}: {exc}", EXIT_SDK)
    if vastai.Worker is None or vastai.WorkerConfig is None:
        try:  # re-import the parts vastai/__init__ swallowed, to name what is missing
            for name in ("vastai.serverless.server.worker", "vastai.sync.client", "vastai.async_.client",
                         "vastai.serverless.remote"):
                importlib.import_module(name)
        except ImportError as exc:
            fail(f"vastai's serverless worker cannot be imported in {sys.executable}: {exc}", EXIT_SDK)
        fail("vastai's serverless worker cannot be imported (vastai.Worker is None)", EXIT_SDK)
    return vastai


def _raising_json_error(parse: Callable[[Any], dict[str, Any]], json_error: type) -> Callable[[Any], dict[str, Any]]:
    """`parse`, with an UploadError turned into the SDK's JsonDataException (its 422)."""
    def parser(body: Any) -> dict[str, Any]:
        try:
            return parse(body)
        except uploads.UploadError as exc:
            raise json_error({exc.field: exc.message}) from None
    return parser


def sdk_handlers(specs: list[routes.HandlerSpec], sdk: Any, max_queue_time: float,
                 data_types: Any = None) -> list[Any]:
    """The SDK's HandlerConfigs for `specs`. `sdk` is the vastai module (HandlerConfig,
    BenchmarkConfig); `data_types` is vastai.serverless.server.lib.data_types (imported if None)."""
    types = data_types or importlib.import_module("vastai.serverless.server.lib.data_types")
    web = importlib.import_module("aiohttp.web")

    async def respond(request: Any, answer: Any) -> Any:  # the SDK's response_generator (public)
        return await forward.respond(web, request, answer)

    handlers = []
    for spec in specs:
        bench = None
        if spec.benchmark is not None:
            bench = sdk.BenchmarkConfig(generator=spec.benchmark.generator, runs=spec.benchmark.runs,
                                        concurrency=spec.benchmark.concurrency)
        extra: dict[str, Any]
        if spec.upload:
            extra = {"payload_class": uploads.payload_class(
                spec.route, spec.limits, spec.references,
                spec.benchmark.generator if spec.benchmark else None, types, spec.model_id)}
        else:
            parse = spec.request_parser or routes.request_parser(spec.route, spec.limits)
            extra = {"request_parser": _raising_json_error(parse, types.JsonDataException),
                     "workload_calculator": spec.workload}
        handlers.append(sdk.HandlerConfig(route=spec.route, allow_parallel_requests=True,
                                          max_queue_time=max_queue_time, benchmark_config=bench,
                                          response_generator=respond, **extra))
    return handlers


def build_worker_config(settings: Settings, sdk: Any, words: list[str],
                        max_sessions: int = guards.Limits.max_sessions) -> tuple[Any, str]:
    """The SDK's WorkerConfig for `settings`, and the readiness note to print.

    One handler per served route (OPENAI_ROUTES, in order), built by routes.py; only the
    benchmarked route (BENCHMARK_ROUTE) carries the benchmark.
    """
    specs = routes.handler_specs(
        settings.routes, words=words, model_id=settings.model_id, max_tokens=settings.benchmark_max_tokens,
        runs=settings.benchmark_runs, concurrency=settings.benchmark_concurrency)
    handlers = sdk_handlers(specs, sdk, MAX_QUEUE_TIME)
    extra, note = readiness_kwargs(settings, sdk.WorkerConfig)
    config = sdk.WorkerConfig(
        model_server_url=settings.server_base,
        model_server_port=settings.server_port,
        model_log_file=settings.model_log,
        model_healthcheck_url=settings.healthcheck_url,
        handlers=handlers,
        log_action_config=sdk.LogActionConfig(
            on_load=settings.load_lines,
            on_error=settings.error_lines,
            on_info=settings.info_lines,
        ),
        max_sessions=max_sessions,  # always positive: the SDK takes 0 or None as "no cap"
        **extra,
    )
    return config, note


SDK_HANDLER_FACTORY = (sdk_seam.WORKER_MODULE, sdk_seam.hook("handler_factory").attr)


def endpoint_handlers(config: Any) -> dict[str, Any] | None:
    """The SDK's EndpointHandler of each route of `config`, made as the SDK's Worker makes them (bakery's
    route handler parses and answers with them; the outcomes guard counts a refused request's workload
    with them); None when a changed SDK has no factory (core.run then exits 4)."""
    try:
        factory = getattr(importlib.import_module(SDK_HANDLER_FACTORY[0]), SDK_HANDLER_FACTORY[1])
    except (ImportError, AttributeError):
        return None
    return factory(config).get_all_handlers()


class _OwnSignature:
    """A class's `__signature__`, computed once, for that class only: on a subclass or an instance the
    attribute is absent, as it was, so inspect.signature() computes a subclass's own signature."""

    def __init__(self, owner: type) -> None:
        self.owner = owner
        self.signature = inspect.signature(owner)

    def __get__(self, instance: object, owner: type | None = None) -> inspect.Signature:
        if instance is None and owner is self.owner:
            return self.signature
        raise AttributeError("__signature__")


def cache_signature(module_name: str = SDK_AUTH_DATA[0], class_name: str = SDK_AUTH_DATA[1]) -> bool:
    """Make inspect.signature() of the SDK's AuthData a lookup instead of a computation, and its
    from_json_msg look it up once instead of seven times.

    vastai 1.9.1's `AuthData.from_json_msg` calls `inspect.signature(cls)` 7 times per request: ~190 us
    computed, ~22 us even as a lookup (BENCHMARKS.md). `__signature__` is the documented way (PEP 362)
    for an object to state its signature; the stated one is the one inspect computes. The class's
    from_json_msg is replaced by one with the same rules, in the same order, that asks for the
    signature once (~3 us): nothing the SDK sees changes. Returns False, touching nothing, when the
    class is not found (a changed SDK); without the module's JsonDataException or the class's
    from_json_msg, only the signature is stated.
    """
    module = sys.modules.get(module_name)
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        return False
    if not isinstance(cls.__dict__.get("__signature__"), _OwnSignature):
        cls.__signature__ = _OwnSignature(cls)  # type: ignore[attr-defined]
    refusal = getattr(module, SDK_JSON_ERROR, None)
    parse = cls.__dict__.get("from_json_msg")
    if isinstance(refusal, type) and isinstance(parse, classmethod) and not hasattr(parse, "bakery_once"):
        cls.from_json_msg = _parse_once(refusal, cls)  # type: ignore[attr-defined]
    return True


def _parse_once(refusal: type, owner: type) -> classmethod:
    """vastai 1.9.1's AuthData.from_json_msg with its signature asked for once: for `owner` at
    install (a dataclass's fields do not change; even as a lookup, inspect.signature() was ~2 % of a
    request's CPU), for a subclass at each call."""
    owner_parameters = inspect.signature(owner).parameters

    def from_json_msg(cls: type, json_msg: Any) -> Any:
        parameters = owner_parameters if cls is owner else inspect.signature(cls).parameters
        errors = {name: "missing parameter" for name in parameters if name not in json_msg}
        if errors:
            raise refusal(errors)
        return cls(**{key: value for key, value in json_msg.items() if key in parameters})

    made = classmethod(from_json_msg)
    made.bakery_once = True  # type: ignore[attr-defined]
    return made
