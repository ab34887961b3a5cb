"""The SGLang stand-in: SGLang's command line, log grammar and /health behaviour (docs/engines.md).

SGLang loads the weights with its port closed, then starts uvicorn (`Uvicorn running on http://...`
comes BEFORE warm-up ends), answers /health with 503 while it warms up by sending itself
`GET /model_info` and `POST /generate`, then prints `The server is fired up and ready to roll!`
and /health answers 200. Its lines look like `[YYYY-mm-dd HH:MM:SS] message` (`... TP0]` from the
scheduler) and go to stderr; uvicorn's access lines go to stdout. Fatal: `Scheduler hit an
exception: ...`, `Initialization failed. warmup error: ...`. Files and line numbers in tracebacks are
those of SGLang 0.5.23's source (docs/engines.md).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from bakery_standin import SGLANG_VERSION, STANDIN_LABEL
from bakery_standin.api import SGLANG_ROUTES
from bakery_standin.core import (
    EngineProfile,
    Flag,
    Handler,
    Options,
    ServeConfig,
    UsageError,
    emit,
    generate_route,
    parse_port,
    parse_tolerant,
)

VERSION = f"{SGLANG_VERSION}+{STANDIN_LABEL}"
PKG = "/usr/local/lib/python3.11/dist-packages/sglang"

USAGE = f"""usage: launch_server.py --model-path MODEL_PATH [options]

bakery stand-in for SGLang {SGLANG_VERSION} (not the real SGLang: it loads no model, needs no GPU).

options used by the stand-in:
  --model-path, --model PATH   model to "serve" (required)
  --host HOST                  bind address (default: 127.0.0.1)
  --port PORT                  port (default: 30000)
  --served-model-name NAME     model id in the API (default: the model path)
  --context-length N           context length checked against requests (default: 4096)
  --api-key KEY                require `Authorization: Bearer KEY` on /v1 routes
  --skip-server-warmup         ready right after uvicorn starts (no warm-up requests)
Any other engine argument is accepted, logged and ignored.
Behaviour switches (environment): STANDIN_LOAD_SECONDS, STANDIN_WARMUP_SECONDS, STANDIN_FAIL_LOAD,
STANDIN_FAIL_REASON, STANDIN_CRASH_AFTER_LOAD, STANDIN_EXIT_DELAY, STANDIN_TOKEN_DELAY,
STANDIN_REPLY_TOKENS (see bases/standin/README.md).
"""

_FLAGS = [
    Flag(("-h", "--help"), 0),
    Flag(("--model-path", "--model")),
    Flag(("--host",)),
    Flag(("--port",)),
    Flag(("--served-model-name",)),
    Flag(("--context-length",)),
    Flag(("--api-key",)),
    Flag(("--skip-server-warmup",), 0),
]
_IGNORED_VALUE = (
    "--tokenizer-path", "--tp-size", "--tp", "--dp-size", "--dp", "--mem-fraction-static",
    "--log-level", "--log-level-http", "--dtype", "--chunked-prefill-size",
    "--max-running-requests", "--max-total-tokens", "--attention-backend", "--random-seed",
    "--quantization", "--kv-cache-dtype", "--chat-template", "--tool-call-parser",
    "--reasoning-parser", "--load-format", "--revision", "--download-dir", "--schedule-policy",
    "--cuda-graph-max-bs", "--device",
)
_IGNORED_BOOL = (
    "--trust-remote-code", "--disable-cuda-graph", "--enable-metrics", "--log-requests",
    "--disable-radix-cache", "--enable-torch-compile", "--disable-overlap-schedule",
    "--enable-mixed-chunk", "--is-embedding", "--skip-tokenizer-init",
)
_FLAGS += [Flag((name,), 1, used=False) for name in _IGNORED_VALUE]
_FLAGS += [Flag((name,), 0, used=False) for name in _IGNORED_BOOL]


def _ts(tp: bool = False) -> str:
    return time.strftime("[%Y-%m-%d %H:%M:%S") + (" TP0]" if tp else "]")


class SglangProfile(EngineProfile):
    name = "sglang"
    display = "SGLang"
    version = VERSION
    owned_by = "sglang"
    bind_early = False
    listen_before_ready = True
    warmup_default = 1.0
    default_fail_reason = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                           "GPU 0 has a total capacity of 0 bytes "
                           "(bakery stand-in: STANDIN_FAIL_LOAD)")
    default_warmup_reason = "AssertionError: Internal Server Error (bakery stand-in: STANDIN_FAIL_LOAD=warmup)"
    default_crash_reason = ("RuntimeError: CUDA error: an illegal memory access was encountered "
                            "(bakery stand-in: STANDIN_CRASH_AFTER_LOAD)")

    def __init__(self) -> None:
        self.pid = os.getpid()

    def log(self, msg: str, tp: bool = False) -> None:
        emit(f"{_ts(tp)} {msg}", sys.stderr)

    def uvicorn(self, msg: str, level: str = "INFO") -> None:
        emit(f"{_ts()} {level + ':':<9} {msg}", sys.stderr)

    def parse(self, argv: list[str]) -> ServeConfig:
        parsed = parse_tolerant(argv, _FLAGS)
        values = parsed.values
        if values.get("help"):
            emit(USAGE.rstrip("\n"), sys.stdout)
            raise SystemExit(0)
        model = values.get("model_path")
        if not model:
            raise UsageError("the following arguments are required: --model-path")
        raw_len = values.get("context_length", "4096")
        try:
            context = int(raw_len)
        except ValueError:
            raise UsageError(f"argument --context-length: invalid int value: {raw_len!r}") from None
        host = values.get("host", "127.0.0.1")
        port = parse_port(values.get("port"), 30000)
        served = values.get("served_model_name") or model
        args = (f"model_path={model!r}, tokenizer_path={model!r}, host={host!r}, port={port}, "
                f"served_model_name={served!r}, context_length={values.get('context_length')}, "
                f"api_key={'<redacted>' if values.get('api_key') else None}, "
                f"skip_server_warmup={bool(values.get('skip_server_warmup'))}, "
                "device='cpu (stand-in)'")
        return ServeConfig(
            model=model, served_name=served, host=host, port=port, max_model_len=context,
            api_key=values.get("api_key"), skip_warmup=bool(values.get("skip_server_warmup")),
            extra={"unknown": parsed.unknown + parsed.positionals, "ignored": parsed.ignored,
                   "server_args": args},
        )

    def banner(self, cfg: ServeConfig, opts: Options) -> None:
        self.log(f"sglang {self.version}: this is the bakery stand-in for SGLang {SGLANG_VERSION}, "
                 "not SGLang: it loads no model and needs no GPU; answers are canned and "
                 "deterministic. Switches: STANDIN_* environment variables.")
        self.log(f"server_args=ServerArgs({cfg.extra['server_args']})")
        if cfg.extra["ignored"]:
            self.log(f"stand-in: engine args accepted without effect: {cfg.extra['ignored']!r}")
        if cfg.extra["unknown"]:
            self.log(f"stand-in: unknown args tolerated and ignored: {cfg.extra['unknown']!r}")

    def loading(self, cfg: ServeConfig) -> None:
        self.log("Load weight begin. avail mem=0.00 GB (stand-in: no GPU)", tp=True)

    def loaded(self, cfg: ServeConfig, seconds: float) -> None:
        self.log(f"Load weight end. elapsed={seconds:.2f} s, type=StandinForCausalLM, "
                 "avail mem=0.00 GB, mem usage=0.00 GB. (stand-in)", tp=True)
        self.log(f"max_total_num_tokens=65536, chunked_prefill_size=8192, max_prefill_tokens=16384, "
                 f"max_running_requests=256, context_len={cfg.max_model_len}, "
                 "available_gpu_mem=0.00 GB", tp=True)

    def listening(self, cfg: ServeConfig) -> None:
        self.uvicorn(f"Started server process [{self.pid}]")
        self.uvicorn("Waiting for application startup.")
        self.uvicorn("Application startup complete.")
        self.uvicorn(f"Uvicorn running on http://{self.display_host(cfg)}:{cfg.port} "
                     "(Press CTRL+C to quit)")

    def ready(self, cfg: ServeConfig) -> None:
        self.log("The server is fired up and ready to roll!")

    def fatal_load(self, cfg: ServeConfig, reason: str) -> None:
        emit("\n".join([
            f"{_ts(True)} Scheduler hit an exception: Traceback (most recent call last):",
            f'  File "{PKG}/srt/managers/scheduler.py", line 6362, in run_scheduler_process',
            "    scheduler = Scheduler(server_args, port_args)",
            f'  File "{PKG}/srt/model_executor/model_runner.py", line 1274, in load_model',
            "    logger.info(",
            reason,
            "",
        ]), sys.stderr)
        self.log("Received sigquit from a child process. It usually means the child failed.")

    def fatal_warmup(self, cfg: ServeConfig, reason: str) -> None:
        emit("\n".join([
            f"{_ts()} Initialization failed. warmup error: Traceback (most recent call last):",
            f'  File "{PKG}/srt/entrypoints/http_server.py", line 2501, in _execute_server_warmup',
            '    assert res.status_code == 200, f"{res.text}"',
            reason,
        ]), sys.stderr)

    def crash(self, cfg: ServeConfig, reason: str) -> None:
        emit("\n".join([
            f"{_ts(True)} Scheduler hit an exception: Traceback (most recent call last):",
            f'  File "{PKG}/srt/managers/scheduler.py", line 6368, in run_scheduler_process',
            "    scheduler.run_event_loop()",
            reason,
            "",
        ]), sys.stderr)
        self.log("Received sigquit from a child process. It usually means the child failed.")

    def bind_error(self, cfg: ServeConfig, exc: OSError) -> None:
        self.uvicorn(f"[Errno {exc.errno}] error while attempting to bind on address "
                     f"({cfg.host!r}, {cfg.port}): {(exc.strerror or str(exc)).lower()}", "ERROR")

    def access(self, client: str, method: str, path: str, status: int) -> None:
        emit(f'{_ts()} INFO:     {client} - "{method} {path} HTTP/1.1" {status} '
             f"{HTTPStatus(status).phrase}", sys.stdout)

    def extra_routes(self) -> dict[tuple[str, str], Callable[[Handler, dict[str, Any]], None]]:
        return {
            ("GET", "/model_info"): self._model_info,
            ("GET", "/get_model_info"): self._get_model_info,
            ("GET", "/ready"): self._ready,
            ("GET", "/health_generate"): self._health_generate,
            ("POST", "/generate"): generate_route,
            **SGLANG_ROUTES,
        }

    @staticmethod
    def _model_info(h: Handler, _body: dict[str, Any]) -> None:
        h.require_ready(auth=False, starting_ok=True)
        cfg = h.server.cfg
        h.send_json(200, {"model_path": cfg.model, "served_model_name": cfg.served_name,
                          "tokenizer_path": cfg.model, "is_generation": True})

    def _get_model_info(self, h: Handler, body: dict[str, Any]) -> None:
        # Deprecated in 0.5.23 in favour of /model_info, with this warning; still answered.
        self.log("Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
                 "Please use '/model_info' instead.")
        self._model_info(h, body)

    @staticmethod
    def _ready(h: Handler, _body: dict[str, Any]) -> None:
        from bakery_standin.core import State

        h.send_empty(200 if h.server.state.value == State.READY else 503)

    @staticmethod
    def _health_generate(h: Handler, _body: dict[str, Any]) -> None:
        from bakery_standin.core import State

        h.send_empty(200 if h.server.state.value == State.READY else 503)


def main(argv: list[str] | None = None) -> int:
    """`python3 -m sglang.launch_server --model-path M ...`."""
    from bakery_standin.core import run

    return run(SglangProfile(), list(sys.argv[1:] if argv is None else argv))
