"""The image entry point's boot rules, run on the host (no Docker): engine argv, launch variable
checks, MODEL_LOG rotation, strict SERVERLESS, the engine's program name. tests/worker/test_entrypoint_argv.py
runs the real entry point, tests/worker/test_supervise.py its supervision of the engine and the worker."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shlex
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bakery.spec.engine_spec import REPO_ROOT

spec = importlib.util.spec_from_file_location("entrypoint", REPO_ROOT / "worker" / "boot" / "entrypoint.py")
entrypoint = importlib.util.module_from_spec(spec)
spec.loader.exec_module(entrypoint)

LLAMA_CMD = json.dumps(["/app/llama-server", "-m", "${LLAMA_MODEL}", "--host", "127.0.0.1", "--port", "18000"])


def test_engine_argv_fills_the_model_and_appends_split_args(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BAKERY_ENGINE_CMD", LLAMA_CMD)
    monkeypatch.setenv("BAKERY_ENGINE_ARGS_VAR", "LLAMA_ARGS")
    monkeypatch.setenv("LLAMA_MODEL", "/models/my model.gguf")
    monkeypatch.setenv("LLAMA_ARGS", "-c 2048 --alias 'my alias'")
    assert entrypoint.engine_argv() == ["/app/llama-server", "-m", "/models/my model.gguf", "--host", "127.0.0.1",
                                        "--port", "18000", "-c", "2048", "--alias", "my alias"]


def test_missing_model_is_a_boot_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BAKERY_ENGINE_CMD", LLAMA_CMD)
    monkeypatch.delenv("LLAMA_MODEL", raising=False)
    with pytest.raises(entrypoint.BootError, match="LLAMA_MODEL is not set"):
        entrypoint.engine_argv()


def test_unsplittable_args_are_a_boot_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BAKERY_ENGINE_CMD", LLAMA_CMD)
    monkeypatch.setenv("BAKERY_ENGINE_ARGS_VAR", "LLAMA_ARGS")
    monkeypatch.setenv("LLAMA_MODEL", "m")
    monkeypatch.setenv("LLAMA_ARGS", "--alias 'unterminated")
    with pytest.raises(entrypoint.BootError, match="LLAMA_ARGS"):
        entrypoint.engine_argv()


@pytest.mark.parametrize("value, expected", [("true", True), ("TRUE", True), ("1", True), ("", False),
                                             ("false", False), ("0", False)])
def test_serverless_flag(monkeypatch: pytest.MonkeyPatch, value: str, expected: bool) -> None:
    monkeypatch.setenv("SERVERLESS", value)
    assert entrypoint.flag("SERVERLESS") is expected


def test_serverless_typo_is_not_silently_false(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVERLESS", "ture")
    with pytest.raises(entrypoint.BootError, match="SERVERLESS='ture'"):
        entrypoint.flag("SERVERLESS")


def test_rotation_keeps_the_previous_boot_and_starts_empty(tmp_path: Path) -> None:
    log = tmp_path / "portal" / "llama.log"
    log.parent.mkdir()
    log.write_text("main: model loaded\n")
    entrypoint.rotate(log)
    assert log.read_text() == ""
    assert (tmp_path / "portal" / "llama.log.1").read_text() == "main: model loaded\n"


def test_empty_model_log_falls_back_to_the_engine_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_LOG", "")
    monkeypatch.setenv("BACKEND", "openai")
    monkeypatch.setenv("BAKERY_ENGINE_PROGRAM", "vllm")  # baked by the vllm image
    assert str(entrypoint.model_log(entrypoint.engine_name(entrypoint.backend()))) == "/var/log/portal/vllm.log"


@pytest.mark.parametrize("backend, program", [("vllm", "vllm"), ("openai", "vllm"), ("llama", "llama"),
                                              ("sglang", "sglang")])
def test_backend_names_a_worker_and_the_engine_program(monkeypatch: pytest.MonkeyPatch, backend: str,
                                                       program: str) -> None:
    # The program comes from what the image bakes (its spec's name), never from a table of aliases.
    monkeypatch.setenv("BACKEND", backend)
    monkeypatch.setenv("BAKERY_ENGINE_PROGRAM", program)
    assert entrypoint.engine_name(entrypoint.backend()) == program


@pytest.mark.parametrize("value", ["", " vllm", "vllm\n[program:x]", "VLLM", "nope", "../vllm", "workers",
                                   "vllm;x", "__pycache__"])
def test_backend_without_a_worker_is_refused_naming_the_valid_ones(monkeypatch: pytest.MonkeyPatch,
                                                                   value: str) -> None:
    monkeypatch.setenv("BACKEND", value)
    with pytest.raises(entrypoint.BootError, match=r"^BACKEND=.*(names no worker|control character)") as err:
        entrypoint.backend()
    assert "\n" not in str(err.value)
    if "\n" not in value:
        assert "llama, openai, sglang, vllm" in str(err.value)


CONTROL = ["\n", "\r", "\t", "\x1b", "\x7f", "\x85", "\x0b", "\x0c"]


@pytest.mark.parametrize("char", CONTROL)
@pytest.mark.parametrize("var", ["LLAMA_MODEL", "LLAMA_ARGS", "MODEL_LOG", "BACKEND"])
def test_control_characters_in_a_launch_variable_are_refused(monkeypatch: pytest.MonkeyPatch, var: str,
                                                             char: str) -> None:
    monkeypatch.setenv("BAKERY_ENGINE_CMD", LLAMA_CMD)
    monkeypatch.setenv("BAKERY_ENGINE_ARGS_VAR", "LLAMA_ARGS")
    monkeypatch.setenv("LLAMA_MODEL", "/models/m.gguf")
    monkeypatch.setenv("LLAMA_ARGS", "-c 2048")
    monkeypatch.setenv("MODEL_LOG", "/var/log/portal/llama.log")
    monkeypatch.setenv("BACKEND", "llama")
    monkeypatch.setenv(var, os.environ[var] + char + "[program:evil]")
    with pytest.raises(entrypoint.BootError, match=f"^{var}=.*control character U\\+{ord(char):04X}") as err:
        entrypoint.engine_name(entrypoint.backend())
        entrypoint.model_log("llama")
        entrypoint.engine_argv()
    assert len(str(err.value).splitlines()) == 1


def test_control_characters_in_serverless_or_the_baked_command_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVERLESS", "true\n")
    with pytest.raises(entrypoint.BootError, match=r"^SERVERLESS=.*control character U\+000A"):
        entrypoint.flag("SERVERLESS")
    monkeypatch.setenv("BAKERY_ENGINE_CMD", json.dumps(["/app/llama-server", "--x", "a\nb"]))
    with pytest.raises(entrypoint.BootError, match=r"^BAKERY_ENGINE_CMD=.*control character U\+000A"):
        entrypoint.engine_argv()


@pytest.mark.parametrize("value, expected", [
    ("--chat-template 'x ;y'", ["--chat-template", "x ;y"]),
    ("--chat-template 'x #y'", ["--chat-template", "x #y"]),
    ("--alias \"100% sure\" --x '%(here)s'", ["--alias", "100% sure", "--x", "%(here)s"]),
    ("--name 'ünï ∂ 模型' --q '\"'", ["--name", "ünï ∂ 模型", "--q", '"']),
    ("--a=b;c --d #e", ["--a=b;c", "--d", "#e"]),  # no comment syntax: # and ; are plain characters
])
def test_args_split_like_a_shell_and_pass_exactly(monkeypatch: pytest.MonkeyPatch, value: str,
                                                  expected: list[str]) -> None:
    monkeypatch.setenv("BAKERY_ENGINE_CMD", LLAMA_CMD)
    monkeypatch.setenv("BAKERY_ENGINE_ARGS_VAR", "LLAMA_ARGS")
    monkeypatch.setenv("LLAMA_MODEL", "m ;#%'\"")
    monkeypatch.setenv("LLAMA_ARGS", value)
    argv = entrypoint.engine_argv()
    assert argv[2] == "m ;#%'\"" and argv[7:] == expected


@settings(max_examples=200, deadline=None)
@given(model=st.text(st.characters(blacklist_categories=["Cc", "Cs"]), min_size=1),
       args=st.lists(st.text(st.characters(blacklist_categories=["Cc", "Cs"]))))
def test_any_printable_model_and_args_reach_the_argv_exactly(model: str, args: list[str]) -> None:
    """Whatever a model variable holds becomes one argument; shell-quoted args come back exactly."""
    env = {"BAKERY_ENGINE_CMD": LLAMA_CMD, "BAKERY_ENGINE_ARGS_VAR": "LLAMA_ARGS", "LLAMA_MODEL": model,
           "LLAMA_ARGS": shlex.join(args)}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        argv = entrypoint.engine_argv()
    assert argv == ["/app/llama-server", "-m", model, "--host", "127.0.0.1", "--port", "18000", *args]


@pytest.mark.parametrize("name", ["Llama", "llama;x", "llama x", "worker", "../x", "x/y"])
def test_a_baked_program_that_cannot_name_the_engine_is_refused(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    # The name goes into the container's log lines and RUN_DIR/<name>.pid: lowercase letters, digits, _ and -.
    monkeypatch.setenv("BAKERY_ENGINE_PROGRAM", name)
    with pytest.raises(entrypoint.BootError, match="cannot name the engine program"):
        entrypoint.engine_name("llama")


@pytest.mark.parametrize(("name", "raw"), [("BAKERY_EXIT_GRACE", "10s"), ("BAKERY_DRAIN_TIMEOUT", "-1")])
def test_the_shared_seconds_are_read_by_the_workers_rule(monkeypatch: pytest.MonkeyPatch, name: str,
                                                          raw: str) -> None:
    monkeypatch.setenv(name, raw)
    with pytest.raises(entrypoint.BootError, match=f"^{name}={raw!r} is not a number of seconds from 0 to 3600"):
        entrypoint.seconds(name)
    monkeypatch.setenv(name, " 2.5 ")
    assert entrypoint.seconds(name) == 2.5


def test_an_engine_without_an_adapter_runs_as_its_baked_program(monkeypatch: pytest.MonkeyPatch) -> None:
    # An outside engine's image bakes BAKERY_ENGINE_PROGRAM=echo and has no workers/echo/: the
    # generic worker runs it (start_server.sh), so the entry point accepts exactly that name.
    monkeypatch.setenv("BAKERY_ENGINE_PROGRAM", "echo")
    monkeypatch.setenv("BACKEND", "echo")
    assert entrypoint.engine_name(entrypoint.backend()) == "echo"
    monkeypatch.setenv("BACKEND", "ech0")
    with pytest.raises(entrypoint.BootError, match=r"^BACKEND='ech0' names no worker of this image: .*\becho\b"):
        entrypoint.backend()


def test_the_boot_runs_on_the_standard_library_alone() -> None:
    """The entry point, its supervision and the health check import the stdlib and the worker's
    stdlib-only config and stages, nothing installed: PID 1 starts fast and needs no package."""
    allowed = set(sys.stdlib_module_names) | {"supervise", "driver", "config", "logs"}
    for path in sorted((REPO_ROOT / "worker" / "boot").glob("*.py")):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
        imported.discard("__future__")
        assert imported <= allowed, f"{path.name} imports {sorted(imported - allowed)}"
        worker = {f"{node.module}.{alias.name}" for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                  if isinstance(node, ast.ImportFrom) and node.module in ("config", "logs") for alias in node.names}
        assert worker <= {"config.table", "logs.stages"}, (path.name, worker)


def test_the_stop_signals_are_held_before_anything_else_runs() -> None:
    """As PID 1 an unhandled SIGTERM is dropped: the entry point blocks the stop signals (which
    supervise.py unblocks once its handlers are in) before any other import or statement, and only
    when run as the program (a test importing it must not pass a blocked mask to its children)."""
    tree = ast.parse((REPO_ROOT / "worker" / "boot" / "entrypoint.py").read_text())
    body = [node for node in tree.body if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
    first = [ast.unparse(node) for node in body[:3]]
    assert first[:2] == ["from __future__ import annotations", "import signal"], first
    guard = body[2]
    assert isinstance(guard, ast.If) and ast.unparse(guard.test) == "__name__ == '__main__'", first
    assert [ast.unparse(node) for node in guard.body] == [
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})"]
    supervise = (REPO_ROOT / "worker" / "boot" / "supervise.py").read_text()
    assert "STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)" in supervise
    assert "signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)" in supervise
