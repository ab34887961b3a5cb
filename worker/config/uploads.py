"""Uploads in the JSON envelope, sent to the engine as multipart form data; references checked.

A base64'd file field becomes a file part, every other field a form field; an UploadError names the field and
is answered 422. Everything is bounded before it is decoded. The engine fetches references from inside the
instance, so only http(s) URLs with a host and `data:` URIs pass, never a path. See docs/routes.md.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import ipaddress
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

from config import workload

MAX_UPLOAD_BYTES_VAR = "OPENAI_MAX_UPLOAD_BYTES"
MAX_REQUEST_UPLOAD_BYTES_VAR = "OPENAI_MAX_REQUEST_UPLOAD_BYTES"
DEFAULT_MAX_UPLOAD_BYTES = 25 * 1024 * 1024  # per file: OpenAI's own limit for audio uploads
DEFAULT_MAX_REQUEST_UPLOAD_BYTES = 64 * 1024 * 1024
MAX_FILES = 16
MAX_DATA_URI_HEADER = 128  # "data:audio/wav;base64," and the like
MAX_FILENAME_STEM = 128

# Engines pick a decoder from the part's content type, which follows the extension.
AUDIO_TYPES = {"flac": "audio/flac", "m4a": "audio/mp4", "mp3": "audio/mpeg", "mp4": "audio/mp4",
               "mpeg": "audio/mpeg", "mpga": "audio/mpeg", "ogg": "audio/ogg", "wav": "audio/wav",
               "webm": "audio/webm"}
IMAGE_TYPES = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "webp": "image/webp"}
VIDEO_TYPES = {"mp4": "video/mp4", "mov": "video/quicktime", "webm": "video/webm"}
VISUAL_TYPES = {**IMAGE_TYPES, **VIDEO_TYPES}
MEDIA_TYPES = {**AUDIO_TYPES, **VISUAL_TYPES}  # mp4 and webm count as video here
JSON_TYPES = {"json": "application/json"}

FilePart = tuple[str, bytes, str]  # (filename, content, content type): the SDK's file part


class UploadError(ValueError):
    """A refused upload or reference: `field` is the envelope field, `message` says why (422)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class UploadField:
    """One upload field of a route: the types it accepts, the name of an unnamed upload, whether
    it may hold a list of files."""

    name: str
    types: Mapping[str, str]
    default_name: str
    many: bool = False


@dataclass(frozen=True)
class UploadLimits:
    """Decoded bytes allowed per file and per request (OPENAI_MAX_UPLOAD_BYTES,
    OPENAI_MAX_REQUEST_UPLOAD_BYTES), and files per request."""

    file_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    request_bytes: int = DEFAULT_MAX_REQUEST_UPLOAD_BYTES
    files: int = MAX_FILES


# The upload fields of each multipart route (upstream's names).
UPLOAD_FIELDS: dict[str, tuple[UploadField, ...]] = {
    "/v1/audio/transcriptions": (UploadField("file", AUDIO_TYPES, "audio.wav"),),
    "/v1/audio/translations": (UploadField("file", AUDIO_TYPES, "audio.wav"),),
    "/v1/images/edits": (UploadField("image", IMAGE_TYPES, "image.png", many=True),
                         UploadField("mask", IMAGE_TYPES, "mask.png")),
    "/v1/videos/sync": (
        UploadField("input_reference", VISUAL_TYPES, "image.png"),
        UploadField("input_references", MEDIA_TYPES, "image.png", many=True),
        UploadField("control_reference", VISUAL_TYPES, "image.png"),
        UploadField("source_video", VIDEO_TYPES, "video.mp4"),
        UploadField("source_audio", AUDIO_TYPES, "audio.wav"),
        UploadField("video_noise_mask", JSON_TYPES, "mask.json"),
        UploadField("audio_noise_mask", JSON_TYPES, "mask.json"),
    ),
}
# Fields whose unnamed `filename` names them (upstream: `filename` for file/image).
PLAIN_FILENAME = {"file", "image"}
# Video reference objects: the key in each that the engine fetches.
VIDEO_REFERENCE_FIELDS = {"image_reference": "image_url", "video_reference": "video_url",
                          "audio_reference": "audio_url"}


def encoded_limit(limit: int) -> int:
    """The longest base64 text (with a line break every 76 characters) that can decode to `limit`
    bytes or fewer."""
    body = math.ceil(limit / 3) * 4
    return body + (body // 76 + 1) * 2


def decode_base64(value: Any, field: str, limit: int) -> bytes:
    """Base64 text or a base64 `data:` URI -> bytes. The length is checked before decoding."""
    if not isinstance(value, str):
        raise UploadError(field, "must be a base64 string")
    start = 0
    if value[:5].lower() == "data:":
        comma = value.find(",", 0, MAX_DATA_URI_HEADER)
        if comma < 0 or ";base64" not in value[:comma].lower():
            raise UploadError(field, "a data: URI upload must be base64 (data:<type>;base64,...)")
        start = comma + 1
    if len(value) - start > encoded_limit(limit):
        raise UploadError(field, f"larger than {limit} bytes (the limit is {MAX_UPLOAD_BYTES_VAR})")
    text = re.sub(r"\s+", "", value[start:])
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise UploadError(field, "not valid base64") from None
    if not raw:
        raise UploadError(field, "is empty")
    if len(raw) > limit:
        raise UploadError(field, f"larger than {limit} bytes (the limit is {MAX_UPLOAD_BYTES_VAR})")
    return raw


def safe_filename(filename: Any, default: str) -> str:
    """The basename of `filename` (either slash), reduced to [A-Za-z0-9._-], no leading dot; the
    stem cut to 128 characters. `default` when nothing is left."""
    text = str(filename) if isinstance(filename, (str, int, float)) else ""
    name = re.split(r"[\\/]", text.strip())[-1]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".")
    if not name.strip("_"):
        return default
    stem, dot, ext = name.rpartition(".")
    return f"{stem[:MAX_FILENAME_STEM]}.{ext}" if dot else name[:MAX_FILENAME_STEM]


def file_part(raw: bytes, filename: Any, spec: UploadField, name_field: str) -> FilePart:
    """(safe filename, bytes, content type); the extension must be one `spec` accepts."""
    name = safe_filename(filename, spec.default_name)
    stem, dot, ext = name.rpartition(".")
    ext = ext.lower() if dot and stem else ""
    if ext not in spec.types:
        raise UploadError(name_field, f"unsupported file type {ext or '(none)'!r}; expected one of "
                                      f"{', '.join(sorted(spec.types))}")
    return name, raw, spec.types[ext]


def check_reference(value: Any, field: str, limits: UploadLimits) -> str | None:
    """A reference the engine will fetch: an http(s) URL with a host, or a `data:` URI (bounded).

    Returns the URL's host (lower case, no brackets or trailing dot; None for a `data:` URI) for
    references.py, which judges the addresses it stands for once the request is signed. Only a URL
    every parser reads alike passes (reference_host_problem): what this check sees is what the engine fetches.
    """
    if not isinstance(value, str) or not value.strip():
        raise UploadError(field, "must be an http(s) URL or a data: URI")
    text = value.strip()
    if text[:5].lower() == "data:":
        comma = text.find(",", 0, MAX_DATA_URI_HEADER)
        if comma < 0:
            raise UploadError(field, "malformed data: URI (no comma within its header)")
        if len(text) - comma - 1 > encoded_limit(limits.file_bytes):
            raise UploadError(field, f"larger than {limits.file_bytes} bytes (the limit is "
                                     f"{MAX_UPLOAD_BYTES_VAR})")
        return None
    try:
        parts = urlsplit(text)
    except ValueError:  # e.g. "http://[::1"
        raise UploadError(field, "must be an http(s) URL or a data: URI") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise UploadError(field, "must be an http(s) URL or a data: URI, never a path on the instance")
    problem = reference_host_problem(text, parts)
    if problem:
        raise UploadError(field, problem)
    return parts.hostname.rstrip(".")


# A host name as DNS writes it: what every URL parser and resolver reads the same way.
_NAME = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?)*\.?")
_NUMERIC_LABEL = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)")
_UNPLAIN = re.compile(r"[\x00-\x20\x7f-\x9f\\]")
_BRACKETED = re.compile(r"\[[0-9a-f:.]+\]")


def reference_host_problem(text: str, parts: SplitResult) -> str | None:
    """Why the http(s) URL `text` (split as `parts`) could reach another host than it seems to, or None.

    URL libraries disagree on what is not plain (the engine's may be aiohttp, requests or curl):
    a backslash, blank or control character (stripped by some, a separator to others), user info
    (`http://public@127.0.0.1/`), percent-escapes or non-ASCII in the host (decoded, IDNA-mapped),
    an IPv6 zone, and IPv4 numbers other than four decimals (`2130706433`, `0x7f.1`, `0177.0.0.1`,
    `127.1` all mean 127.0.0.1 to inet_aton). Each is refused rather than interpreted.
    """
    if _UNPLAIN.search(text):
        return "must not hold blanks, control characters or backslashes"
    if "@" in parts.netloc:
        return "must not carry a user name or password (user@host): URL parsers disagree on its host"
    try:
        parts.port  # noqa: B018 (raises on a port that is not a number from 0 to 65535)
    except ValueError:
        return "has a port that is not a number from 0 to 65535"
    host = parts.hostname or ""
    if parts.netloc.startswith("["):
        if not _BRACKETED.fullmatch(f"[{host}]"):
            return "has an IPv6 host that is not plain hexadecimal (no zone, no escapes)"
        return None
    if not _NAME.fullmatch(host) or len(host) > 254:
        return ("has a host that is not a plain DNS name or address (write an international name "
                "in its xn-- form, without percent-escapes)")
    if _NUMERIC_LABEL.fullmatch(host.rstrip(".").rpartition(".")[2]):
        try:
            canonical = str(ipaddress.IPv4Address(host.rstrip("."))) == host.rstrip(".")
        except ValueError:
            canonical = False
        if not canonical:
            return "has a numeric host that is not an IPv4 address written as four decimal numbers (a.b.c.d)"
    return None


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _check_total(values: list[Any], field: str, limits: UploadLimits) -> None:
    encoded = sum(len(v) for v in values if isinstance(v, str))
    if encoded * 3 // 4 > limits.request_bytes:
        raise UploadError(field, f"this request's uploads exceed {limits.request_bytes} bytes in "
                                 f"total (the limit is {MAX_REQUEST_UPLOAD_BYTES_VAR})")


def _filename_for(fields: dict[str, Any], spec: UploadField) -> tuple[Any, str]:
    """The filename(s) given for `spec` and the field they came from: `<field>_filename`, or the
    plain `filename` for file/image."""
    own = f"{spec.name}_filename"
    if own in fields:
        return fields.pop(own), own
    if spec.name in PLAIN_FILENAME and "filename" in fields:
        return fields.pop("filename"), "filename"
    return None, own


def _drop_empty(fields: dict[str, Any], *keys: str) -> None:
    for key in keys:
        if fields.get(key) in ("", None):
            fields.pop(key, None)


def unwrap(body: Any) -> dict[str, Any]:
    """The request fields (a copy): the payload itself, or its `input` when that is an object."""
    if not isinstance(body, dict):
        raise UploadError("payload", "must be a JSON object")
    inner = body.get("input")
    return dict(inner if isinstance(inner, dict) else body)


def _video_references(fields: dict[str, Any], limits: UploadLimits) -> list[Any]:
    urls: list[Any] = []
    for name, key in VIDEO_REFERENCE_FIELDS.items():
        value = fields.get(name)
        if value is None:
            continue
        refs = _listed(value)
        if len(refs) > limits.files or not all(isinstance(r, dict) for r in refs):
            raise UploadError(name, f"must be an object or a list of at most {limits.files} objects "
                                    f"with {key!r}")
        for ref in refs:
            if ref.get(key) is None:  # e.g. {"file_id": ...}: nothing the engine fetches by URL
                continue
            check_reference(ref[key], f"{name}.{key}", limits)
            urls.append(ref[key])
        if isinstance(value, list):
            fields[name] = json.dumps(value)  # one form field; the SDK would repeat a list
    return urls


def split_upload(route: str, body: Any, limits: UploadLimits) -> tuple[dict[str, Any], dict[str, Any]]:
    """A multipart route's JSON body -> (form fields, file parts), every upload decoded and checked.

    Raises UploadError naming the field on a missing, oversized, undecodable or wrongly typed
    upload, or on a reference that is not an http(s) URL or a data: URI.
    """
    if isinstance(body, dict) and body.get("input") is not None and not isinstance(body["input"], dict):
        raise UploadError("input", "must be an object holding the request's fields")  # no upload route has one
    fields = unwrap(body)
    specs = UPLOAD_FIELDS[route]
    uploads = {spec.name: fields.pop(spec.name, None) for spec in specs}
    names = {spec.name: _filename_for(fields, spec) for spec in specs}
    references: list[Any] = []
    if route == "/v1/images/edits":
        _drop_empty(fields, "url", "url[]")
        for key in ("url", "url[]"):
            if key in fields:
                values = _listed(fields[key])
                if len(values) > limits.files:
                    raise UploadError(key, f"at most {limits.files} values")
                for value in values:
                    check_reference(value, key, limits)
                references += values
    elif route == "/v1/videos/sync":
        references = _video_references(fields, limits)
    first = next(iter(uploads))
    _check_total([v for value in uploads.values() for v in _listed(value)] + references, first, limits)

    files: dict[str, Any] = {}
    for spec in specs:
        value = uploads[spec.name]
        if value is None:
            continue
        if isinstance(value, list) and not spec.many:
            raise UploadError(spec.name, "takes one file, not a list")
        values = _listed(value)
        if not values or len(values) > limits.files:
            raise UploadError(spec.name, f"must hold 1 to {limits.files} files")
        given, name_field = names[spec.name]
        filenames = _listed(given) + [None] * len(values)
        parts = [file_part(decode_base64(v, spec.name, limits.file_bytes), n, spec, name_field)
                 for v, n in zip(values, filenames, strict=False)]
        files[spec.name] = parts if spec.many else parts[0]
    if route in ("/v1/audio/transcriptions", "/v1/audio/translations") and "file" not in files:
        raise UploadError("file", "field missing: the audio, base64'd")
    if route == "/v1/images/edits" and "image" not in files and not references:
        raise UploadError("image", "field missing: the image base64'd, or a `url`")
    return fields, files


def check_speech(route: str, body: Any, limits: UploadLimits) -> dict[str, Any]:
    """The request parser of the speech routes: unwrap, then refuse a voice-clone reference that is
    not an http(s) URL or a data: URI. Returns the fields the engine gets (empty references dropped)."""
    fields = unwrap(body)
    holders = [fields]
    if route == "/v1/audio/speech/batch":
        items = fields.get("items")
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise UploadError("items", "must be a list of objects")
        holders += items
    refs: list[tuple[str, Any]] = []
    for holder in holders:
        _drop_empty(holder, "ref_audio", "ref_audio_2")
        if len(holders) > 1 and "ref_audio" in holder and not isinstance(holder["ref_audio"], str):
            raise UploadError("ref_audio", "takes one reference string in a speech batch (per item "
                                           "or for the whole batch)")
        refs += [("ref_audio", r) for r in _listed(holder.get("ref_audio")) if r is not None]
        refs += [("ref_audio_2", holder["ref_audio_2"])] if "ref_audio_2" in holder else []
        listed = holder.get("references")
        for ref in listed if isinstance(listed, list) else ([] if listed is None else [listed]):
            refs.append(("references.audio_path", ref.get("audio_path") if isinstance(ref, dict) else ref))
    if len(refs) > limits.files:
        raise UploadError("ref_audio", f"at most {limits.files} references")
    _check_total([r for _, r in refs], "ref_audio", limits)
    for name, ref in refs:
        check_reference(ref, name, limits)
    return fields


def upload_multiple(route: str, fields: Mapping[str, Any], files: Mapping[str, Any],
                    refs: workload.References) -> float:
    """Workload multiple of a multipart request (see workload.py); never raises."""
    try:
        if route in ("/v1/audio/transcriptions", "/v1/audio/translations"):
            name, raw, _ = files["file"]
            return workload.transcription(raw, name)
    except (KeyError, TypeError, ValueError):
        return 1.0
    return workload.multiple(route, fields, refs)


def payload_class(route: str, limits: UploadLimits, refs: workload.References,
                  benchmark: Callable[[], dict[str, Any]] | None = None,
                  data_types: Any = None, model_id: str | None = None) -> type:
    """The SDK ApiPayload class of a multipart route (HandlerConfig.payload_class).

    `benchmark` builds a client-shaped JSON body (uploads base64'd): the SDK calls for_test() for
    each benchmark request of the benchmarked route, so the benchmark goes through the same decoding
    and checks as a client's request. `data_types` is vastai.serverless.server.lib.data_types
    (imported here when not given). `model_id` fills an absent `model` form field (as upstream
    does: some engine releases require it on uploads).
    """
    types = data_types or importlib.import_module("vastai.serverless.server.lib.data_types")
    api_payload, json_error = types.ApiPayload, types.JsonDataException

    class UploadPayload(api_payload):  # type: ignore[misc, valid-type]
        """One multipart request: `fields` become form fields, `files` file parts."""

        def __init__(self, fields: dict[str, Any], files: dict[str, Any]) -> None:
            self.fields = fields
            self.files = files

        @classmethod
        def from_json_msg(cls, json_msg: dict[str, Any]) -> UploadPayload:
            try:
                fields, files = split_upload(route, json_msg, limits)
            except UploadError as exc:
                raise json_error({exc.field: exc.message}) from None
            if model_id and not fields.get("model"):
                fields["model"] = model_id
            return cls(fields, files)

        @classmethod
        def for_test(cls) -> UploadPayload:
            if benchmark is None:
                raise RuntimeError(f"{route} has no benchmark request")
            return cls.from_json_msg(benchmark())

        def generate_payload_json(self) -> dict[str, Any]:
            raise NotImplementedError(f"{route} is sent as multipart form data")

        def generate_payload_multipart(self) -> dict[str, Any]:
            return {**self.fields, **self.files}

        def count_workload(self) -> float:
            return upload_multiple(route, self.fields, self.files, refs) * refs.max_tokens

    UploadPayload.__name__ = UploadPayload.__qualname__ = (
        "UploadPayload_" + route.strip("/").replace("/", "_"))
    return UploadPayload
