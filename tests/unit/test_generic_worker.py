"""An engine without its own worker adapter runs on the generic core with the values its image bakes;
outside an image it fails with one line naming what to set; a misspelt BACKEND still fails loudly."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bakery.recipe.render import baked_env
from bakery.spec.engine_spec import REPO_ROOT, load_engine

WORKER_DIR = REPO_ROOT / "worker"
sys.path.insert(0, str(WORKER_DIR))
generic = importlib.import_module("workers.openai.generic")
core = importlib.import_module("app.core")
worker_config = importlib.import_module("app.worker_config")


def echo_image_env() -> dict[str, str]:
    """What an image of an engine `echo` (no adapter) bakes: sglang's spec renamed."""
    spec = load_engine("sglang")
    env = baked_env(spec)
    env.update(BACKEND="echo", BAKERY_ENGINE_PROGRAM="echo", BAKERY_MODEL_VAR="ECHO_MODEL",
               MODEL_LOG="/var/log/portal/echo.log", MODEL_ERROR_LOG_MSGS='["INFO exited: echo","echo: fatal"]')
    return env


PLATFORM = {"CONTAINER_ID": "7", "REPORT_ADDR": "http://127.0.0.1:9", "PUBLIC_IPADDR": "127.0.0.1",
            "WORKER_PORT": "3000", "VAST_TCP_PORT_3000": "3000"}


def test_the_engine_and_its_facts_are_the_baked_values() -> None:
    env = echo_image_env()
    defaults = generic.defaults_from_env(env)
    assert defaults.engine == "echo"
    settings = worker_config.load_settings(defaults, {**env, **PLATFORM})
    assert (settings.engine, settings.model_log) == ("echo", "/var/log/portal/echo.log")
    assert settings.load_lines == ["The server is fired up and ready to roll!"]
    assert settings.error_lines == ["INFO exited: echo", "echo: fatal"]
    assert settings.healthcheck_url == "http://127.0.0.1:18000/health"


def test_the_baked_model_variable_is_the_model_id() -> None:
    env = {**echo_image_env(), "ECHO_MODEL": "org/echo-1b"}
    assert worker_config.resolve_model_id(env) == "org/echo-1b"
    assert worker_config.resolve_model_id({**env, "MODEL_NAME": "mine"}) == "mine"
    # before upstream's engine variables, whatever the engine: the image names its own
    assert worker_config.resolve_model_id({**env, "VLLM_MODEL": "other"}) == "org/echo-1b"
    assert worker_config.model_id_vars(env) == ("MODEL_NAME", "ECHO_MODEL", *worker_config.MODEL_ID_VARS[1:])
    # a baked name that is not a variable name is ignored; one of upstream's is not listed twice
    assert worker_config.model_id_vars({"BAKERY_MODEL_VAR": "A B"}) == worker_config.MODEL_ID_VARS
    assert worker_config.model_id_vars({"BAKERY_MODEL_VAR": "LLAMA_MODEL"}) == (
        "MODEL_NAME", "LLAMA_MODEL", "VLLM_MODEL", "SGLANG_MODEL")


def test_outside_an_image_one_line_names_what_to_set() -> None:
    with pytest.raises(generic.MissingBake) as info:
        generic.defaults_from_env({"BACKEND": "echo", "MODEL_LOG": "/tmp/echo.log"})
    assert str(info.value) == ("BACKEND=echo has no worker adapter (workers/echo/worker.py), so the worker runs on "
                               "the values an image bakes; set BAKERY_ENGINE_PROGRAM, MODEL_LOAD_LOG_MSG, "
                               "MODEL_ERROR_LOG_MSGS (see images/<engine>.yaml)")
    proc = subprocess.run([sys.executable, str(WORKER_DIR / "workers" / "openai" / "generic.py")],
                          env={"PATH": os.environ["PATH"], "PYTHONPATH": str(WORKER_DIR), "BACKEND": "echo"},
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("bakery-worker: error: BACKEND=echo has no")


def _start_server(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    fake_python = tmp_path / "python"
    fake_python.write_text('#!/bin/sh\necho "ran $1"\n')
    fake_python.chmod(0o755)
    full = {"PATH": os.environ["PATH"], "WORKER_STATE_DIR": str(tmp_path / "state"),
            "WORKER_PYTHON": str(fake_python), **env}
    return subprocess.run(["sh", str(WORKER_DIR / "start_server.sh")], env=full, capture_output=True, text=True,
                          timeout=30, check=False)


def test_start_server_runs_the_generic_worker_for_the_baked_program(tmp_path: Path) -> None:
    proc = _start_server(tmp_path, BACKEND="echo", BAKERY_ENGINE_PROGRAM="echo")
    assert (proc.returncode, proc.stdout.strip()) == (0, f"ran {WORKER_DIR}/workers/openai/generic.py")
    own = _start_server(tmp_path, BACKEND="vllm", BAKERY_ENGINE_PROGRAM="vllm")
    assert own.stdout.strip() == f"ran {WORKER_DIR}/workers/vllm/worker.py"  # an adapter wins


def test_a_misspelt_backend_still_fails_loudly(tmp_path: Path) -> None:
    proc = _start_server(tmp_path, BACKEND="ecko", BAKERY_ENGINE_PROGRAM="echo")
    assert proc.returncode == 2
    assert "BACKEND='ecko' is not a worker backend; valid: llama openai sglang vllm" in proc.stderr
