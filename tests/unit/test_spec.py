"""Spec loading: every bad input is one line naming the file and key, exit code 2 from build.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bakery.errors import InputError
from bakery.spec.engine_spec import IMAGES_DIR, REQUIRED_BAKE, available_engines, load_engine, load_spec_file
from bakery.spec.secrets import secret_reason

GOOD = (IMAGES_DIR / "llama.yaml").read_text()


def write(tmp_path: Path, text: str, name: str = "llama") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def mutate(tmp_path: Path, change) -> Path:
    data = yaml.safe_load(GOOD)
    change(data)
    return write(tmp_path, yaml.safe_dump(data, sort_keys=False))


def error_of(path: Path) -> str:
    with pytest.raises(InputError) as info:
        load_spec_file(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_the_three_engines_load_with_the_reference_values() -> None:
    assert {"llama", "sglang", "vllm"} <= set(available_engines())  # a fourth engine is one more file
    loads = {"llama": "model loaded", "vllm": "Application startup complete.",
             "sglang": "The server is fired up and ready to roll!"}
    for name, load_line in loads.items():
        spec = load_engine(name)
        env = spec.bake.env
        assert env["BACKEND"] == name
        assert env["MODEL_LOG"] == f"/var/log/portal/{name}.log"
        assert env["MODEL_LOAD_LOG_MSG"] == [load_line]
        assert env["MODEL_HEALTH_ENDPOINT"] == "/health"
        assert f"INFO exited: {name}" in env["MODEL_ERROR_LOG_MSGS"]
        assert env["MODEL_INFO_LOG_MSGS"] == ['"message":"Download']
        assert spec.bake.expose == [3000]


def test_unknown_engine_names_the_valid_ones() -> None:
    with pytest.raises(InputError, match="choose one of llama, sglang, vllm"):
        load_engine("tgi")


def test_broken_yaml_names_file_line_and_column(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, "name: llama\nbake: [unclosed\n"))
    assert message.startswith(f"{tmp_path}/llama.yaml:")
    assert "invalid YAML" in message


def test_duplicate_key_is_refused_not_silently_overwritten(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, GOOD + "\nname: llama\n"))
    assert "duplicate key 'name'" in message


def test_unknown_key(tmp_path: Path) -> None:
    message = error_of(mutate(tmp_path, lambda d: d["bake"].update(exposed=[3000])))
    assert message == f"{tmp_path}/llama.yaml: bake.exposed: unknown key"


def test_wrong_type(tmp_path: Path) -> None:
    message = error_of(mutate(tmp_path, lambda d: d.update(version=6550)))
    assert message.startswith(f"{tmp_path}/llama.yaml: version: must be a string")


def test_missing_key(tmp_path: Path) -> None:
    message = error_of(mutate(tmp_path, lambda d: d["engine"].pop("model_var")))
    assert message == f"{tmp_path}/llama.yaml: engine.model_var: missing required key"


@pytest.mark.parametrize("name", REQUIRED_BAKE)
def test_missing_baked_variable(tmp_path: Path, name: str) -> None:
    message = error_of(mutate(tmp_path, lambda d: d["bake"]["env"].pop(name)))
    assert message.endswith(f"bake.env: missing required variable {name}")


def test_model_log_must_be_absolute(tmp_path: Path) -> None:
    message = error_of(mutate(tmp_path, lambda d: d["bake"]["env"].update(MODEL_LOG="logs/llama.log")))
    assert message == f"{tmp_path}/llama.yaml: bake.env: MODEL_LOG: must be an absolute path"


def test_list_variable_must_be_a_list(tmp_path: Path) -> None:
    message = error_of(mutate(tmp_path, lambda d: d["bake"]["env"].update(MODEL_LOAD_LOG_MSG="model loaded")))
    assert "MODEL_LOAD_LOG_MSG: must be a list of log lines" in message


def test_typo_in_worker_variable_gets_a_suggestion(tmp_path: Path) -> None:
    message = error_of(mutate(tmp_path, lambda d: d["bake"]["env"].update(MODEL_LOAD_LOG_MSGS=["x"])))
    assert "did you mean MODEL_LOAD_LOG_MSG?" in message


@pytest.mark.parametrize("name", ["HF_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD",
                                  "MASTER_TOKEN", "hf_token", "GCP_CREDENTIALS"])
def test_secret_named_variable_is_refused(tmp_path: Path, name: str) -> None:
    message = error_of(mutate(tmp_path, lambda d: d["bake"]["env"].update({name: "x"})))
    assert f"bake.env: {name}: looks like a credential" in message
    assert "launch template at run time" in message


@pytest.mark.parametrize("name", ["BENCHMARK_MAX_TOKENS", "TOKENIZER_PATH", "MONKEY", "KEYBOARD_LAYOUT", "BACKEND"])
def test_ordinary_names_are_not_secrets(name: str) -> None:
    assert secret_reason(name) is None


def test_worker_port_must_be_exposed(tmp_path: Path) -> None:
    message = error_of(mutate(tmp_path, lambda d: d["bake"].update(expose=[8080])))
    assert "bake.expose: must include 3000" in message


def test_command_must_carry_the_model(tmp_path: Path) -> None:
    message = error_of(mutate(tmp_path, lambda d: d["engine"].update(command=["/app/llama-server"])))
    assert "engine: command must contain the token '${LLAMA_MODEL}'" in message


def test_name_must_match_file(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, GOOD, name="other"))
    assert "name: is 'llama' but the file is other.yaml" in message


def test_unrepresentable_value_is_refused(tmp_path: Path) -> None:
    message = error_of(mutate(tmp_path, lambda d: d["bake"]["env"].update(EXTRA="a\nb")))
    assert "bake.env: EXTRA: contains a newline" in message


# ---- engine facts (issue 13): stated once, in the spec ----------------------------------------------


# How upstream.lines refuses a declaration that names no place, or two kinds of place, or a file outside the tree.
ONE_PLACE = ("upstream.lines.model loaded: set either origin (who writes the line) or pattern and/or file (where the "
             "engine's source holds it)")
OUTSIDE = ("upstream.lines.model loaded: file {!r}: a relative path inside the source tree "
           "(e.g. tools/server/server.cpp)")


@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: d["base"].pop("local_model"),
     "base: local_model: required with base.local (the gate launches the local base with it)"),
    (lambda d: d["base"].pop("local_fail_load"),
     "base: local_fail_load: required with base.local (the gate launches the local base with it)"),
    (lambda d: d["base"].pop("local_long_answer"),
     "base: local_long_answer: required with base.local (the gate launches the local base with it)"),
    (lambda d: d["base"]["local_long_answer"].update(tokens=0),
     "base.local_long_answer.tokens: Input should be greater than 0"),
    (lambda d: d["base"].update(local_fail_load={}),
     "base.local_fail_load.0: set model (a model that cannot load) or env (variables that make loading fail)"),
    (lambda d: d["base"].update(local_fail_load=[]),
     "base.local_fail_load: an empty list: name at least one way loading fails, or leave the key out"),
    (lambda d: d["base"].update(local_shm_size="lots"),
     "base.local_shm_size: 'lots': a size as docker run --shm-size takes it (e.g. 512m, 1g)"),
    (lambda d: d["base"].update(local_launches=0),
     "base.local_launches: Input should be greater than 0"),
    (lambda d: d["base"]["local_route"].update(route="embeddings"),
     "base.local_route.route: 'embeddings': a worker route starts with /v1/ (docs/routes.md)"),
    (lambda d: d["base"]["local_route"].update(env={"LLAMA ARGS": "x"}),
     "base.local_route.env: env.LLAMA ARGS: not a valid environment variable name"),
    (lambda d: d["bake"]["env"].update(MODEL_ERROR_LOG_MSGS=["error loading model"]),
     "bake.env.MODEL_ERROR_LOG_MSGS: must contain 'INFO exited: llama', the line bakery's entry point writes "
     "when the engine exits (else the worker waits out its load timeout)"),
    (lambda d: d.update(aliases=["llama"]),
     "aliases: 'llama' must be another BACKEND name (lower-case letters, digits, '_')"),
    (lambda d: d.update(upstream={"lines": {"model ready": {"origin": "python"}}}),
     "upstream.lines: 'model ready' is not a baked load, error or stage line; remove it or bake it"),
    # llama.yaml declares where its stage lines come from: a stage line no longer baked may not stay declared.
    (lambda d: d["bake"]["env"].pop("BAKERY_WEIGHTS_LOADED_LOG_MSGS"),
     "upstream.lines: 'load_model: initializing' is not a baked load, error or stage line; remove it or bake it"),
    (lambda d: d.update(upstream={"lines": {"model loaded": {"origin": "python", "pattern": "x"}}}),
     ONE_PLACE),
    (lambda d: d.update(upstream={"lines": {"model loaded": {"origin": "python", "file": "server.cpp"}}}),
     ONE_PLACE),
    (lambda d: d.update(upstream={"lines": {"model loaded": {"why": "no place given"}}}),
     ONE_PLACE),
    (lambda d: d.update(upstream={"lines": {"model loaded": {"file": "../outside/server.cpp"}}}),
     OUTSIDE.format("../outside/server.cpp")),
    (lambda d: d.update(upstream={"lines": {"model loaded": {"file": "/abs/server.cpp"}}}),
     OUTSIDE.format("/abs/server.cpp")),
    (lambda d: d.update(upstream={"lines": {"model loaded": {"origin": "nginx"}}}),
     "upstream.lines.model loaded: origin 'nginx': choose one of bakery, supervisord, python, uvicorn"),
    (lambda d: d.update(upstream={"lines": {"model loaded": {"pattern": "("}}}),
     "upstream.lines.model loaded: pattern '(': not a regular expression: missing ), unterminated subpattern "
     "at position 0"),
    (lambda d: d["upstream"].update(releases={"pypi": "llama", "registry": "ghcr.io/x/y", "tag": "b{release}"}),
     "upstream.releases: set exactly one of pypi (a PyPI project) or registry (an image repository)"),
    (lambda d: d["upstream"].update(releases={"registry": "ghcr.io/ggml-org/llama.cpp", "tag": "server-latest"}),
     "upstream.releases: tag: with registry, the build's tag with {release} once (e.g. server-b{release})"),
    (lambda d: d["upstream"].update(releases={"pypi": "vllm", "tag": "v{release}"}),
     "upstream.releases: tag: only with registry (a PyPI release names no image tag)"),
    (lambda d: d["upstream"].update(releases={"pypi": "vllm", "version": "v1"}),
     "upstream.releases: version 'v1': must hold {release} once (e.g. v{release})"),
    (lambda d: d["upstream"].update(releases={"registry": "https://ghcr.io/x", "tag": "b{release}"}),
     "upstream.releases: registry 'https://ghcr.io/x': must be host/owner/name (e.g. ghcr.io/ggml-org/llama.cpp)"),
    (lambda d: d.update(upstream={"repository": "https://github.com/x/y"}),
     "upstream.repository: 'https://github.com/x/y': must be a GitHub owner/name"),
    (lambda d: d["bake"]["env"].update(BAKERY_ENGINE_PROGRAM="llama"),
     "bake.env: BAKERY_ENGINE_PROGRAM: is baked by bakery itself from the spec (name and engine:); remove it"),
])
def test_engine_facts_are_validated(tmp_path: Path, change, expected: str) -> None:
    assert error_of(mutate(tmp_path, change)) == f"{tmp_path}/llama.yaml: {expected}"
