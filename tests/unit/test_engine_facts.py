"""bakery.spec.engine_facts: each fact derived from the specs, including for an engine the repo does not have."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from bakery.errors import InputError
from bakery.spec import engine_facts
from bakery.spec.engine_spec import IMAGES_DIR, available_engines


def test_facts_of_the_repository_engines() -> None:
    llama = engine_facts.engine_facts("llama")
    assert (llama.program, llama.exit_line, llama.model_var) == ("llama", "INFO exited: llama", "LLAMA_MODEL")
    assert llama.launch_env(llama.local_model) == {"LLAMA_MODEL": "/models/SmolLM2-135M-Instruct.Q4_1.gguf"}
    assert llama.fail_load_env == {"LLAMA_MODEL": "/models/missing.gguf"}
    vllm = engine_facts.engine_facts("vllm")
    assert vllm.fail_load_envs == ({"VLLM_MODEL": "/models/missing"},
                                   {"VLLM_MODEL": "/models/SmolLM2-135M-Instruct-truncated"})
    assert vllm.fail_load_env == vllm.fail_load_envs[0]
    assert (vllm.shm_size, vllm.max_launches) == ("1g", 2)
    assert vllm.local_env == {"VLLM_ARGS": "--max-model-len 2048 --dtype float32 --enforce-eager"}
    assert engine_facts.engine_facts("sglang").fail_load_env == {"STANDIN_FAIL_LOAD": "1"}
    assert engine_facts.backend_aliases() == {"openai": "vllm"}
    programs = engine_facts.backend_programs()
    # Every engine of images/ is there (a fourth is one more YAML file); these are the repository's three.
    assert set(programs) == set(available_engines()) | {"openai"}
    assert {name: programs[name] for name in ("llama", "sglang", "vllm", "openai")} == \
        {"llama": "llama", "sglang": "sglang", "vllm": "vllm", "openai": "vllm"}


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
    own = sorted(engine_facts.engine_facts(name).model_var for name in available_engines())
    assert engine_facts.model_id_vars(images) == ("MODEL_NAME", *sorted([*own, "ECHO_MODEL"]))
    assert engine_facts.backend_programs(images)["echoes"] == "echo"
    echo = engine_facts.engine_facts("echo", images)
    assert (echo.exit_line, echo.load_lines, echo.backend) == ("INFO exited: echo", ("up",), "echo")


def test_unknown_engine_names_the_fix() -> None:
    with pytest.raises(InputError, match="unknown engine 'tgi': choose one of llama, sglang, vllm"):
        engine_facts.engine_facts("tgi")


def test_a_base_whose_model_is_not_known_never_gets_the_local_model(monkeypatch: pytest.MonkeyPatch) -> None:
    # A team's own base (--base-image) serves the model --base-model names, or none known: the gate
    # then sets a placeholder the entry point boots with (never the local base's model, which that
    # base does not have), and its serve checks do not run.
    from bakery.build.verify import GATE_BASE_VAR, GATE_MODEL_VAR
    from bakery.spec.engine_spec import load_engine
    from tests.image.launch import UNNAMED_MODEL, gate_model, serverless_env

    vllm = load_engine("vllm")
    model_var = engine_facts.facts(vllm).model_var
    assert engine_facts.facts(vllm).launch_env(None) == {}
    monkeypatch.setenv(GATE_BASE_VAR, "custom")
    monkeypatch.delenv(GATE_MODEL_VAR, raising=False)
    assert gate_model(vllm) is None and serverless_env(vllm)[model_var] == UNNAMED_MODEL
    monkeypatch.setenv(GATE_MODEL_VAR, "/team/model")
    assert serverless_env(vllm)[model_var] == "/team/model"
    monkeypatch.setenv(GATE_BASE_VAR, "production")
    assert serverless_env(vllm)[model_var] == engine_facts.facts(vllm).local_model
