"""Exact quoting of baked values: property tests against a model of Docker's ENV lexer."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from bakery import dockerfile_values as dv

# Any text but the three characters no Dockerfile line can carry, and no lone surrogates.
representable = st.text(st.characters(blacklist_characters="\n\r\x00", blacklist_categories=("Cs",)))


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
