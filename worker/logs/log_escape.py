"""One escaping rule for the worker's log: nothing a caller sent is written into it raw.

`Escaper`, a logging filter the log_hygiene guard installs, escapes every UNSAFE character and cuts values to
VALUE_LIMIT and messages to MESSAGE_LIMIT. It is idempotent and runs once per record (ESCAPED), before
rules.py's redactions. Standard library only. The rule in full: docs/security.md.
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Mapping
from typing import Any

VALUE_LIMIT = 512  # characters of one caller-derived value a line shows
MESSAGE_LIMIT = 8192  # characters of one record's message (a status block with its request list fits)
ESCAPED = "bakery_escaped"  # set on a record once it is escaped
# C0 and C1 controls and DEL; soft hyphen, Arabic letter mark, Mongolian vowel separator; zero-width
# and bidi marks (U+200B-U+200F), line/paragraph separators and bidi embeddings/overrides
# (U+2028-U+202E), word joiner, invisible operators and bidi isolates (U+2060-U+206F); the BOM;
# interlinear annotations; lone surrogates (the bytes a decoder could not read).
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
                    "\ufeff\ufff9-\ufffb\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# The SDK's multi-line blocks (vastai 1.9.1): "\n#### Worker Status ####\n{json}\n####" from its metrics
# module and the benchmark's "####\nRun: ...\n####" from its backend module (loggers named by file).
# Their newlines are the SDK's own; their values are JSON or numbers.
BLOCK = re.compile(r"\n?#{20}")
BLOCK_LOGGERS = ("/vastai/serverless/server/lib/metrics.py", "/vastai/serverless/server/lib/backend.py")
# The SDK's lines (vastai 1.9.1, f-strings) that carry a caller's or an engine's text, by their
# wording: each named group `v...` is such a value. Others need no entry: the whole message is
# escaped and bounded anyway; an entry keeps the rest of its line when one value is huge.
SDK_VALUES = tuple(re.compile(pattern, re.DOTALL) for pattern in (
    r"Signature error: signature verification failed, sig:(?P<v1>.*?), message: (?P<v2>.*)",
    r"on_close POST failed: route=(?P<v1>.*) status=(?P<v2>\S*) body=(?P<v3>.*)",
    r"on_close POST exception: route=(?P<v1>.*) error=(?P<v2>.*)",
    r"posting (?:multipart )?to endpoint: '(?P<v1>.*?)', (?:payload keys|fields): (?P<v2>.*)",
    r"(?:Request|Session) [^:]{0,80} errored: (?P<v1>.*)",
    r"(?:Got log line indicating (?:model is loaded|error)|Info from model logs): (?P<v1>.*)",
    r"(?:Exception in main handler loop|Error during request cleanup:|Benchmark failed with error:"
    r"|Healthcheck failed with exception:|Lifecycle startup failed:|Failed to write /.force_update:) (?P<v1>.*)",
))
# aiohttp's access record carries the values its line was made of (AccessLogger.log's `extra`).
ACCESS_VALUES = ("first_request_line", "request_header", "response_header")


def _escape_char(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str, keep_newlines: bool = False) -> str:
    """`text` with every UNSAFE character written as an escape (newlines kept when asked)."""
    if keep_newlines:
        return "\n".join(UNSAFE.sub(_escape_char, line) for line in text.split("\n"))
    return UNSAFE.sub(_escape_char, text)


def cut(text: str, limit: int = VALUE_LIMIT) -> str:
    """`text`, or its first `limit` characters and a note of how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...[{len(text)} characters, cut]"


def clean(text: str, limit: int = VALUE_LIMIT) -> str:
    """`text` escaped and cut: how a caller's value is shown (the escapes count in the limit)."""
    shown = escape(text[:limit])
    if len(text) <= limit and len(shown) <= limit:
        return shown
    return f"{shown[:limit]}...[{len(text)} characters, cut]"


def _bounded_args(args: Any) -> Any:
    """A record's %-style arguments with each string cut to VALUE_LIMIT (escaped with the message)."""
    if isinstance(args, Mapping):
        return {key: cut(value) if isinstance(value, str) else value for key, value in args.items()}
    if isinstance(args, tuple):
        return tuple(cut(value) if isinstance(value, str) else value for value in args)
    return args


def _access_values(record: logging.LogRecord) -> list[str]:
    """The string values an aiohttp access record's line was made of (its `extra`)."""
    values: list[str] = []
    for name in ACCESS_VALUES:
        value = getattr(record, name, None)
        if isinstance(value, str):
            values.append(value)
        elif isinstance(value, dict):
            values.extend(v for v in value.values() if isinstance(v, str))
    return values


def _cut_values(message: str, record: logging.LogRecord) -> str:
    """`message` with each caller-derived value it is known to hold cut to VALUE_LIMIT."""
    if len(message) <= VALUE_LIMIT:
        return message
    long_values = [v for v in _access_values(record) if len(v) > VALUE_LIMIT]
    for value in sorted(long_values, key=len, reverse=True):
        message = message.replace(value, cut(value))
    for pattern in SDK_VALUES:
        match = pattern.match(message)
        if match:
            pieces, end = [], 0
            for name in sorted(match.groupdict(), key=match.start):
                pieces += [message[end:match.start(name)], cut(match.group(name))]
                end = match.end(name)
            return "".join([*pieces, message[end:]])
    return message


def _exception_text(exc_info: Any) -> str:
    """A traceback as logging prints it, with each exception's message escaped to one bounded line."""
    first = traceback.TracebackException(*exc_info)
    text = "".join(first.format())
    pending, seen = [first], 0
    while pending and seen < 100:  # a chain is finite; the cap only bounds a pathological one
        current = pending.pop()
        seen += 1
        pending += [e for e in (current.__cause__, current.__context__) if e is not None]
        pending += list(getattr(current, "exceptions", None) or ())
        raw = "".join(current.format_exception_only())
        shown = clean(raw.rstrip("\n"), VALUE_LIMIT) + "\n"
        if raw and raw != shown:
            text = text.replace(raw, shown)
    return escape(text, keep_newlines=True).rstrip("\n")


def escape_record(record: logging.LogRecord) -> None:
    """Escape and bound `record` in place (its message becomes the final text, its arguments none)."""
    if getattr(record, ESCAPED, False):
        return
    setattr(record, ESCAPED, True)
    try:
        message = str(record.msg) % _bounded_args(record.args) if record.args else record.getMessage()
    except Exception:  # noqa: BLE001 (logging's own report of it would print the arguments raw)
        message = f"{record.msg!r} (a log call whose arguments do not fit its format)"
    message = _cut_values(message, record)
    block = record.name.endswith(BLOCK_LOGGERS) and BLOCK.match(message) is not None
    clean_message = cut(escape(message, keep_newlines=block), MESSAGE_LIMIT)
    if clean_message != record.msg or record.args:
        record.msg, record.args = clean_message, None
    if record.exc_info and not record.exc_text:
        record.exc_text = _exception_text(record.exc_info)


class Escaper(logging.Filter):
    """The rule as a logging filter: escapes and bounds every record it sees, drops none."""

    def filter(self, record: logging.LogRecord) -> bool:
        escape_record(record)
        return True
