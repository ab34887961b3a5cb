"""Round trip: a hostile corpus of baked values reaches a real container byte for byte, and the
worker reads the log-line lists back as the same lists; what cannot arrive exactly is refused."""

from __future__ import annotations

import json

import pytest
import yaml

from bakery.bases import make as bases
from bakery.build.builder import build_image
from bakery.errors import InputError
from bakery.recipe.render import RenderOptions, baked_env, render
from bakery.spec.engine_spec import IMAGES_DIR, parse_spec

HOSTILE_SCALARS = {
    "X_QUOTES": """it's "double" and 'single'""",
    "X_DOLLAR": "$HOME ${PATH} $$ \\$ $(id) `id`",
    "X_BACKSLASH": "C:\\path\\ \\n \\t ends with \\",
    "X_HASH": "# not a comment #",
    "X_UNICODE": "é ✓ 中文 🚀 \u2028 \u0085 \ufeff",
    "X_BLANKS": "  lead and trail  ",
    "X_TABS": "\ttab\t",
    "X_EMPTY": "",
    "X_EQUALS": "a=b=c",
    "X_CONTINUATION": "ends like a continuation \\",
    "X_JSONISH": '["not", "a list"]',
    "X_CONTROL": "bell\x07 esc\x1b del\x7f",
}
HOSTILE_LISTS = {
    "MODEL_LOAD_LOG_MSG": ["it's \"ready\"", "$READY \\ back\\slash"],
    # The spec requires the entry point's own exit line among the error lines; the rest is hostile.
    "MODEL_ERROR_LOG_MSGS": ["INFO exited: vllm", "tab\tinside", "unicode ✗ 中", "[bracket] line", "# hash", "a, b",
                             "\\n literal"],
    "MODEL_INFO_LOG_MSGS": ['"message":"Download', "{\"json\": true}"],
}
REFUSED = {"X_NEWLINE": "two\nlines", "X_CR": "carriage\rreturn", "X_NUL": "nul\x00byte"}


def hostile_spec(extra: dict[str, str]):
    data = yaml.safe_load((IMAGES_DIR / "vllm.yaml").read_text())
    data["bake"]["env"].update(HOSTILE_LISTS)
    data["bake"]["env"].update(extra)
    # The upstream section declares where vLLM's real lines come from; these lines are made up.
    data.pop("upstream", None)
    return parse_spec(data, "tests/image/test_round_trip.py (hostile vllm)")


@pytest.mark.parametrize("name", list(REFUSED))
def test_unrepresentable_values_are_refused_at_render(name: str) -> None:
    with pytest.raises(InputError, match=name):
        hostile_spec({name: REFUSED[name]})


def test_hostile_values_arrive_byte_for_byte(docker_client) -> None:
    spec = hostile_spec(HOSTILE_SCALARS)
    bases.ensure_base("debian")
    rendered = render(spec, RenderOptions(base_image=bases.ensure_base(spec.base.local)))
    image_id = build_image(rendered, lambda _m: None).image_id
    try:
        expected = baked_env(spec)
        config = dict(item.split("=", 1) for item in docker_client.images.get(image_id).attrs["Config"]["Env"])
        assert {name: config.get(name) for name in expected} == expected
        # Inside a container, as the worker's process sees it; and the worker's own list parser.
        probe = (
            "import json, os, sys; sys.path.insert(0, '/opt/bakery/worker'); "
            "from config.table import parse_lines; "
            "lists = {n: parse_lines(os.environ[n]) for n in "
            "('MODEL_LOAD_LOG_MSG', 'MODEL_ERROR_LOG_MSGS', 'MODEL_INFO_LOG_MSGS')}; "
            "print(json.dumps({'env': dict(os.environ), 'lists': lists}))"
        )
        out = docker_client.containers.run(image_id, ["-c", probe], entrypoint="/opt/bakery/venv/bin/python",
                                           remove=True)
        seen = json.loads(out)
        assert {name: seen["env"].get(name) for name in expected} == expected
        assert seen["lists"] == HOSTILE_LISTS
    finally:
        docker_client.images.remove(image_id, force=True)
