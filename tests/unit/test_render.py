"""Rendering: the bake reaches the Dockerfile exactly, templates are strict, and a 4th engine is data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from bakery.errors import InputError
from bakery.recipe import render as render_mod
from bakery.recipe.render import RenderOptions, baked_env, render
from bakery.spec.engine_spec import IMAGES_DIR, available_engines, load_engine, load_spec_file, parse_spec
from bakery.spec.secrets import secret_reason, secret_value_reason
from tests.unit.dockerfile_model import env_of, instructions

ENGINES = available_engines()


@pytest.mark.parametrize("engine", ENGINES)
def test_rendered_bake_matches_the_spec(engine: str) -> None:
    spec = load_engine(engine)
    rendered = render(spec)
    env = env_of(rendered.dockerfile)
    for name, value in spec.bake.env.items():
        want = json.dumps(value, ensure_ascii=False, separators=(",", ":")) if isinstance(value, list) else value
        assert env[name] == want
    assert json.loads(env["BAKERY_ENGINE_CMD"]) == spec.engine.command
    assert "18000" in json.loads(env["BAKERY_ENGINE_CMD"])
    assert ("EXPOSE", "3000") in instructions(rendered.dockerfile)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_image_stage_is_ordered_for_the_layer_cache(engine: str) -> None:
    """Engine layers, then what never changes, then the venv, labels, worker code and bake, in that
    order: a worker change re-runs the last 2 steps and a bake change only the last one."""
    final = instructions(render(load_engine(engine)).dockerfile)
    kinds = [ins for ins, _ in final]
    venv = next(i for i, (ins, args) in enumerate(final) if ins == "COPY" and args.startswith("--from=worker-build"))
    assert kinds[0] == "FROM"
    assert {"EXPOSE", "WORKDIR", "ENTRYPOINT"} <= set(kinds[:venv])
    assert kinds[venv + 1:] == ["ARG", "ARG", "LABEL", "COPY", "ENV"]
    assert final[-2][1] == "--from=worker-build /opt/bakery-worker/ /opt/bakery/worker/" and "BACKEND=" in final[-1][1]
    assert "BAKERY_ENGINE_CMD=" in final[-1][1]  # one ENV step for the whole bake


@pytest.mark.parametrize("engine", ENGINES)
def test_labels_are_rendered(engine: str) -> None:
    text = render(load_engine(engine)).dockerfile
    for label in ("org.opencontainers.image.title", "org.opencontainers.image.source",
                  "org.opencontainers.image.revision", "org.opencontainers.image.version",
                  "org.opencontainers.image.created", "org.opencontainers.image.base.name", "ai.bakery.backend"):
        assert label in text


def test_base_image_override() -> None:
    rendered = render(load_engine("vllm"), RenderOptions(base_image="example/base:1"))
    assert ("FROM", "example/base:1") in instructions(rendered.dockerfile)


def test_undefined_template_variable_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "strict.Dockerfile.j2").write_text('{% extends "base.Dockerfile.j2" %}{% block engine %}'
                                                   "RUN echo {{ no_such_thing }}{% endblock %}")
    data = yaml.safe_load((IMAGES_DIR / "vllm.yaml").read_text())
    data["template"] = "strict.Dockerfile.j2"
    with pytest.raises(InputError, match=f"^{tmp_path}/strict.Dockerfile.j2: undefined variable: 'no_such_thing'"):
        render(parse_spec(data, "images/vllm.yaml"), RenderOptions(templates_dir=tmp_path))


def test_missing_template_is_one_clear_line() -> None:
    data = yaml.safe_load((IMAGES_DIR / "vllm.yaml").read_text())
    data["template"] = "nope.Dockerfile.j2"
    with pytest.raises(InputError, match=r"templates/nope\.Dockerfile\.j2 does not exist"):
        render(parse_spec(data, "images/vllm.yaml"))


def test_a_fourth_engine_is_one_yaml_file(tmp_path: Path) -> None:
    # docs/adding-an-engine.md's example: TGI-style engine, no template of its own.
    text = (IMAGES_DIR / "vllm.yaml").read_text().replace("name: vllm", "name: tgi")
    data = yaml.safe_load(text)
    data["template"] = "base.Dockerfile.j2"
    del data["aliases"]  # BACKEND=openai stays vLLM's
    data["engine"]["command"] = ["text-generation-launcher", "--model-id", "${TGI_MODEL}", "--port", "18000"]
    data["engine"].update(model_var="TGI_MODEL", args_var="TGI_ARGS")
    data["bake"]["env"].update(BACKEND="vllm", MODEL_LOG="/var/log/portal/tgi.log")
    path = tmp_path / "tgi.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    # Copied as it was, the exit line still names vllm: the worker would never see tgi exit.
    with pytest.raises(InputError, match="MODEL_ERROR_LOG_MSGS: must contain 'INFO exited: tgi'"):
        load_spec_file(path)
    data["bake"]["env"]["MODEL_ERROR_LOG_MSGS"] = ["INFO exited: tgi", "RuntimeError: Engine",
                                                 "Traceback (most recent call last):"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    rendered = render(load_spec_file(path))
    env = env_of(rendered.dockerfile)
    assert env["MODEL_LOG"] == "/var/log/portal/tgi.log"
    # The program and model variable are baked from the spec, so the image needs no table of engines.
    assert (env["BAKERY_ENGINE_PROGRAM"], env["BAKERY_MODEL_VAR"]) == ("tgi", "TGI_MODEL")


# ---- property: any representable bake value comes back exact from the rendered ENV ------------

# Representable text that is not a credential (by shape or, for names, by the catalogue): those are
# refused on purpose, see tests/unit/test_secrets.py.
value_text = st.text(st.characters(blacklist_characters="\n\r\x00", blacklist_categories=("Cs",)),
                     max_size=40).filter(lambda s: secret_value_reason(s) is None)
extra_name = st.from_regex(r"X_[A-Z0-9_]{1,8}", fullmatch=True).filter(lambda n: secret_reason(n) is None)
line_text = value_text.filter(lambda s: s and s.strip() == s)


@settings(max_examples=300, deadline=None)
@given(extra=st.dictionaries(extra_name, value_text, max_size=4),
       errors=st.lists(line_text, min_size=1, max_size=4), health=value_text.map(lambda s: "/" + s.replace(" ", "")))
def test_any_baked_value_round_trips_through_rendered_env(extra: dict, errors: list, health: str) -> None:
    data = yaml.safe_load((IMAGES_DIR / "llama.yaml").read_text())
    data["bake"]["env"].update(extra)
    errors = ["INFO exited: llama", *errors]  # the exit line is required (bakery's own)
    data["bake"]["env"]["MODEL_ERROR_LOG_MSGS"] = errors
    if not any(c.isspace() for c in health):
        data["bake"]["env"]["MODEL_HEALTH_ENDPOINT"] = health
    spec = parse_spec(data, "images/llama.yaml")
    rendered_env = env_of(render(spec).dockerfile)
    assert {k: rendered_env[k] for k in baked_env(spec)} == baked_env(spec)
    assert json.loads(rendered_env["MODEL_ERROR_LOG_MSGS"]) == errors
    for name, value in extra.items():
        assert rendered_env[name] == value


def test_a_template_cannot_print_a_value_that_skipped_the_one_path(tmp_path: Path) -> None:
    """render()'s Jinja environment refuses any {{ expression }} not made by bakery.spec.dockerfile_values,
    so an engine template that printed a raw spec value fails instead of baking it unquoted."""
    (tmp_path / "raw.Dockerfile.j2").write_text('{% extends "base.Dockerfile.j2" %}{% block engine %}'
                                                "RUN echo {{ bake_env[0][0] ~ '-raw' }}{% endblock %}")
    data = yaml.safe_load((IMAGES_DIR / "vllm.yaml").read_text())
    data["template"] = "raw.Dockerfile.j2"
    unsafe = rf"{tmp_path}/raw\.Dockerfile\.j2: .*did not pass through bakery\.spec\.dockerfile_values"
    with pytest.raises(InputError, match=unsafe):
        render(parse_spec(data, "images/vllm.yaml"), RenderOptions(templates_dir=tmp_path))


def test_the_real_environment_guards_every_expression() -> None:
    assert render_mod._environment().finalize is render_mod._finalize
