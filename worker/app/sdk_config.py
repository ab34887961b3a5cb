"""The SDK's WorkerConfig made from the settings (one handler per served route, the benchmark on one,
readiness), and bakery's Route of each (control/own_handler.py)."""

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
from control import own_handler, sdk_seam
from engine import forward
from policy import guards

# Upstream handler settings: requests may run in parallel, queued up to 10 minutes.
MAX_QUEUE_TIME = 600.0


WORDS_FILE = Path(__file__).with_name("benchmark_words.txt")


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


def endpoint_handlers(config: Any) -> dict[str, own_handler.Route] | None:
    """bakery's Route of each route of `config`: its parser, workload and answer, bakery's own from the
    route's HandlerConfig, and the SDK's EndpointHandler, made as the SDK's Worker makes them (its session
    handler takes it); None when a changed SDK has no factory (core.run then exits 4)."""
    try:
        factory = getattr(importlib.import_module(SDK_HANDLER_FACTORY[0]), SDK_HANDLER_FACTORY[1])
    except (ImportError, AttributeError):
        return None
    sdk_handlers = factory(config).get_all_handlers()
    refusal = sdk_seam.json_data_exception()
    made = {}
    for hc in config.handlers:
        payload = (hc.payload_class.from_json_msg if hc.payload_class is not None else
                   own_handler.json_payload(hc.route, hc.request_parser, hc.workload_calculator, refusal))
        made[hc.route] = own_handler.Route(hc.route, sdk_handlers[hc.route], payload, hc.response_generator,
                                           refusal, hc.max_queue_time)
    return made
