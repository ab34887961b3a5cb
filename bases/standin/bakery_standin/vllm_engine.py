"""The vLLM stand-in: vLLM's command lines, log grammar and /health behaviour (docs/engines.md).

vLLM binds its port before loading but listens only when ready: until then connections are refused.
Its logger writes `(APIServer pid=N) LEVEL mm-dd HH:MM:SS [file.py:line] message` to stdout; a message of
several lines is written as one record whose every line carries that prefix, joined by `\r\n` (vLLM's
NewLineFormatter), as its start-up logo and `logger.exception` tracebacks are. uvicorn's own lines
(`INFO:     Application startup complete.`) go to stderr with the same process prefix, and so do
uncaught tracebacks. Ready line: `Application startup complete.`; fatal: `EngineCore failed to start.`,
`RuntimeError: Engine core initialization failed. ...`. File names and line numbers in the prefixes are
those of vLLM 0.33.0's source (docs/engines.md).
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

from bakery_standin import STANDIN_LABEL, VLLM_VERSION
from bakery_standin.api import VLLM_ROUTES
from bakery_standin.core import (
    BASE_ROUTES,
    EngineProfile,
    Flag,
    Handler,
    Options,
    RequestError,
    ServeConfig,
    UsageError,
    emit,
    parse_port,
    parse_tolerant,
)

VERSION = f"{VLLM_VERSION}+{STANDIN_LABEL}"
DEFAULT_MODEL = "facebook/opt-125m"
PKG = "/usr/local/lib/python3.11/dist-packages/vllm"
# vLLM 0.33's start-up logo (vllm/entrypoints/common/startup.py) as its monochrome formatter writes it when
# stdout is not a terminal; VLLM_DISABLE_LOG_LOGO=1 prints the one-line form instead.
LOGO = ("\n       █     █     █▄   ▄█\n"
        " ▄▄ ▄█ █     █     █ ▀▄▀ █  version {version}\n"
        "  █▄█▀ █     █     █     █  model   {model}\n"
        "   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀\n")
PLAIN_BANNER = "vLLM server version {version}, serving model {model}"
ENGINE_CORE = "EngineCore"  # the engine process's name without data parallelism (v1/engine/core.py)

USAGE = f"""usage: vllm serve [model_tag] [options]

bakery stand-in for vLLM {VLLM_VERSION} (not the real vLLM: it loads no model and needs no GPU).
Start the OpenAI-compatible API server.

options used by the stand-in:
  model_tag / --model MODEL     model to "serve" (default: {DEFAULT_MODEL})
  --host HOST                   bind address (default: all interfaces)
  --port PORT                   port (default: 8000)
  --served-model-name NAME...   model id in the API (default: the model)
  --max-model-len N             context length checked against requests (default: 4096)
  --api-key KEY                 require `Authorization: Bearer KEY` on /v1 routes
  --disable-uvicorn-access-log  do not log each request
Any other engine argument is accepted, logged and ignored.
Behaviour switches (environment): STANDIN_LOAD_SECONDS, STANDIN_WARMUP_SECONDS, STANDIN_FAIL_LOAD,
STANDIN_FAIL_REASON, STANDIN_CRASH_AFTER_LOAD, STANDIN_EXIT_DELAY, STANDIN_TOKEN_DELAY,
STANDIN_REPLY_TOKENS (see bases/standin/README.md).
"""

_FLAGS = [
    Flag(("-h", "--help"), 0),
    Flag(("--model",)),
    Flag(("--host",)),
    Flag(("--port",)),
    Flag(("--served-model-name",), "+"),
    Flag(("--max-model-len",)),
    Flag(("--api-key",)),
    Flag(("--disable-uvicorn-access-log",), 0),
]
# Common vLLM arguments that take a value / none: known so that parsing stays exact; no effect here.
_IGNORED_VALUE = (
    "--dtype", "--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp",
    "--data-parallel-size", "-dp", "--gpu-memory-utilization", "--max-num-seqs",
    "--max-num-batched-tokens", "--quantization", "-q", "--kv-cache-dtype", "--tokenizer",
    "--revision", "--download-dir", "--load-format", "--chat-template", "--tool-call-parser",
    "--reasoning-parser", "--seed", "--swap-space", "--uvicorn-log-level", "--config",
    "--generation-config", "--limit-mm-per-prompt", "--block-size", "--max-logprobs",
)
_IGNORED_BOOL = (
    "--trust-remote-code", "--enforce-eager", "--enable-prefix-caching",
    "--no-enable-prefix-caching", "--enable-chunked-prefill", "--disable-log-requests",
    "--enable-log-requests", "--disable-log-stats", "--enable-auto-tool-choice",
    "--disable-frontend-multiprocessing", "--headless",
)
_FLAGS += [Flag((name,), 1, used=False) for name in _IGNORED_VALUE]
_FLAGS += [Flag((name,), 0, used=False) for name in _IGNORED_BOOL]


def _ts() -> str:
    return time.strftime("%m-%d %H:%M:%S")


class VllmProfile(EngineProfile):
    name = "vllm"
    display = "vLLM"
    version = VERSION
    owned_by = "vllm"
    # The real vLLM's answers (0.32.0 here, measured by tests/bases/test_vllm_differential.py): these
    # fields are always there, null when nothing asked for them.
    answer_nulls: ClassVar[dict[str, tuple[str, ...]]] = {
        "completion": ("ec_transfer_params", "kv_transfer_params", "metrics", "service_tier"),
        "chat": ("ec_transfer_params", "kv_transfer_params", "metrics", "prompt_logprobs", "prompt_text",
                 "prompt_token_ids", "service_tier"),
        "text_choice": ("prompt_logprobs", "prompt_token_ids", "routed_experts", "stop_reason", "token_ids"),
        "chat_choice": ("routed_experts", "stop_reason", "token_ids"),
        "message": ("annotations", "audio", "function_call", "reasoning", "refusal"),
        "usage": ("completion_tokens_details", "prompt_tokens_details"),
        "first_chunk": ("prompt_text", "prompt_token_ids"),
        "chat_chunk_choice": ("token_ids",),
        "text_chunk_choice": ("prompt_token_ids", "stop_reason", "token_ids"),
        "chat_finish_choice": ("stop_reason", "token_ids"),
        "text_finish_choice": ("prompt_token_ids", "stop_reason", "token_ids"),
    }
    fingerprint_in_chunks = False  # only the last chunk carries it: the usage chunk, else the finish chunk
    # vLLM sends finish_reason with the step that finishes: the last token when max_tokens cuts the
    # answer, the end-of-sequence token (no text: a chat's delta has content "") when it stops.
    finish_with_last_token = True
    finish_delta_content = ""
    health_content_type = None  # `Response(status_code=200)`: no content type, an empty body

    def error_body(self, status: int, message: str, kind: str, param: str | None) -> dict[str, Any]:
        # vLLM's ErrorResponse: the error object nested under "error".
        return {"error": {"message": message, "type": kind, "param": param, "code": status}}

    def invalid_json(self, raw: bytes, exc: ValueError) -> RequestError:
        # FastAPI's request validation, as vLLM words it: pydantic's error list, type "Bad Request".
        pos = getattr(exc, "pos", 0)
        return RequestError(400, "1 validation error:\n  {'type': 'json_invalid', 'loc': 'body." + str(pos)
                            + "', 'msg': 'JSON decode error', 'input': '<dict of 0 items>', "
                            "'ctx': {'error': 'Expecting value'}}", "Bad Request", f"body.{pos}")

    def missing_field(self, name: str) -> RequestError:
        return RequestError(400, "1 validation error:\n  {'type': 'missing', 'loc': 'body." + name
                            + "', 'msg': 'Field required', 'input': '<dict of 1 items>'}", "Bad Request",
                            f"body.{name}")

    def check_max_tokens(self, max_tokens: int | None, max_model_len: int) -> None:
        if max_tokens is not None and max_tokens > max_model_len:
            raise RequestError(400, f"max_tokens={max_tokens} cannot be greater than max_model_len={max_model_len}. "
                               f"Please request fewer output tokens. (parameter=max_tokens, value={max_tokens})",
                               "BadRequestError", "max_tokens")

    def check_context(self, prompt_tokens: int, max_tokens: int | None, count: int, max_model_len: int) -> int:
        # vLLM 0.32 refuses a prompt longer than the context (its renderer's token check, parameter
        # input_tokens) and otherwise lowers max_tokens to what is left of the context.
        if prompt_tokens > max_model_len:
            raise RequestError(400, f"This model's maximum context length is {max_model_len} tokens. However, "
                               f"your prompt contains {prompt_tokens} input tokens, which exceeds this limit even "
                               "without any output tokens. Please reduce the length of the input prompt. "
                               f"(parameter=input_tokens, value={prompt_tokens})", "BadRequestError", "input_tokens")
        return max(1, min(count, max_model_len - prompt_tokens))

    def missing_prompt(self) -> RequestError:
        # The completion request's own validator raises a VLLMValidationError, which is no ValueError:
        # pydantic lets it through and vLLM's own handler answers it (BadRequestError, its parameter).
        return RequestError(400, "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)",
                            "BadRequestError", "prompt")

    def model_card_extra(self, cfg: ServeConfig) -> dict[str, Any]:
        return {"permission": [{
            "id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": int(time.time()),
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
            "organization": "*", "group": None, "is_blocking": False}]}
    bind_early = True
    listen_before_ready = False
    warmup_default = 0.0
    default_fail_reason = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                           "GPU 0 has a total capacity of 0 bytes "
                           "(bakery stand-in: STANDIN_FAIL_LOAD)")
    default_warmup_reason = default_fail_reason
    default_crash_reason = ("RuntimeError: CUDA error: an illegal memory access was encountered "
                            "(bakery stand-in: STANDIN_CRASH_AFTER_LOAD)")

    def __init__(self, entry: str = "cli") -> None:
        self.entry = entry  # "cli" (`vllm serve`) or "api_server" (`python3 -m vllm...api_server`)
        self.pid = os.getpid()

    # -- output helpers ---------------------------------------------------------------------------

    def log(self, level: str, src: str, msg: str, proc: str = "APIServer") -> None:
        prefix = f"({proc} pid={self.pid}) {level} {_ts()} [{src}] "
        # One record: every line of a multi-line message carries the prefix, joined by "\r\n" as vLLM's
        # NewLineFormatter joins them.
        emit(prefix + msg.replace("\n", "\r\n" + prefix), sys.stdout)

    def raw(self, lines: list[str], proc: str = "APIServer") -> None:
        emit("\n".join(f"({proc} pid={self.pid}) {line}" for line in lines), sys.stderr)

    def uvicorn(self, msg: str) -> None:
        emit(f"(APIServer pid={self.pid}) INFO:     {msg}", sys.stderr)

    # -- command line -----------------------------------------------------------------------------

    def parse(self, argv: list[str]) -> ServeConfig:
        parsed = parse_tolerant(argv, _FLAGS)
        if parsed.values.get("help"):
            emit(USAGE.rstrip("\n"), sys.stdout)
            raise SystemExit(0)
        values = parsed.values
        model_tag = None
        positionals = list(parsed.positionals)
        if self.entry == "cli" and positionals:
            model_tag = positionals.pop(0)
        unknown = parsed.unknown + positionals
        model = model_tag or values.get("model") or DEFAULT_MODEL
        names = values.get("served_model_name") or [model]
        max_len_raw = values.get("max_model_len", "4096")
        try:
            max_len = int(str(max_len_raw).lower().replace("k", "000"))
        except ValueError:
            raise UsageError(f"argument --max-model-len: invalid value {max_len_raw!r}") from None
        port = parse_port(values.get("port"), 8000)
        non_default: dict[str, Any] = {}
        if model_tag:
            non_default["model_tag"] = model_tag
        for key in ("host", "port", "served_model_name", "max_model_len"):
            if key in values:
                non_default[key] = port if key == "port" else values[key]
        if "api_key" in values:
            non_default["api_key"] = "<redacted>"
        non_default["model"] = model
        return ServeConfig(
            model=model, served_name=names[0], host=values.get("host") or "",
            port=port, max_model_len=max_len,
            api_key=values.get("api_key"),
            access_log=not values.get("disable_uvicorn_access_log"),
            extra={"unknown": unknown, "ignored": parsed.ignored, "non_default": non_default},
        )

    # -- timeline ---------------------------------------------------------------------------------

    def banner(self, cfg: ServeConfig, opts: Options) -> None:
        banner = PLAIN_BANNER if os.environ.get("VLLM_DISABLE_LOG_LOGO", "0") not in ("", "0") else LOGO
        self.log("INFO", "startup.py:38", banner.format(version=self.version, model=cfg.model))
        self.log("WARNING", "standin.py:1", f"This is the bakery stand-in for vLLM {VLLM_VERSION}, "
                 "not vLLM: it loads no model and needs no GPU; answers are canned and "
                 "deterministic. Switches: STANDIN_* environment variables.")
        self.log("INFO", "startup.py:96", f"non-default args: {cfg.extra['non_default']!r}")
        if cfg.extra["ignored"]:
            self.log("WARNING", "standin.py:2",
                     f"stand-in: engine args accepted without effect: {cfg.extra['ignored']!r}")
        if cfg.extra["unknown"]:
            self.log("WARNING", "standin.py:3",
                     f"stand-in: unknown args tolerated and ignored: {cfg.extra['unknown']!r}")

    def loading(self, cfg: ServeConfig) -> None:
        self.log("INFO", "model.py:744", "Resolved architecture: StandinForCausalLM")
        self.log("INFO", "model.py:2170", f"Using max model len {cfg.max_model_len}")
        core = ENGINE_CORE
        self.log("INFO", "core.py:140", f"Initializing a V1 LLM engine (v{self.version}) with config: "
                 f"model={cfg.model!r}, served_model_name={cfg.served_name}, "
                 f"max_seq_len={cfg.max_model_len}, device_config=cpu (stand-in)", core)
        self.log("INFO", "gpu_model_runner.py:4979", f"Starting to load model {cfg.model}...", core)

    def loaded(self, cfg: ServeConfig, seconds: float) -> None:
        core = ENGINE_CORE
        self.log("INFO", "gpu_model_runner.py:5089",
                 f"Model loading took 0.0 GiB memory and {seconds:.6f} seconds", core)
        self.log("INFO", "core.py:413",
                 f"init engine (profile, create kv cache, warmup model) took {seconds:.2f} s", core)

    def listening(self, cfg: ServeConfig) -> None:
        self.log("INFO", "entry.py:135", "Supported tasks: ('generate',)")
        self.log("INFO", "entry.py:139",
                 f"Starting vLLM server on http://{self.display_host(cfg)}:{cfg.port}")
        self.log("INFO", "launcher.py:188", "Available routes are:")
        routes: dict[str, list[str]] = {}
        for method, path in [*BASE_ROUTES, *self.extra_routes()]:
            routes.setdefault(path, []).append(method)
        for path, methods in routes.items():
            self.log("INFO", "launcher.py:197", f"Route: {path}, Methods: {', '.join(methods)}")
        self.uvicorn(f"Started server process [{self.pid}]")
        self.uvicorn("Waiting for application startup.")
        self.uvicorn("Application startup complete.")

    def fatal_load(self, cfg: ServeConfig, reason: str) -> None:
        core = ENGINE_CORE
        # logger.exception: one record, the traceback's lines under the message's prefix.
        self.log("ERROR", "core.py:1584", "\n".join([
            "EngineCore failed to start.",
            "Traceback (most recent call last):",
            f'  File "{PKG}/v1/engine/core.py", line 1555, in run_engine_core',
            "    engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)",
            f'  File "{PKG}/v1/engine/core.py", line 1172, in __init__',
            "    super().__init__(",
            f'  File "{PKG}/v1/engine/core.py", line 163, in __init__',
            "    kv_cache_config = self._initialize_kv_caches(vllm_config)",
            reason,
        ]), core)
        self.raw([
            f"Process {core}:",
            "Traceback (most recent call last):",
            '  File "/usr/lib/python3.11/multiprocessing/process.py", line 314, in _bootstrap',
            "    self.run()",
            f'  File "{PKG}/v1/engine/core.py", line 1588, in run_engine_core',
            "    raise e",
            reason,
        ], core)
        top = ('  File "/usr/local/bin/vllm", line 8, in <module>', "    sys.exit(main())")
        if self.entry != "cli":
            top = ('  File "<frozen runpy>", line 198, in _run_module_as_main',
                   '    return _run_code(code, main_globals, None,')
        self.raw([
            "Traceback (most recent call last):",
            *top,
            f'  File "{PKG}/v1/engine/utils.py", line 1473, in wait_for_engine_startup',
            "    raise RuntimeError(",
            "RuntimeError: Engine core initialization failed. See root cause above. "
            f"Failed core proc(s): {{'{ENGINE_CORE}': 1}}",
        ])

    def fatal_warmup(self, cfg: ServeConfig, reason: str) -> None:
        self.fatal_load(cfg, reason)

    def crash(self, cfg: ServeConfig, reason: str) -> None:
        self.log("ERROR", "core.py:1586", "\n".join([
            "EngineCore encountered a fatal error.",
            "Traceback (most recent call last):",
            f'  File "{PKG}/v1/engine/core.py", line 1570, in run_engine_core',
            "    engine_core.run_busy_loop()",
            reason,
        ]), ENGINE_CORE)
        self.log("ERROR", "async_llm.py:943", "\n".join([
            "AsyncLLM output_handler failed.",
            "Traceback (most recent call last):",
            f'  File "{PKG}/v1/engine/async_llm.py", line 880, in output_handler',
            "    outputs = await engine_core.get_output_async()",
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
            "See stack trace (above) for the root cause.",
        ]))

    def bind_error(self, cfg: ServeConfig, exc: OSError) -> None:
        self.raw([
            "Traceback (most recent call last):",
            f'  File "{PKG}/entrypoints/launchers/launcher.py", line 353, in create_server_socket',
            "    sock.bind(addr)",
            f"OSError: [Errno {exc.errno}] {exc.strerror}",
        ])

    def access(self, client: str, method: str, path: str, status: int) -> None:
        from http import HTTPStatus

        emit(f'(APIServer pid={self.pid}) INFO:     {client} - "{method} {path} HTTP/1.1" '
             f"{status} {HTTPStatus(status).phrase}", sys.stdout)

    def extra_routes(self) -> dict[tuple[str, str], Callable[[Handler, dict[str, Any]], None]]:
        return {
            ("GET", "/version"): lambda h, _b: h.send_json(200, {"version": self.version}),
            ("GET", "/ping"): BASE_ROUTES[("GET", "/health")],
            ("POST", "/ping"): BASE_ROUTES[("GET", "/health")],
            **VLLM_ROUTES,
        }


def main_cli(argv: list[str] | None = None) -> int:
    """`vllm ...`: the stand-in implements `vllm serve` and `vllm --version`."""
    from bakery_standin.core import run

    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-v", "--version"):
        emit(VERSION, sys.stdout)
        return 0
    if not args or args[0] in ("-h", "--help"):
        emit(USAGE.rstrip("\n"), sys.stdout)
        return 0 if args else 2
    if args[0] != "serve":
        emit(f"vllm: error: the bakery stand-in only implements `vllm serve`, not {args[0]!r}",
             sys.stderr)
        return 2
    return run(VllmProfile("cli"), args[1:])


def main_api_server(argv: list[str] | None = None) -> int:
    """`python3 -m vllm.entrypoints.openai.api_server --model M ...`."""
    from bakery_standin.core import run

    return run(VllmProfile("api_server"), list(sys.argv[1:] if argv is None else argv))
