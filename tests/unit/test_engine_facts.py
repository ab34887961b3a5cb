"""bakery.spec.engine_facts: each fact derived from the specs, including for an engine the repo does not have."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from bakery.errors import InputError
from bakery.spec import engine_facts
from bakery.spec.engine_spec import IMAGES_DIR


def test_facts_of_the_repository_engines() -> None:
    llama = engine_facts.engine_facts("llama")
    assert (llama.program, llama.exit_line, llama.model_var) == ("llama", "INFO exited: llama", "LLAMA_MODEL")
    assert llama.launch_env() == {"LLAMA_MODEL": "/models/SmolLM2-135M-Instruct.Q4_1.gguf"}
    assert llama.fail_load_env == {"LLAMA_MODEL": "/models/missing.gguf"}
    assert engine_facts.engine_facts("vllm").fail_load_env == {"STANDIN_FAIL_LOAD": "1"}
    assert engine_facts.backend_aliases() == {"openai": "vllm"}
    assert engine_facts.backend_programs() == {"llama": "llama", "sglang": "sglang", "vllm": "vllm", "openai": "vllm"}


def _with_fifth(tmp_path: Path) -> Path:
    images = tmp_path / "images"
    shutil.copytree(IMAGES_DIR, images)
    data = yaml.safe_load((IMAGES_DIR / "sglang.yaml").read_text())
    data.update(name="echo", aliases=["echoes"])
    data["engine"].update(command=["echo-server", "${ECHO_MODEL}"], model_var="ECHO_MODEL", args_var="ECHO_ARGS")
    data["bake"]["env"].update(BACKEND="echo", MODEL_ERROR_LOG_MSGS=["INFO exited: echo"], MODEL_LOAD_LOG_MSG=["up"])
    data["upstream"] = {}
    (images / "echo.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return images


def test_a_fifth_engine_is_picked_up_from_its_yaml(tmp_path: Path) -> None:
    images = _with_fifth(tmp_path)
    assert engine_facts.model_id_vars(images) == ("MODEL_NAME", "ECHO_MODEL", "LLAMA_MODEL", "SGLANG_MODEL",
                                                  "VLLM_MODEL")
    assert engine_facts.backend_programs(images)["echoes"] == "echo"
    echo = engine_facts.engine_facts("echo", images)
    assert (echo.exit_line, echo.load_lines, echo.backend) == ("INFO exited: echo", ("up",), "echo")


def test_unknown_engine_and_missing_local_model_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown engine 'tgi': choose one of llama, sglang, vllm"):
        engine_facts.engine_facts("tgi")
    bare = engine_facts.engine_facts("vllm")
    no_local = engine_facts.EngineFacts(**{**bare.__dict__, "local_model": None})
    with pytest.raises(ValueError, match=r"images/vllm.yaml: base.local_model is not set"):
        no_local.launch_env()
