"""bakery's own HTTP policy at port 3000: the request rules and aiohttp middlewares of the guards.

What port 3000 refuses, and how it answers, is bakery's code, not the SDK's. Each middleware is made by a
factory from plain values and callables, so this module imports nothing of the SDK: guards.py builds them from
what sdk_seam.py reads and orders them. Stdlib only; `web` is passed in. See docs/security.md.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import codecs
import contextvars
import itertools
import json
import logging
import math
import operator
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit


def now_and_then(count: int) -> bool:
    """Whether the `count`-th refusal of a kind is logged: the 1st, 10th, 100th ... (a flood is not)."""
    return count in (1, 10, 100, 1000, 10000) or count % 100000 == 0

# The SDK's AuthData fields, and the JSON types the worker accepts for each (what the SDK can use
# without crashing: it max()es reqnum, hashes request_idx, b64decodes signature, json.dumps url).
# `()` is any value: the SDK does not use cost or endpoint of a plain request, so they are not judged.
AUTH_FIELDS: dict[str, tuple[type, ...]] = {
    "cost": (),
    "endpoint": (),
    "reqnum": (int,),
    "request_idx": (int,),
    "signature": (str,),
    "url": (str,),
}
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# A query string: everything after a "?" inside a word up to the next whitespace, quotes and angle
# brackets included ("?'api_key=X" is a query), but for one quote or ">" that closes the field the URL
# sits in ('"GET /a?b HTTP/1.1"', '<http://h/?q>').
# Idempotent: a query already redacted is left as it is (a record can pass the filter twice).
_QUERY = re.compile(r"(?<=[^\s?])\?(?!<redacted>(?:[\"'>]?(?:\s|$)))\S+?(?=[\"'>]?(?:\s|$))")


NOT_AN_ENVELOPE = "the request body must be a JSON object {\"auth_data\": {...}, \"payload\": {...}}"


def envelope_error(data: Any) -> str | None:
    """Why `data` (a decoded request body) is not an envelope the SDK can serve, or None.

    Every shape the SDK would answer with a 500 (a body that is not an object, auth_data that is not
    an object, a field of a type the SDK cannot use) or a 422 (missing fields) is named here.
    """
    if not isinstance(data, dict):
        return NOT_AN_ENVELOPE
    auth = data.get("auth_data")
    if not isinstance(auth, dict):
        return "auth_data must be a JSON object" if "auth_data" in data else "auth_data is missing"
    error = auth_error(auth, "auth_data")
    if error:
        return error
    if not isinstance(data.get("payload"), dict):
        return "payload must be a JSON object" if "payload" in data else "payload is missing"
    session_id = data.get("session_id")
    if session_id is not None and not isinstance(session_id, str):
        return "session_id must be a string"
    return None


def auth_error(auth: dict[str, Any], where: str) -> str | None:
    """Why `auth` is not a usable auth_data object (missing field, wrong JSON type), or None."""
    for name, kinds in AUTH_FIELDS.items():
        if name not in auth:
            return f"{where}.{name} is missing"
        value = auth[name]
        if kinds and (isinstance(value, bool) or not isinstance(value, kinds)):
            wanted = " or ".join("string" if k is str else "integer" if k is int else "number" for k in kinds)
            return f"{where}.{name} must be {'an' if wanted[0] in 'aeiou' else 'a'} {wanted}"
        if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
            # the SDK forwards reqnum and request_idx to the autoscaler, which stores 64-bit integers
            return f"{where}.{name} must fit a 64-bit integer"
    return None


def signature_error(signature: str, key_bytes: int) -> str | None:
    """Why `signature` cannot be an RSA signature by a key of `key_bytes` bytes, or None: it must be
    canonical base64 of exactly that many bytes. Checked before any RSA step: a misshapen one is refused
    without its text reaching the log."""
    if len(signature) != 4 * ((key_bytes + 2) // 3):
        return "auth_data.signature is not a signature of this worker's key size"
    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return "auth_data.signature is not base64"
    if len(raw) != key_bytes or base64.b64encode(raw).decode("ascii") != signature:
        return "auth_data.signature is not canonical base64 of this worker's key size"
    return None


def redact_query(text: str) -> str:
    """`text` with every URL query string replaced by `?<redacted>` (the SDK's client puts its api
    key in one)."""
    return _QUERY.sub("?<redacted>", text)


def report_hosts(report_addr: str) -> set[str]:
    """The host names of REPORT_ADDR (comma-separated addresses are tried in order by the SDK)."""
    hosts = set()
    for item in report_addr.split(","):
        host = urlsplit(item.strip()).hostname
        if host:
            hosts.add(host.lower())
    return hosts


def callback_error(route: Any, hosts: set[str]) -> str | None:
    """Why a session's on_close_route may not be called, or None (absent, or an http(s) URL on
    REPORT_ADDR's host without credentials)."""
    if route is None:
        return None
    if not isinstance(route, str):
        return "on_close_route must be a string URL"
    parts = urlsplit(route)
    try:
        parts.port  # noqa: B018 (raises on a malformed port)
    except ValueError:
        return "on_close_route has a malformed port"
    if parts.scheme not in ("http", "https") or (parts.hostname or "").lower() not in hosts:
        return "on_close_route must be an http(s) URL on the autoscaler's host (REPORT_ADDR)"
    if parts.username is not None or parts.password is not None:
        return "on_close_route must not carry credentials"
    return None


NOT_AN_OBJECT = "the request body must be a JSON object"


def session_error(data: Any, creating: bool, max_lifetime: float, hosts: set[str]) -> str | None:
    """Why a signed /session/* call's decoded body is refused (its shape; to create: lifetime,
    callback and a numeric cost), or None."""
    if not isinstance(data, dict):
        return NOT_AN_OBJECT
    key = "auth_data" if creating else "session_auth"
    auth = data.get(key)
    problem = auth_error(auth, key) if isinstance(auth, dict) else f"{key} must be a JSON object"
    if problem is None and creating:
        problem = session_create_error(data.get("payload"), max_lifetime, hosts)
        cost = auth["cost"]
        if problem is None and (not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost < 0):
            problem = "auth_data.cost must be a non-negative number for a session"
    if problem is None and not creating and not isinstance(data.get("session_id"), str):
        problem = "session_id must be a string"
    return problem


def session_create_error(payload: Any, max_lifetime: float, hosts: set[str]) -> str | None:
    """Why a /session/create payload is refused (lifetime, callback), or None."""
    if not isinstance(payload, dict):
        return "payload must be a JSON object"
    lifetime = payload.get("lifetime", 60.0)
    if isinstance(lifetime, bool) or not isinstance(lifetime, (int, float)) or not math.isfinite(lifetime) \
            or not 0 < lifetime <= max_lifetime:
        return f"payload.lifetime must be a number of seconds in (0, {max_lifetime:g}] (BAKERY_SESSION_MAX_LIFETIME)"
    return callback_error(payload.get("on_close_route"), hosts)


def is_under(path: str, prefix: str) -> bool:
    """Whether `path` is `prefix` or below it."""
    return path == prefix or path.startswith(prefix + "/")


# Set per request by the limits_engine middleware; the limits guard's engine-call wrapper records a
# timeout in it (a task the SDK creates for the call copies the context, and with it this same dict).
OUTCOME: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("bakery_outcome", default=None)


def error(web: Any, status: int, message: str, **headers: str) -> Any:
    """A JSON error answer {"error": message}."""
    return web.json_response({"error": message}, status=status, headers=headers or None)


# What JSON may be written in (RFC 8259 asks UTF-8; RFC 7159 allowed UTF-16 and UTF-32), by codec name.
JSON_CHARSETS = frozenset({"utf-8", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"})


def json_codec(charset: str | None) -> tuple[str, str | None]:
    """(the codec a body declared in `charset` is decoded with, why it is refused or None). Checked
    before anything decodes the body: Python's decoders of other charsets can be slow beyond their
    size (punycode is quadratic: a 120 KB body took 4-9 s of the worker's only event loop)."""
    if not charset:
        return "utf-8", None
    try:
        name = codecs.lookup(charset).name
    except LookupError:
        name = ""
    if name in JSON_CHARSETS:
        return name, None
    return name, (f"the request body's charset {charset[:40]!r} is not one JSON is written in: send UTF-8 "
                  "(or UTF-16/UTF-32, declared)")


MAX_JSON_DEPTH = 64  # nesting a request body may have (JSON objects and arrays); deeper is 422
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
# Keep only the brackets, both kinds as square ones (depth does not depend on the kind).
_SQUARE = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


def too_deep(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text `body` nests arrays and objects more than `limit` levels deep, found without
    parsing it: Python's json recurses (a depth of ~1000 is a RecursionError on Python 3.10/3.11) and
    the SDK parses the body again. Linear, C-speed passes only (no step is quadratic: a 16 MiB body
    nested 60 deep took 7.5 s of the event loop when the innermost pairs were peeled 60 times): the
    brackets outside strings; a run of too many opening ones; four passes take the innermost pairs
    off (one level less everywhere, `{}` items gone); then the text is cut after each run of closing
    brackets, and the depth at the deepest point of each piece is the depth before it plus its
    opening run."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    brackets = _JSON_STRING.sub(b"", body).translate(_SQUARE, _NOT_BRACKET)
    if not brackets:  # every bracket was inside a string: a scalar, depth 0
        return False
    if b"[" * (limit + 1) in brackets:  # one run opens too many: most deep bodies end here
        return True
    for peeled in (1, 2, 3, 4):
        brackets = brackets.replace(b"[]", b"")
        if not brackets:  # all of it was `peeled` deep
            return peeled > limit
    limit -= 4
    pieces = brackets.replace(b"][", b"] [").split(b" ")  # each: a run of "[", then a run of "]"
    opens = list(map(bytes.count, pieces, itertools.repeat(b"[")))
    nets = map(operator.sub, opens, map(operator.sub, map(len, pieces), opens))  # opened less closed
    return max(map(operator.add, itertools.accumulate(nets, initial=0), opens)) > limit


def depth_error(body: bytes) -> str | None:
    """Why `body` is refused for its nesting, or None."""
    if too_deep(body):
        return f"the request body nests JSON more than {MAX_JSON_DEPTH} levels deep"
    return None


async def read_json(request: Any) -> tuple[Any, str | None]:
    """The request's JSON body decoded as aiohttp's request.json() would, or an error."""
    codec, refused = json_codec(request.charset)
    if refused:
        return None, refused
    body = await request.read()
    try:
        text = body.decode(codec)
    except UnicodeDecodeError:
        return None, "the request body is not valid UTF-8 (or UTF-16/UTF-32 as declared)"
    deep = depth_error(body if codec == "utf-8" else text.encode("utf-8", "surrogatepass"))
    if deep:
        return None, deep
    try:
        return json.loads(text), None
    except (ValueError, RecursionError):
        return None, "the request body is not valid JSON"


async def within(awaitable: Awaitable[Any], seconds: float) -> Any:
    """`awaitable`'s result, or asyncio.TimeoutError after `seconds` (no extra task on Python 3.11+)."""
    if hasattr(asyncio, "timeout"):
        async with asyncio.timeout(seconds):
            return await awaitable
    return await asyncio.wait_for(awaitable, seconds)


# The SDK answers these without a body; the envelope guard (signed_first.py) gives them one.
BARE = {401: "the request is not signed for this worker", 410: "the session does not exist",
        429: "the worker's queue is full; retry later", 500: "the engine request failed"}


class MessageRewriter(logging.Filter):
    """A filter that rewrites a record's message (`rewrite`, for messages holding `marker`); drops nothing."""

    marker = ""

    def rewrite(self, message: str) -> str:
        return message

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self.marker in message:
            clean = self.rewrite(message)
            if clean != message:
                record.msg, record.args = clean, None
        return True


class QueryRedactor(MessageRewriter):
    """Rewrites a record whose message holds a URL query string (see redact_query)."""

    marker = "?"

    def rewrite(self, message: str) -> str:
        return redact_query(message)


_MTOKEN = re.compile(r'("mtoken"\s*:\s*")[^"]*(")')


class TokenRedactor(MessageRewriter):
    """Rewrites the SDK's status block, which prints MASTER_TOKEN's first 7 characters as `mtoken`:
    no part of a credential is logged."""

    marker = '"mtoken"'

    def rewrite(self, message: str) -> str:
        return _MTOKEN.sub(r"\1<redacted>\2", message)


REDACTED_LOGGERS = ("aiohttp.access", "aiohttp.server", "aiohttp.web", "aiohttp.client")


# --------------------------------------------------------------------------- middlewares


def self_update_middleware(web: Any) -> Any:
    """/pyworker/* -> 403 (an image is version-locked)."""
    @web.middleware
    async def self_update(request: Any, handler: Any) -> Any:
        if is_under(request.path, "/pyworker"):
            return error(web, 403, "self-update is disabled: this image is version-locked")
        return await handler(request)

    return self_update


def limits_body_middleware(web: Any, max_body_bytes: int, body_timeout: float) -> Any:
    """413 for a body above `max_body_bytes`, 408 for one not read within `body_timeout` seconds."""
    @web.middleware
    async def limits_body(request: Any, handler: Any) -> Any:
        length = request.content_length
        if length is not None and length > max_body_bytes:
            return error(web, 413, f"the request body is larger than {max_body_bytes} bytes "
                                   "(BAKERY_MAX_BODY_BYTES)")
        if request.can_read_body:
            reading = request.read()
            try:
                # A body already read whole (the usual small one) is not waited for: no timer.
                await (reading if request.content.is_eof() else within(reading, body_timeout))
            except web.HTTPRequestEntityTooLarge:
                return error(web, 413, f"the request body is larger than {max_body_bytes} bytes "
                                       "(BAKERY_MAX_BODY_BYTES)")
            except asyncio.TimeoutError:
                return error(web, 408, f"the request body did not arrive within {body_timeout:g} s "
                                       "(BAKERY_BODY_TIMEOUT)")
        return await handler(request)

    return limits_body


def engine_timeout(outcome: dict[str, str]) -> str:
    """The 504's message for an engine call that timed out (recorded in OUTCOME)."""
    return (f"the engine did not answer in time ({outcome['timeout']}; "
            "BAKERY_ENGINE_CONNECT_TIMEOUT, BAKERY_ENGINE_IDLE_TIMEOUT)")


def limits_engine_middleware(web: Any, routes: tuple[str, ...]) -> Any:
    """504 for a model request whose engine call timed out (recorded in OUTCOME by the engine call)."""
    @web.middleware
    async def limits_engine(request: Any, handler: Any) -> Any:
        if request.path not in routes:
            return await handler(request)
        outcome: dict[str, str] = {}
        token = OUTCOME.set(outcome)
        try:
            response = await handler(request)
        finally:
            OUTCOME.reset(token)
        if "timeout" in outcome and response.status == 500 and not response.prepared:
            return error(web, 504, engine_timeout(outcome))
        return response

    return limits_engine


def not_ready_middleware(web: Any, routes: tuple[str, ...], is_loaded: Callable[[], bool],
                         retry_after: int) -> Any:
    """503 + Retry-After on the model routes until `is_loaded()`."""
    retry = str(retry_after)

    @web.middleware
    async def not_ready(request: Any, handler: Any) -> Any:
        if request.path in routes and not is_loaded():
            return error(web, 503, "the model is not loaded yet", **{"Retry-After": retry})
        return await handler(request)

    return not_ready
