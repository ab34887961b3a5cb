"""Exact Dockerfile representations of baked values (ENV and LABEL instructions).

Docker's Dockerfile lexer keeps everything inside single quotes literally, and inside double quotes
turns only `\\"`, `\\$` and `\\\\` into `"`, `$` and `\\` (any other backslash is kept). Neither form can
hold a newline or a carriage return (the parser splits lines first) nor a NUL (environment strings
are C strings). So a scalar is quoted exactly or refused, and a list of log lines, which the worker
reads as newline-separated text upstream, is baked as a JSON array of strings that the worker reads
back as the same list (docs/architecture.md).
"""

from __future__ import annotations

import json

# Characters no Dockerfile instruction can carry through unchanged.
_UNREPRESENTABLE = {"\n": "a newline", "\r": "a carriage return", "\x00": "a NUL byte"}


class ValueRefused(ValueError):
    """A value that cannot be baked exactly; the message says why, for the spec error line."""


def check_representable(value: str) -> None:
    """Raise ValueRefused if `value` cannot reach a container's environment byte for byte."""
    for char, name in _UNREPRESENTABLE.items():
        if char in value:
            raise ValueRefused(f"contains {name}, which a Dockerfile ENV cannot hold")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueRefused("is not valid Unicode text (lone surrogate)") from None


def quote(value: str) -> str:
    """Quote `value` for an ENV or LABEL instruction so that Docker reads back exactly `value`."""
    check_representable(value)
    if "'" not in value:
        return f"'{value}'"
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{escaped}"'


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
