"""The image entry point's boot rules, run on the host (no Docker): engine argv, MODEL_LOG rotation,
strict SERVERLESS, the supervisord configuration."""

from __future__ import annotations

import configparser
import importlib.util
import json
from pathlib import Path

import pytest

from bakery.spec import REPO_ROOT

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
    assert str(entrypoint.model_log()) == "/var/log/portal/vllm.log"


@pytest.mark.parametrize("serverless", [True, False])
def test_supervisor_config(serverless: bool) -> None:
    text = entrypoint.supervisor_config("llama", ["/app/llama-server", "-m", "/m/100%.gguf"],
                                        Path("/var/log/portal/llama.log"), serverless)
    parser = configparser.RawConfigParser()
    parser.read_string(text)
    assert parser.get("program:llama", "command") == "/app/llama-server -m /m/100%%.gguf"  # % escaped
    assert parser.get("program:llama", "stdout_logfile") == "/var/log/portal/llama.log"
    assert parser.has_section("program:worker") is serverless
    assert parser.has_section("eventlistener:bakery-watch")
