"""End to end, per backend: the real SDK in the lean venv, started by start_server.sh, over an engine.

vllm, sglang and the openai alias run over the project's stand-ins (bases/standin; the real engines
need a GPU);
llama runs over the real llama.cpp (xllamacpp) serving the real SmolLM2 model. Each test: the
banner, the load line seen, a tiny benchmark run (the file appears), a completion and a chat request
(plus a streamed one) through the worker in the SDK envelope, then an error line reported errored to
REPORT_ADDR.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from app.worker_config import EngineDefaults
from config.table import parse_lines
from tests.worker.helpers import SDK_READY, Engine, Harness, baked_facts, post_enveloped
from workers.llama.worker import DEFAULTS as LLAMA
from workers.sglang.worker import DEFAULTS as SGLANG
from workers.vllm.worker import DEFAULTS as VLLM

pytestmark = pytest.mark.slow

ENGINE_DEFAULTS = {"vllm": VLLM, "sglang": SGLANG, "llama": LLAMA, "openai": VLLM}


def _check_answers(port: int, engine: str, model_id: str) -> None:
    """A completion, a chat and a streamed chat through the worker return the engine's answer."""
    status, body, _ = post_enveloped(port, "/v1/completions",
                                     {"model": model_id, "prompt": "The capital of France is", "max_tokens": 8},
                                     reqnum=101)
    assert status == 200, body
    answer = json.loads(body)
    assert answer["object"] == "text_completion"
    assert answer["choices"][0]["text"]
    status, body, _ = post_enveloped(
        port, "/v1/chat/completions",
        {"model": model_id, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}, reqnum=102)
    assert status == 200, body
    answer = json.loads(body)
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["content"]
    if engine != "llama":  # the stand-in names itself in every answer
        assert answer["choices"][0]["message"]["content"].startswith("Stand-in answer:")
        assert answer["system_fingerprint"].startswith(f"{engine}-")
    status, body, content_type = post_enveloped(
        port, "/v1/chat/completions",
        {"model": model_id, "messages": [{"role": "user", "content": "Count."}], "max_tokens": 8, "stream": True},
        reqnum=103)
    assert status == 200, body
    assert content_type.startswith("text/event-stream")
    assert b"data: " in body and b"[DONE]" in body


def _run_backend(harness: Harness, backend: str, slot: Engine, start_engine: Callable[[], Engine],
                 worker_first: bool, model_id: str) -> None:
    """`start_engine` starts the engine at `slot` (its port and log are known before it runs)."""
    defaults: EngineDefaults = ENGINE_DEFAULTS[backend]
    state, engine_log, report = harness.tmp / "state", slot.log, harness.reports
    if worker_first:  # the worker waits for the log file to appear
        served = harness.worker(backend, slot, MODEL_NAME=model_id)
        served.worker.wait_for("beginning log tracking")
        start_engine()
    else:  # the load line is already in the log when the worker starts: it must not be missed
        engine = start_engine().proc
        assert engine is not None
        engine.wait_for(parse_lines(baked_facts(backend)["MODEL_LOAD_LOG_MSG"])[0], timeout=120)
        served = harness.worker(backend, slot, MODEL_NAME=model_id)
    worker, port = served.worker, served.port

    try:
        out = worker.wait_for(SDK_READY, timeout=180)
    except AssertionError as exc:  # say what the engine did too (a fresh CI run saw no load in 180 s once)
        engine_text = engine_log.read_text(encoding="utf-8", errors="replace") if engine_log.exists() else "(none)"
        seen = [line for line in worker.text.splitlines() if "log line" in line or "stage " in line
                or "error" in line.lower()][:40]
        raise AssertionError(f"{exc}\n--- the worker's log-line and stage lines:\n" + "\n".join(seen)
                             + f"\n--- the engine's log ({engine_log}), its end:\n{engine_text[-3000:]}") from None
    banner = f"Using worker backend: {defaults.engine}"
    assert out.splitlines()[0].startswith(banner)
    if backend == "openai":
        assert "BACKEND=openai is an alias of vllm" in out.splitlines()[0]
    assert "Got log line indicating model is loaded" in out
    assert (state / ".has_benchmark").is_file()
    assert float((state / ".has_benchmark").read_text()) > 0
    _check_answers(port, defaults.engine, model_id)

    # An error line (supervisord's exit notice, first in every engine's list) makes it report errored.
    error_line = parse_lines(baked_facts(backend)["MODEL_ERROR_LOG_MSGS"])[0]
    with engine_log.open("a") as log:
        log.write(f"2026-01-01 00:00:00,000 {error_line} (exit status 1; not expected)\n")
    worker.wait_for("Got log line indicating error")
    status = report.wait_status(lambda s: s.get("error_msg") == error_line, timeout=30)
    assert status["id"] == 1
    assert status["url"] == f"http://127.0.0.1:{port}"
    assert "No module named" not in worker.text


@pytest.mark.parametrize(("backend", "worker_first"), [("vllm", False), ("sglang", True), ("openai", False)])
def test_standin_backend(backend: str, worker_first: bool, harness: Harness) -> None:
    """vllm / sglang / the openai alias over bases/standin, which prints the engine's own log lines."""
    engine = "vllm" if backend == "openai" else backend
    slot = harness.slot(engine)
    _run_backend(harness, backend, slot, lambda: harness.standin(engine, at=slot), worker_first, "standin-model")


def test_llama_backend_real_llama_cpp(harness: Harness, llama_python: Path, smollm2: Path) -> None:
    """llama over the real llama.cpp server with the real SmolLM2 model (load line: `model loaded`)."""
    slot = harness.slot("llama")
    _run_backend(harness, "llama", slot, lambda: harness.llama(llama_python, smollm2, at=slot), False, "smollm2")


def test_llama_real_load_failure_reports_errored(harness: Harness, tmp_path: Path, llama_python: Path) -> None:
    """A model file llama.cpp cannot load: its own error lines make the worker report errored."""
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    engine = harness.llama(llama_python, bad)
    assert engine.proc is not None and engine.proc.wait_exit(60) != 0
    worker, report_server = harness.worker("llama", engine, LLAMA_MODEL="smollm2").worker, harness.reports
    # 90 s, not 30: in a fresh-machine run beside a second suite the worker had not read the log in 30 s.
    worker.wait_for("Got log line indicating error", timeout=90)
    status = report_server.wait_status(lambda s: bool(s.get("error_msg")), timeout=30)
    assert status["error_msg"] in parse_lines(baked_facts("llama")["MODEL_ERROR_LOG_MSGS"])
    assert not (tmp_path / "state" / ".has_benchmark").exists()
