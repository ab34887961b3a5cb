"""Signed first: the signature is checked before the payload is parsed; only a signed body is parsed whole.

msgspec reads the envelope's top-level fields raw: the text is validated, no payload is built. An envelope not
signed for this worker gets 401; a signed one then meets the checks that make the SDK's one parse safe, the
loop let go between them (let_go.py). NaN, Infinity and lone surrogates are refused. See docs/security.md.
"""

from __future__ import annotations

import codecs
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from engine import let_go
from policy import rules

AUTH_TEXT_LIMIT = 16 * 1024  # raw bytes of auth_data.url / .signature read; longer is not signed
_NUMBER_TEXT = 24  # an integer of 64 bits is at most 20 characters: longer is out of range, not read
_UTF8_SLICE = 1024 * 1024  # the UTF-8 check decodes this much at a time: the text is never held whole


class _Top(msgspec.Struct):
    """The envelope's own fields, raw; any other key is skipped, not materialised."""

    auth_data: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    payload: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    session_id: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    session_auth: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET  # /session/* calls other than create


class _Auth(msgspec.Struct):
    """auth_data's fields (rules.AUTH_FIELDS), raw."""

    cost: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    endpoint: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    reqnum: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    request_idx: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    signature: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    url: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


class _PlainAuth(msgspec.Struct):
    """auth_data as the platform sends it: every field there, the ones the check reads typed."""

    cost: msgspec.Raw
    endpoint: msgspec.Raw
    reqnum: int
    request_idx: int
    signature: str
    url: str


class _Plain(msgspec.Struct):
    """An envelope as the platform sends it (read_plain): auth_data typed, the payload raw."""

    auth_data: _PlainAuth
    payload: msgspec.Raw
    session_id: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_TOP = msgspec.json.Decoder(_Top)
_AUTH = msgspec.json.Decoder(_Auth)
_PLAIN = msgspec.json.Decoder(_Plain)
PLAIN_MAX = 64 * 1024  # bodies read_plain tries (its typed strings are read whole, unbounded)
_PLAIN_TEXT = AUTH_TEXT_LIMIT // 12  # a decoded character is at most 12 raw bytes (an escaped surrogate pair)
_TEXT = msgspec.json.Decoder(str)
NOT_JSON = "the request body is not valid JSON"
NOT_UTF8 = "the request body is not valid UTF-8 (or UTF-16/UTF-32 as declared)"
TOO_DEEP = f"the request body nests JSON more than {rules.MAX_JSON_DEPTH} levels deep"


@dataclass(frozen=True)
class Envelope:
    """What is read of a body before its signature is checked.

    `problem` is why it is refused with 422, or None. `auth` is auth_data (rules.AUTH_FIELDS; a value
    too long to be read, as cost or endpoint may be, stands as an empty one of its type) once its
    fields are usable, even when the payload is not; `checkable` is False when its url or signature is
    too long to be one this worker is signed for. `utf8` is the
    body as UTF-8 (the body itself unless it declared UTF-16/UTF-32).
    """

    problem: str | None
    auth: dict[str, Any] | None = None
    checkable: bool = True
    utf8: bytes = b""


def _head(raw: msgspec.Raw) -> bytes:
    """The first byte of a raw JSON value: its type."""
    return bytes(memoryview(raw)[:1])


def _placeholder(raw: msgspec.Raw, text: bool) -> tuple[Any, bool]:
    """(a value of the JSON type `raw` holds, whether it is the value itself): numbers and strings
    are decoded when short (strings up to AUTH_TEXT_LIMIT when `text`), anything else only typed
    (never copied: an attacker's 16 MiB `reqnum` is not read)."""
    head, size = _head(raw), len(memoryview(raw))
    if head == b'"':
        if size > (AUTH_TEXT_LIMIT if text else _NUMBER_TEXT):
            return "", False
        return _TEXT.decode(raw), True
    if head in (b"-", b"0", b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"8", b"9"):
        if size > _NUMBER_TEXT:
            return rules.INT64_MAX + 1, False  # refused: "must fit a 64-bit integer" (or a float)
        data = bytes(raw)
        if b"." in data or b"e" in data or b"E" in data:
            return 0.0, False  # a float: refused as "must be an integer"
        return int(data), True
    return {b"t": True, b"f": False, b"n": None, b"[": [], b"{": {}}.get(head), False


def _top(body: bytes, charset: str | None, not_object: str) -> tuple[_Top | None, bytes, str | None]:
    """(the body's top-level fields, raw; the body as UTF-8; why it is refused: `not_object` for a
    body that is not an object), read without materialising any value."""
    codec, refused = rules.json_codec(charset)
    if refused:
        return None, b"", refused
    utf8 = body
    if codec != "utf-8":  # UTF-16/32, declared: the reader takes UTF-8 (at most 1.5x the body)
        try:
            utf8 = body.decode(codec).encode("utf-8")
        except UnicodeError:
            return None, b"", NOT_UTF8
    try:
        return _TOP.decode(utf8), utf8, None
    except msgspec.ValidationError:
        return None, b"", not_object
    except RecursionError:  # msgspec stops at the interpreter's recursion limit, far above ours
        return None, b"", TOO_DEEP
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None, b"", NOT_JSON


def _auth(raw: msgspec.Raw | msgspec.UnsetType, key: str) -> tuple[dict[str, Any] | None, bool, str | None]:
    """(the auth object `key` as far as the signature check needs it, whether it is checkable, why it
    is refused): each field decoded from its raw text, bounded (_placeholder)."""
    if raw is msgspec.UNSET:
        return None, True, f"{key} is missing"
    try:
        raw_auth = _AUTH.decode(raw)
    except msgspec.ValidationError:
        return None, True, f"{key} must be a JSON object"
    except UnicodeDecodeError:
        return None, True, NOT_UTF8
    auth: dict[str, Any] = {}
    checkable = True
    try:
        for name, kinds in rules.AUTH_FIELDS.items():
            value = getattr(raw_auth, name)
            if value is msgspec.UNSET:
                continue  # auth_error names it
            # cost and endpoint (any type, unused by the check) only as far as auth_error judges them
            auth[name], exact = _placeholder(value, text=str in kinds)
            checkable = checkable and (exact or str not in kinds or not isinstance(auth[name], str))
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None, True, NOT_UTF8
    return auth, checkable, rules.auth_error(auth, key)


def read(body: bytes, charset: str | None) -> Envelope:
    """The envelope in `body` (declared in `charset`), read without materialising its payload."""
    return read_plain(body, charset) or read_careful(body, charset)


def read_plain(body: bytes, charset: str | None) -> Envelope | None:
    """The envelope as read_careful reads it, in one typed decode, for the shape the platform sends (a
    UTF-8 body up to PLAIN_MAX, every auth_data field there, reqnum and request_idx 64-bit integers,
    url and signature short strings, an object payload, no session_id); None for anything else.

    Why (issue 24): read_careful decodes each auth_data field from its raw text in Python, ~16 us of
    a signed request's ~0.15 ms on the Intel Xeon host; this is ~4 us. Its result is read_careful's
    (tests/worker/test_signed_first_plain.py holds the two to the same Envelope on every shape).
    """
    if len(body) > PLAIN_MAX or (charset is not None and rules.json_codec(charset)[0] != "utf-8"):
        return None
    try:
        plain = _PLAIN.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):  # ValidationError is a DecodeError
        return None
    sent = plain.auth_data
    if (plain.session_id is not msgspec.UNSET or _head(plain.payload) != b"{"
            or len(sent.url) > _PLAIN_TEXT or len(sent.signature) > _PLAIN_TEXT):
        return None
    auth = {"cost": _placeholder(sent.cost, text=False)[0], "endpoint": _placeholder(sent.endpoint, text=False)[0],
            "reqnum": sent.reqnum, "request_idx": sent.request_idx, "signature": sent.signature, "url": sent.url}
    problem = rules.auth_error(auth, "auth_data")  # e.g. a reqnum past 64 bits: read_careful says so
    return None if problem else Envelope(None, auth, True, body)


def read_careful(body: bytes, charset: str | None) -> Envelope:
    """The envelope in `body`, each auth_data field decoded from its raw text, bounded (any shape)."""
    top, utf8, problem = _top(body, charset, rules.NOT_AN_ENVELOPE)
    if top is None:
        return Envelope(problem)
    auth, checkable, problem = _auth(top.auth_data, "auth_data")
    if problem:
        return Envelope(problem)
    if top.payload is msgspec.UNSET:
        problem = "payload is missing"
    elif _head(top.payload) != b"{":
        problem = "payload must be a JSON object"
    elif top.session_id is not msgspec.UNSET and _head(top.session_id) not in (b'"', b"n"):
        problem = "session_id must be a string"
    return Envelope(problem, auth, checkable, utf8)


def read_session_auth(body: bytes, charset: str | None, key: str) -> Envelope:
    """A /session/* call's auth object `key` (auth_data to create, session_auth after), read as an
    envelope's is: nothing else of the body is materialised before its signature is checked."""
    top, utf8, problem = _top(body, charset, rules.NOT_AN_OBJECT)
    if top is None:
        return Envelope(problem)
    auth, checkable, problem = _auth(getattr(top, key), key)
    return Envelope(problem, auth if problem is None else None, checkable, utf8)


# ------------------------------------------------------------------------ what the SDK's parse needs

_DIGITS = bytes.maketrans(b"0123456789", b"0000000000")
_ZEROS = re.compile(b"0*")
# The same strings as front's depth check skips; a string's digits are no number.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def long_integer(body: bytes) -> bool:
    """Whether the JSON text `body` holds an integer literal longer than Python's int() converts
    (sys.get_int_max_str_digits(): json.loads raises ValueError, which the SDK answers with a 500).
    A C-speed search for a run of that many digits; only when there is one, each such run outside
    strings is looked at (no regex backtracks over it: a million digits cost one scan)."""
    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
    needle = b"0" * (limit + 1)
    if not limit or needle not in body.translate(_DIGITS):
        return False
    outside = _JSON_STRING.sub(b'""', body)
    digits = outside.translate(_DIGITS)
    at = digits.find(needle)
    while at >= 0:
        end = _ZEROS.match(digits, at).end()  # type: ignore[union-attr] (always matches)
        before = outside[max(0, at - 2):at]
        # A fraction ("1.5"), an exponent ("1e5", "1e-5", "1e+5"): a float, which json reads at any length.
        fraction = before[-1:] in (b".", b"e", b"E", b"+") or before in (b"e-", b"E-")
        if not fraction and outside[end:end + 1] not in (b".", b"e", b"E"):
            return True
        at = digits.find(needle, end)
    return False


def utf8_error(body: bytes) -> bool:
    """Whether `body` is not strict UTF-8 (as aiohttp's request.text() decodes it), checked a slice
    at a time so that the text is never held whole."""
    if body.isascii():  # ASCII is UTF-8; the usual body is answered without a decoder
        return False
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(body)
    try:
        for start in range(0, len(body), _UTF8_SLICE):
            decoder.decode(view[start:start + _UTF8_SLICE])
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return True
    return False


async def parse_problem(envelope: Envelope, declared_utf8: bool) -> str | None:
    """Why the SDK's one parse of a signed envelope would fail otherwise than with its own 422
    (a 500 with a traceback), or None. The event loop is let go between the passes (let_go)."""
    body = envelope.utf8
    if declared_utf8 and utf8_error(body):
        return NOT_UTF8
    await let_go.pause()
    deep = rules.depth_error(body)
    if deep:
        return deep
    await let_go.pause()
    if long_integer(body):
        return f"the request body holds an integer of more than {sys.get_int_max_str_digits()} digits"
    return None


# ------------------------------------------------------------------------ the middleware


def envelope_middleware(web: Any, routes: tuple[str, ...], verify: Callable[[dict[str, Any]], bool],
                        reject: Callable[[dict[str, Any]], None]) -> Any:
    """The envelope guard: 422 JSON for an envelope the SDK cannot serve, 401 JSON (reported with
    `reject`) for one `verify` (the signature check) refuses, both before anything parses the
    payload; a JSON body for the SDK's body-less refusals."""
    @web.middleware
    async def envelope(request: Any, handler: Any) -> Any:
        if request.path not in routes:
            return await handler(request)
        body = await request.read()
        found = read(body, request.charset)
        if found.problem is not None:
            return rules.error(web, 422, found.problem)
        assert found.auth is not None
        if not (found.checkable and verify(found.auth)):
            reject(found.auth)
            return rules.error(web, 401, rules.BARE[401])
        token = let_go.mark(len(body))  # the SDK's engine-call task inherits it (forward pauses too)
        try:
            await let_go.pause()  # the passes below cost a few times reading the body: others go first
            problem = await parse_problem(found, found.utf8 is body)
            if problem is not None:
                return rules.error(web, 422, problem)
            del found  # a UTF-16 body's UTF-8 copy is not kept while the request is served
            await let_go.pause()  # and the SDK's parse is a step of its own
            let_go.quiet_collector()  # the SDK parses in this step
            response = await handler(request)
        finally:
            let_go.thaw()
            let_go.reset(token)
        if response.status in rules.BARE and not response.prepared and not getattr(response, "body", b"x"):
            return rules.error(web, response.status, rules.BARE[response.status])
        return response

    return envelope


def sessions_middleware(web: Any, enabled: bool, max_lifetime: float, hosts: set[str],
                        verify: Callable[[dict[str, Any]], bool]) -> Any:
    """/session/*: 404 unless `enabled`; else the call's auth object is read and its signature
    checked (`verify`, the signature check) before the body is parsed: 422 for an auth
    object the check cannot use, 401 for one it refuses; then 422 for a call rules.session_error
    refuses (lifetime, callback host, cost, session id)."""
    @web.middleware
    async def sessions(request: Any, handler: Any) -> Any:
        if not rules.is_under(request.path, "/session"):
            return await handler(request)
        if not enabled:
            return rules.error(web, 404, "sessions are disabled on this worker (BAKERY_SESSIONS)")
        creating = request.path == "/session/create"
        found = read_session_auth(await request.read(), request.charset, "auth_data" if creating else "session_auth")
        if found.problem is not None:
            return rules.error(web, 422, found.problem)
        assert found.auth is not None
        if not (found.checkable and verify(found.auth)):
            return rules.error(web, 401, "the session request is not signed for this worker")
        del found
        data, problem = await rules.read_json(request)  # signed: parsed whole (the body is read once)
        problem = problem or rules.session_error(data, creating, max_lifetime, hosts)
        if problem is not None:
            return rules.error(web, 422, problem)
        return await handler(request)

    return sessions
