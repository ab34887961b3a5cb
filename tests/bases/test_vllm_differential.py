"""The vLLM stand-in held to the real vLLM: the same requests to both, compared on what the worker
and the gate rely on (needs Docker: fails under CI=true without it).

Both bases run their engine under tests/bases/engine_probe.py, which watches /health from the first
moment, sends one battery of requests once it answers 200, and prints the results as JSON. Both are
launched alike (the same engine arguments, the real launch's context length among them). Compared:
/health during load and after (status, content type, body), status codes, content types, the JSON
shape of every answer and of every SSE chunk (keys and types, not values; a body that is not JSON
whole), an error's type, param and code (not its wording), how a stream ends (the last chunk's shape;
the last chunk with choices: its shape, finish_reason and whether it carries text), usage, the log
lines the baked grammar reads (images/vllm.yaml: the load line marks readiness; no baked error line
during normal serving, client errors included), load failures (exit code, which baked error lines, no
ready line, /health) and SIGTERM. Each difference is named with its case. Tests that use the stand-in
for speed (tests/worker, the gate's quick images) rely only on what this test covers.

The real vLLM is ~4 GB and both cores while it loads, so the launches run two at a time at most.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bakery.spec.engine_facts import engine_facts
from bakery.spec.engine_spec import EXIT_LINE
from tests.bases.conftest import logs, wait_for

PROBE = (Path(__file__).with_name("engine_probe.py")).read_text()
SPEC = engine_facts("vllm")
MODEL = SPEC.local_model or ""
REAL_ARGS = SPEC.local_env[SPEC.args_var].split()
SERVE = ["vllm", "serve", "{model}", "--host", "127.0.0.1", "--port", "18000"]
START_BOUND = 900  # seconds for a launch to answer or exit: ~60 s here, several times that when busy
# The baked lines bakery itself writes are not the engine's: leave them out of the comparison.
ERROR_LINES = [line for line in SPEC.error_lines if line != EXIT_LINE.format(name=SPEC.program)]

CASES: list[dict[str, Any]] = [
    {"name": "completion", "path": "/v1/completions",
     "body": {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}},
    {"name": "chat", "path": "/v1/chat/completions",
     "body": {"model": MODEL, "messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 8,
              "temperature": 0}},
    {"name": "chat stream", "path": "/v1/chat/completions",
     "body": {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 6,
              "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}},
    {"name": "completion stream", "path": "/v1/completions",
     "body": {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "stream": True,
              "stream_options": {"include_usage": True}}},
    {"name": "models", "method": "GET", "path": "/v1/models"},
    {"name": "max_tokens over the context", "path": "/v1/completions",
     "body": {"model": MODEL, "prompt": "Hi", "max_tokens": 100000}},
    {"name": "unknown model", "path": "/v1/completions",
     "body": {"model": "no-such-model", "prompt": "Hi", "max_tokens": 4}},
    {"name": "invalid JSON", "path": "/v1/chat/completions", "raw": '{"model": '},
    {"name": "chat without messages", "path": "/v1/chat/completions", "body": {"model": MODEL}},
    {"name": "completion without prompt", "path": "/v1/completions", "body": {"model": MODEL, "max_tokens": 4}},
    {"name": "completion stream without usage", "path": "/v1/completions",
     "body": {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "stream": True}},
    # Prompts longer than the context (2048 tokens): prose (~4,500 tokens), and numbers written without
    # a space (~9,000 tokens, one whitespace-separated word), in a completion and in a chat.
    {"name": "prose longer than the context", "path": "/v1/completions",
     "body": {"model": MODEL, "prompt": "The capital of France is Paris, and the capital of Italy is Rome. " * 300}},
    {"name": "numbers longer than the context", "path": "/v1/completions",
     "body": {"model": MODEL, "prompt": ",".join(str(i) for i in range(2000)), "max_tokens": 4}},
    {"name": "chat longer than the context", "path": "/v1/chat/completions",
     "body": {"model": MODEL, "messages": [{"role": "user", "content": ",".join(str(i) for i in range(2000))}],
              "max_tokens": 4}},
    {"name": "health", "method": "GET", "path": "/health"},
]


def probe_argv(model: str, extra: list[str]) -> list[str]:
    serve = [arg.replace("{model}", model) for arg in SERVE]
    return ["-c", PROBE, json.dumps(CASES), *serve, *extra]


def records(container: Any) -> list[dict[str, Any]]:
    return [json.loads(line[len("PROBE "):]) for line in logs(container).splitlines() if line.startswith("PROBE ")]


def finished(container: Any) -> bool:
    """The probe is done: the battery ran, or the engine exited before it could."""
    return any("battery_done" in r or "exit" in r or "timeout" in r for r in records(container))


class Pair:
    """The same launch on the stand-in and on the real vLLM."""

    def __init__(self, standin: Any, real: Any) -> None:
        self.standin, self.real = standin, real
        self.by = {"stand-in": standin, "real vLLM": real}

    def records(self) -> dict[str, list[dict[str, Any]]]:
        return {name: records(box) for name, box in self.by.items()}

    def log_text(self) -> dict[str, str]:
        return {name: logs(box) for name, box in self.by.items()}


@pytest.fixture(scope="module")
def launch(docker_client: Any, vllm_image: str) -> Iterator[Any]:
    from bakery.bases.make import ensure_base

    real_image = ensure_base(SPEC.local_base or "vllm-cpu")
    started: list[Any] = []

    def run(real_model: str, standin_env: dict[str, str] | None = None) -> Pair:
        for box in started:  # two at a time: the previous pair is done with
            box.remove(force=True)
        started.clear()
        standin_env = {"STANDIN_LOAD_SECONDS": "2", **(standin_env or {})}
        standin = docker_client.containers.run(vllm_image, probe_argv(MODEL, REAL_ARGS), detach=True,
                                               entrypoint=["python3"],
                                               network_mode="none", environment=standin_env)
        started.append(standin)
        real = docker_client.containers.run(real_image, probe_argv(real_model, REAL_ARGS), detach=True,
                                            entrypoint=["python3"], shm_size=SPEC.shm_size or "1g", network_mode="none")
        started.append(real)
        for name, box in (("stand-in", standin), ("real vLLM", real)):
            wait_for(lambda box=box: finished(box), START_BOUND, f"the {name} probe ({real_model})", interval=1)
        return Pair(standin, real)

    yield run
    for box in started:
        box.remove(force=True)


@pytest.fixture(scope="module")
def serving(launch: Any) -> Pair:
    return launch(MODEL)


def _health_states(found: list[dict[str, Any]]) -> list[str]:
    # "200 <body>" and "503 <body>" keep their status and body; refusals collapse into one state.
    return [r["health"] for r in found if "health" in r]


def test_health_during_load_and_after(serving: Pair) -> None:
    found = serving.records()
    states = {name: _health_states(rows) for name, rows in found.items()}
    assert states["stand-in"] == states["real vLLM"], f"/health while loading differs: {states}"
    after = {name: next(r["health_after"] for r in rows if "health_after" in r) for name, rows in found.items()}
    assert after["stand-in"] == after["real vLLM"], f"/health after the requests differs: {after}"


def _differences(standin: dict[str, Any], real: dict[str, Any]) -> list[str]:
    name, found = real["case"], []
    for key in ("status", "type", "shape", "body", "done", "error", "last_chunk", "finish_chunk"):
        if standin.get(key) != real.get(key):
            found.append(f"{name}: {key}: stand-in {standin.get(key)!r}, real vLLM {real.get(key)!r}")
    if "chunks" in real:
        kinds = {json.dumps(c, sort_keys=True) for c in real["chunks"]}
        standin_kinds = {json.dumps(c, sort_keys=True) for c in standin.get("chunks", [])}
        for kind in sorted(kinds - standin_kinds):
            found.append(f"{name}: a chunk of the real vLLM the stand-in never sends: {kind}")
        for kind in sorted(standin_kinds - kinds):
            found.append(f"{name}: a chunk of the stand-in the real vLLM never sends: {kind}")
    if (standin.get("usage") is None) != (real.get("usage") is None):
        found.append(f"{name}: usage: stand-in {standin.get('usage')!r}, real vLLM {real.get('usage')!r}")
    return found


def test_answers_match_in_status_and_shape(serving: Pair) -> None:
    found = serving.records()
    cases = {name: {r["case"]: r for r in rows if "case" in r} for name, rows in found.items()}
    assert set(cases["real vLLM"]) == {case["name"] for case in CASES}, f"the real vLLM's probe: {found['real vLLM']}"
    differences = [diff for case in CASES
                   for diff in _differences(cases["stand-in"].get(case["name"], {}), cases["real vLLM"][case["name"]])]
    assert not differences, "the stand-in differs from the real vLLM:\n" + "\n".join(differences)


def test_real_answers_are_real(serving: Pair) -> None:
    # The comparison above holds only if the real engine answered: text, and usage that adds up.
    cases = {r["case"]: r for r in serving.records()["real vLLM"] if "case" in r}
    for name in ("completion", "chat"):
        assert cases[name]["status"] == 200, cases[name]
        usage = cases[name]["usage"]
        assert usage["completion_tokens"] > 0 and usage["total_tokens"] == usage["prompt_tokens"] + \
            usage["completion_tokens"], usage
    stream = cases["chat stream"]
    assert stream["done"] and stream["text"].strip() and stream["usage"]["completion_tokens"] == 6, stream


def test_baked_grammar_on_normal_serving(serving: Pair) -> None:
    # The load line marks the engine ready, and no baked error line shows while it serves (the 4xx
    # answers of the battery included): either would leave the worker reading the wrong state.
    for name, text in serving.log_text().items():
        assert any(line in text for line in SPEC.load_lines), f"{name}: no load line {SPEC.load_lines}"
        printed = [line for line in ERROR_LINES if line in text]
        assert not printed, f"{name}: baked error lines printed during normal serving: {printed}\n{text[-3000:]}"


def test_sigterm_ends_both_cleanly(serving: Pair) -> None:
    for box in serving.by.values():
        box.stop(timeout=30)
    stopped = {name: next((r for r in rows if "stopped" in r), None) for name, rows in serving.records().items()}
    assert stopped["real vLLM"] is not None and stopped["stand-in"] is not None, stopped
    assert stopped["stand-in"]["stopped"] == stopped["real vLLM"]["stopped"] == 0, stopped


@pytest.mark.parametrize("real_model", ["/models/missing", "/models/SmolLM2-135M-Instruct-truncated"])
def test_load_failure(real_model: str, launch: Any) -> None:
    # The stand-in's one failure (STANDIN_FAIL_LOAD: vLLM's engine-core failure) against each way the
    # real vLLM fails here: the same exit, never ready, /health never 200, and the baked error lines
    # the worker reads (not necessarily the same ones: a missing model fails before the engine core).
    pair = launch(real_model, {"STANDIN_FAIL_LOAD": "1"})
    found = pair.records()
    exits = {name: next((r["exit"] for r in rows if "exit" in r), None) for name, rows in found.items()}
    assert exits["stand-in"] == exits["real vLLM"] == 1, f"exit codes: {exits}"
    for name, rows in found.items():
        assert not any(str(r.get("health", "")).startswith("200") for r in rows), f"{name}: /health 200"
    texts = pair.log_text()
    printed = {name: [line for line in ERROR_LINES if line in text] for name, text in texts.items()}
    assert printed["real vLLM"], f"the real vLLM printed none of {ERROR_LINES}:\n{texts['real vLLM'][-3000:]}"
    assert printed["stand-in"], f"the stand-in printed none of {ERROR_LINES}"
    if real_model.endswith("truncated"):  # the failure the stand-in reproduces: the same lines
        assert printed["stand-in"] == printed["real vLLM"], f"baked error lines differ: {printed}"
    for name, text in texts.items():
        assert not any(line in text for line in SPEC.load_lines), f"{name}: a load line on a failed load"
