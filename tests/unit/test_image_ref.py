"""Image references: the grammar Docker parses FROM with (distribution/reference), accepted and refused."""

from __future__ import annotations

import pytest

from bakery.bases.make import BASES
from bakery.recipe.render import DEFAULT_RUNTIME_IMAGE
from bakery.spec.engine_spec import available_engines, load_engine
from bakery.spec.image_ref import ReferenceRefused, check_reference

DIGEST = "sha256:" + "0123456789abcdef" * 4

VALID = [
    "ubuntu", "ubuntu:22.04", "library/ubuntu:22.04", "ghcr.io/ggml-org/llama.cpp:server-b6550",
    "vllm/vllm-openai:v0.10.2", "lmsysorg/sglang:v0.5.2-cu126", "bakery-local/debian:bookworm",
    "localhost:5000/a/b:c", "127.0.0.1:5055/acme/x:tiny", "[::1]:5000/foo:bar", "Registry.Example.COM/x/y",
    f"ubuntu@{DIGEST}", f"ghcr.io/acme/base:1.0@{DIGEST}", "a__b/c--d.e_f", "x:UPPER_tag.1-2",
    "x@sha512:" + "0" * 128, "x:" + "t" * 128, "a" * 255,
]
INVALID = {
    "": "is empty",
    "ubuntu latest": "contains ' '",
    "ubuntu\n": "contains '\\n'",
    "ubuntu\x00": "contains '\\x00'",
    "${BASE}": "contains '$'",
    "ubuntu#1": "contains '#'",
    "ubuntu\\": "contains '\\\\'",
    "ubuntu\u00e9": "non-ASCII",
    "Ubuntu": "must be lower-case",
    "ghcr.io/Acme/x": "must be lower-case",
    ":latest": "has no repository name",
    "/ubuntu": "has no repository name",
    "ubuntu/": "has no repository name",
    f"@{DIGEST}": "has no repository name",
    "ubuntu@sha256:" + "a" * 63: "has 63 hex digits",
    "ubuntu@sha256:" + "a" * 65: "has 65 hex digits",
    "ubuntu@sha256:" + "g" * 64: "hex digits (0-9, a-f)",
    "ubuntu@sha256:" + "A" * 64: "lower-case hex",
    "ubuntu@md5:" + "a" * 32: "'md5' is not one of",
    "ubuntu:.x": "tag '.x' is invalid",
    "ubuntu:" + "t" * 129: "is invalid",
    "ubuntu:a:b": "does not follow",
    "-ubuntu": "does not follow",
    "a" * 256: "longer than 255",
    "a//b": "does not follow",
    "a..b": "does not follow",
}


@pytest.mark.parametrize("ref", VALID)
def test_valid_references_pass_unchanged(ref: str) -> None:
    assert check_reference(ref) == ref


@pytest.mark.parametrize("ref, why", list(INVALID.items()))
def test_invalid_references_say_why(ref: str, why: str) -> None:
    with pytest.raises(ReferenceRefused, match=None) as info:
        check_reference(ref)
    assert why in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


def test_every_reference_bakery_itself_uses_is_valid() -> None:
    # The local bases (--local), the runtime stage and every spec's production base reach FROM too.
    refs = [base.ref for base in BASES.values()] + [DEFAULT_RUNTIME_IMAGE]
    refs += [load_engine(name).base.image for name in available_engines()]
    assert [check_reference(ref) for ref in refs] == refs
