"""The one path by which any value reaches a Dockerfile: quoted exactly, or refused.

Every function here returns a `Token`, and the renderer's Jinja2 environment refuses to print
anything that is not one (bakery.recipe.render), so a template cannot place a value that skipped this
module. ENV and LABEL values are quoted (below); image references must match Docker's reference
grammar (bakery.spec.image_ref); file names, ports and names must match a fixed pattern; the only
unquoted expansions are the build arguments `${BAKERY_REVISION}` and `${BAKERY_CREATED}`, placed by
the renderer itself. Values are also scanned for credential shapes (bakery.spec.secrets): nothing that
looks like a token, key or password-bearing URL is baked.

Quoting: ENV and LABEL instructions.

Docker's Dockerfile lexer keeps everything inside single quotes literally, and inside double quotes
turns only `\\"`, `\\$` and `\\\\` into `"`, `$` and `\\` (any other backslash is kept). Neither form can
hold a newline or a carriage return (the parser splits lines first) nor a NUL (environment strings
are C strings). So a scalar is quoted exactly or refused, and a list of log lines, which the worker
reads as newline-separated text upstream, is baked as a JSON array of strings that the worker reads
back as the same list (docs/architecture.md).
"""

from __future__ import annotations

import json
import re

from bakery.spec.image_ref import ReferenceRefused, check_reference
from bakery.spec.secrets import secret_value_reason

# Characters no Dockerfile instruction can carry through unchanged.
_UNREPRESENTABLE = {"\n": "a newline", "\r": "a carriage return", "\x00": "a NUL byte"}


# The build arguments the renderer may expand in labels (bakery.recipe.build_facts.BuildFacts), and nothing else.
BUILD_ARGS = ("BAKERY_REVISION", "BAKERY_CREATED")
REVISION_ARG, CREATED_ARG = BUILD_ARGS  # the revision and created labels' ARG names


class ValueRefused(ValueError):
    """A value that cannot be baked exactly; the message says why, for the spec error line."""


class Token(str):
    """Text made by this module: safe to place in a Dockerfile exactly as it stands."""

    __slots__ = ()


def check_representable(value: str) -> None:
    """Raise ValueRefused if `value` cannot reach a container's environment byte for byte."""
    for char, name in _UNREPRESENTABLE.items():
        if char in value:
            raise ValueRefused(f"contains {name}, which no Dockerfile line can hold: make it one line")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueRefused("is not valid Unicode text (lone surrogate)") from None


def check_no_secret(value: str) -> None:
    """Raise ValueRefused if `value` has a credential's shape (the value itself is never repeated)."""
    if why := secret_value_reason(value):
        raise ValueRefused(f"{why}; secrets are never baked: set it in the launch template at run time")


def quote(value: str) -> Token:
    """Quote `value` for an ENV or LABEL instruction so that Docker reads back exactly `value`."""
    if not isinstance(value, str):
        raise ValueRefused(f"must be text, not {type(value).__name__}")
    check_representable(value)
    check_no_secret(value)
    if "'" not in value:
        return Token(f"'{value}'")
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return Token(f'"{escaped}"')


def build_arg(name: str) -> Token:
    """The double-quoted expansion of one of bakery's own build arguments, for a LABEL value."""
    if name not in BUILD_ARGS:
        raise ValueRefused(f"{name!r} is not one of bakery's build arguments ({', '.join(BUILD_ARGS)})")
    return Token(f'"${{{name}}}"')


def image(ref: str) -> Token:
    """An image reference for FROM, as it stands: only what Docker's reference grammar allows."""
    try:
        return Token(check_reference(ref))
    except ReferenceRefused as exc:
        raise ValueRefused(f"{ref!r}: not a valid image reference: {exc}") from None


def word(value: str, pattern: str, what: str) -> Token:
    """A bare word (a file name, a stage name, a version) that must match `pattern` entirely."""
    if not isinstance(value, str) or not re.fullmatch(pattern, value, re.ASCII):
        raise ValueRefused(f"{value!r} is not a valid {what} (allowed: {pattern})")
    return Token(value)


def port(value: int) -> Token:
    """A port for EXPOSE: an int in 1..65535 (a bool or a string is refused, not converted)."""
    if type(value) is not int or not 1 <= value <= 65535:
        raise ValueRefused(f"port {value!r} is not an integer in 1..65535")
    return Token(str(value))


ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
# Docker's advice (lower-case reverse DNS: letters, digits, '.', '-') plus '_' inside a component, as in the
# issue-54 label ai.bakery.cuda.min_driver: none of them is special to a Dockerfile's LABEL.
LABEL_NAME = r"[a-z0-9]+(?:[._-][a-z0-9]+)*"


def comment(text: str) -> Token:
    """Text for a `#` comment line: one line of printable characters."""
    if not isinstance(text, str) or not text.isprintable():
        raise ValueRefused(f"{text!r} cannot go in a Dockerfile comment (one line of printable text)")
    return Token(text)


def normalise_log_line(line: str) -> str:
    """The worker's reading of one log-line item: surrounding whitespace stripped."""
    return line.strip()


def check_log_lines(lines: list[str]) -> None:
    """Refuse list items the worker would read differently (so nothing is altered silently)."""
    if not lines:
        raise ValueRefused("must hold at least one log line")
    for index, line in enumerate(lines):
        check_representable(line)
        if not normalise_log_line(line):
            raise ValueRefused(f"item {index} is blank; the worker drops blank lines")
        if normalise_log_line(line) != line:
            raise ValueRefused(
                f"item {index} ({line!r}) has leading or trailing blanks, which the worker strips; "
                "remove them"
            )


def encode_log_lines(lines: list[str]) -> str:
    """Encode a list of log lines as the JSON array the worker decodes (one line, exact)."""
    check_log_lines(lines)
    return json.dumps(lines, ensure_ascii=False, separators=(",", ":"))
