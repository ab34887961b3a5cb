"""A small model of how Docker reads ENV instructions, to check rendered Dockerfiles without Docker.

The real engine is the authority: tests/image/test_round_trip.py builds real images from the same
values. This model lets hypothesis explore thousands of values in seconds.
"""

from __future__ import annotations

import re


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs of the final stage, continuation lines joined."""
    logical, current = [], ""
    for line in dockerfile.split("\n"):  # Docker splits on \n only (not \x85, \u2028, ...)
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if re.search(r"\\[ \t]*$", line):
            current += re.sub(r"\\[ \t]*$", "", line)
            continue
        logical.append(current + line)
        current = ""
    pairs = [(text.split(None, 1)[0].upper(), text.split(None, 1)[1] if " " in text.strip() else "")
             for text in logical]
    last_from = max(i for i, (ins, _) in enumerate(pairs) if ins == "FROM")
    return pairs[last_from:]


def split_words(args: str) -> list[str]:
    """Split `K=V K2="V 2"` into raw words, keeping the quotes (like Docker's word splitting)."""
    words, current, quote, i = [], "", None, 0
    while i < len(args):
        c = args[i]
        if quote is None and c in " \t":
            if current:
                words.append(current)
                current = ""
        elif quote is None and c in "'\"":
            quote = c
            current += c
        elif quote == c:
            quote = None
            current += c
        elif quote == '"' and c == "\\" and i + 1 < len(args):
            current += c + args[i + 1]
            i += 1
        else:
            current += c
        i += 1
    if current:
        words.append(current)
    return words


def unquote(raw: str) -> str:
    """Docker's value processing for one word (quotes and the three double-quote escapes)."""
    out, i, quote = [], 0, None
    while i < len(raw):
        c = raw[i]
        if quote is None and c in "'\"":
            quote = c
        elif quote == c:
            quote = None
        elif c == "\\" and i + 1 < len(raw) and (quote is None or (quote == '"' and raw[i + 1] in '"$\\')):
            out.append(raw[i + 1])
            i += 1
        elif quote is None and c == "$":
            raise AssertionError(f"unquoted $ would be expanded: {raw!r}")
        elif quote == '"' and c == "$":
            raise AssertionError(f"unescaped $ in double quotes would be expanded: {raw!r}")
        else:
            out.append(c)
        i += 1
    assert quote is None, f"unterminated quote in {raw!r}"
    return "".join(out)


def env_of(dockerfile: str) -> dict[str, str]:
    """The environment the final stage's ENV instructions set."""
    env: dict[str, str] = {}
    for ins, args in instructions(dockerfile):
        if ins == "ENV":
            for word in split_words(args):
                name, _, value = word.partition("=")
                if name == "PATH":  # the one deliberate expansion: the base's PATH plus ours
                    continue
                env[name] = unquote(value)
    return env
