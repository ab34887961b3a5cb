"""Engine-independent parts of the stand-ins: switches, argument parsing, answers, HTTP server, run loop.

An engine profile (`bakery_standin.vllm_engine`, `bakery_standin.sglang_engine`) supplies what differs:
its command line, its log grammar and when its port opens. `run()` drives the common timeline:

    banner -> [vLLM: bind the port, not listening] -> load (STANDIN_LOAD_SECONDS) -> loaded
    vLLM:   warm-up (port still closed) -> ready line -> listen           /health: refused, then 200
    SGLang: bind + listen -> warm-up (/health 503) -> ready line           /health: 503, then 200
    -> serve until SIGTERM/SIGINT (exit 0) or STANDIN_CRASH_AFTER_LOAD (fatal lines, /health 503, exit 1)
"""

from __future__ import annotations

import hashlib
import http.client
import json
import math
import os
import re
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from email.utils import collapse_rfc2231_value
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, TextIO

from bakery_standin.steps import Steps

# ---------------------------------------------------------------------------------------------------
# Output: every line is written whole and flushed at once (engine logs are tailed by the worker).

_write_lock = threading.Lock()


def emit(line: str, stream: TextIO | None = None) -> None:
    """Write one log line (or several, newline-separated) to `stream` (default stdout) and flush."""
    out = stream if stream is not None else sys.stdout
    with _write_lock:
        out.write(line if line.endswith("\n") else line + "\n")
        out.flush()


# ---------------------------------------------------------------------------------------------------
# Switches


class UsageError(Exception):
    """A bad switch or argument: printed as one line, exit code 2."""


def _env_float(env: dict[str, str], name: str, default: float | None) -> float | None:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"{name} must be a number of seconds, got {raw!r}") from None
    if value < 0:
        raise UsageError(f"{name} must not be negative, got {raw!r}")
    return value


def _env_dir(env: dict[str, str], name: str) -> str:
    raw = env.get(name, "").strip()
    if raw and not os.path.isdir(raw):
        raise UsageError(f"{name} must be an existing directory, got {raw!r}")
    return raw


@dataclass(frozen=True)
class Options:
    """The stand-in's switches, read from the environment (all optional).

    STANDIN_LOAD_SECONDS      time spent "loading the model" before the port opens (default 2).
    STANDIN_WARMUP_SECONDS    time spent warming up after the load (default: vLLM 0, SGLang 1);
                              vLLM's port is still closed then, SGLang's answers /health with 503.
    STANDIN_FAIL_LOAD         `1` (or `load`): print the engine's real fatal start-up lines instead of
                              loading and exit 1. `warmup`: fail during warm-up instead (SGLang's
                              "Initialization failed. warmup error"; vLLM treats it like `1`).
    STANDIN_FAIL_REASON       the root-cause line printed by STANDIN_FAIL_LOAD / STANDIN_CRASH_AFTER_LOAD.
    STANDIN_CRASH_AFTER_LOAD  seconds after becoming ready, the engine dies: it prints the engine's
                              runtime fatal lines, /health answers 503 and requests 500 for
                              STANDIN_EXIT_DELAY seconds, then the process exits 1.
    STANDIN_EXIT_DELAY        see above (default 1).
    STANDIN_TOKEN_DELAY       seconds per generated token, streaming or not (default 0).
    STANDIN_REPLY_TOKENS      tokens in a full answer, finish_reason "stop" (default 12); a smaller
                              max_tokens truncates it with finish_reason "length".
    STANDIN_RECORD            a file: one JSON line appended per POST the stand-in serves (its
                              path, JSON body or form fields, and each uploaded part's field name,
                              filename, content type, size and sha256), so tests can see what arrived.
    STANDIN_STREAM_RECORD     a file: one JSON line per streamed answer when it ends: {"stream": path,
                              "prompt": the prompt text it answered, "events": n written,
                              "outcome": "complete" or the failed write's error}.
    STANDIN_STEP_DIR          a directory: streamed answers wait for the test between events
                              (bakery_standin/steps.py); one stream at a time.
    """

    load_seconds: float = 2.0
    warmup_seconds: float = 0.0
    fail_load: str = ""
    fail_reason: str = ""
    crash_after_load: float | None = None
    exit_delay: float = 1.0
    token_delay: float = 0.0
    reply_tokens: int = 12
    record: str = ""
    stream_record: str = ""
    step_dir: str = ""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, *, warmup_default: float = 0.0) -> Options:
        env = dict(os.environ if env is None else env)
        fail = env.get("STANDIN_FAIL_LOAD", "").strip().lower()
        if fail in ("", "0", "false", "no"):
            fail = ""
        elif fail in ("1", "true", "yes", "load"):
            fail = "load"
        elif fail != "warmup":
            raise UsageError(f"STANDIN_FAIL_LOAD must be 1, load or warmup, got {fail!r}")
        raw_tokens = env.get("STANDIN_REPLY_TOKENS", "").strip() or "12"
        if not raw_tokens.isdigit() or int(raw_tokens) < 1:
            raise UsageError(f"STANDIN_REPLY_TOKENS must be a positive integer, got {raw_tokens!r}")
        return cls(
            load_seconds=_env_float(env, "STANDIN_LOAD_SECONDS", 2.0) or 0.0,
            warmup_seconds=_env_float(env, "STANDIN_WARMUP_SECONDS", warmup_default) or 0.0,
            fail_load=fail,
            fail_reason=env.get("STANDIN_FAIL_REASON", "").strip(),
            crash_after_load=_env_float(env, "STANDIN_CRASH_AFTER_LOAD", None),
            exit_delay=_env_float(env, "STANDIN_EXIT_DELAY", 1.0) or 0.0,
            token_delay=_env_float(env, "STANDIN_TOKEN_DELAY", 0.0) or 0.0,
            reply_tokens=int(raw_tokens),
            record=env.get("STANDIN_RECORD", "").strip(),
            stream_record=env.get("STANDIN_STREAM_RECORD", "").strip(),
            step_dir=_env_dir(env, "STANDIN_STEP_DIR"),
        )


# ---------------------------------------------------------------------------------------------------
# Command lines: tolerant parsing (real users pass engine arguments the stand-in does not know).


@dataclass
class Flag:
    """A known flag: `names` (first is canonical), `arity` 0 (boolean), 1 (one value) or "+" (values)."""

    names: tuple[str, ...]
    arity: int | str = 1
    dest: str = ""
    used: bool = True  # False: accepted for compatibility, has no effect in the stand-in

    def __post_init__(self) -> None:
        if not self.dest:
            long = next((n for n in self.names if n.startswith("--")), self.names[0])
            self.dest = long.lstrip("-").replace("-", "_")


@dataclass
class Parsed:
    values: dict[str, Any] = field(default_factory=dict)
    positionals: list[str] = field(default_factory=list)
    given: list[str] = field(default_factory=list)  # canonical flag names given, in order
    ignored: list[str] = field(default_factory=list)  # known flags without effect, with their values
    unknown: list[str] = field(default_factory=list)  # unknown flags, with the values we took for them


def parse_tolerant(argv: list[str], flags: list[Flag]) -> Parsed:
    """Parse `argv` against `flags`; unknown flags are kept (not fatal) in `Parsed.unknown`.

    An unknown `--flag` followed by a arg that does not start with `-` is taken as `--flag VALUE`
    (the common case, e.g. `--dtype half`); otherwise as a boolean flag. `--flag=value` works for all.
    """
    table = {name: flag for flag in flags for name in flag.names}
    out = Parsed()
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            out.positionals.extend(argv[i:])
            break
        if not arg.startswith("-") or arg == "-" or _is_number(arg):
            out.positionals.append(arg)
            continue
        name, eq, inline = arg.partition("=")
        flag = table.get(name)
        if flag is None:
            entry = [arg]
            if not eq and i < len(argv) and not argv[i].startswith("-"):
                entry.append(argv[i])
                i += 1
            out.unknown.extend(entry)
            continue
        if flag.arity == 0:
            value: Any = True
            if eq:
                value = inline.lower() not in ("0", "false", "no")
            consumed = [arg]
        elif flag.arity == 1:
            if eq:
                value = inline
            elif i < len(argv):
                value = argv[i]
                i += 1
            else:
                raise UsageError(f"argument {name}: expected one argument")
            consumed = [arg] if eq else [arg, value]
        else:
            items = [inline] if eq else []
            while not eq and i < len(argv) and not argv[i].startswith("-"):
                items.append(argv[i])
                i += 1
            if not items:
                raise UsageError(f"argument {name}: expected at least one argument")
            value = items
            consumed = [arg, *([] if eq else items)]
        out.values[flag.dest] = value
        out.given.append(flag.names[0])
        if not flag.used:
            out.ignored.extend(consumed)
    return out


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def parse_port(raw: Any, default: int) -> int:
    if raw is None:
        return default
    try:
        port = int(raw)
    except (TypeError, ValueError):
        raise UsageError(f"argument --port: invalid int value: {raw!r}") from None
    if not 0 <= port <= 65535:
        raise UsageError(f"argument --port: {port} is not a TCP port")
    return port


# ---------------------------------------------------------------------------------------------------
# Answers: deterministic text derived from the request, so tests can compare exact strings.

SIGNAL_STEP = 0.1  # seconds the main thread blocks at most: its signal handlers run between steps (waited)
WORDS = (
    "amber", "birch", "cedar", "delta", "ember", "fjord", "grove", "harbor", "island", "jasper",
    "kelp", "lumen", "maple", "nectar", "orbit", "pebble", "quartz", "river", "spruce", "tundra",
    "umber", "valley", "willow", "xenon", "yarrow", "zephyr", "anchor", "beacon", "canyon", "dune",
    "echo", "fern", "glacier", "heron", "iris", "juniper", "kestrel", "lagoon", "meadow", "nimbus",
    "oak", "prairie", "quill", "reef", "summit", "thistle", "upland", "vapor", "wren", "yonder",
)


def reply_tokens(seed: str, count: int) -> list[str]:
    """The first `count` tokens of the deterministic answer to `seed` (joined they form the text).

    The answer starts with "Stand-in answer:" so nobody mistakes it for a model's output.
    """
    tokens = ["Stand", "-in", " answer", ":"]
    digest = hashlib.sha256(seed.encode("utf-8", "replace")).digest()
    n = 0
    while len(tokens) < count:
        if n and n % len(digest) == 0:
            digest = hashlib.sha256(digest).digest()
        tokens.append(" " + WORDS[digest[n % len(digest)] % len(WORDS)])
        n += 1
    return tokens[:count]


# The pieces a byte-level BPE tokenizer (SmolLM2's, GPT-2's kind) splits text into before merging: a
# run of letters with the space before it, each digit on its own, each other symbol with the space
# before it, a run of whitespace.
_PIECES = re.compile(r" ?[^\W\d_]+|\d| ?[^\w\s]|_|\s+")
# A run of letters up to WORD_LETTERS long is taken for a word of the vocabulary, one token; a longer
# one for LETTERS_PER_TOKEN letters a token. Against SmolLM2's tokenizer: prose and numbers exact, 250
# tokens for 1,000 x's and 16 for two words of 34 and 28 letters exact, prose of long words +27 %.
WORD_LETTERS = 16
LETTERS_PER_TOKEN = 4


def count_tokens(text: str) -> int:
    """An estimate of a byte-level BPE tokenizer's count, for `usage` and the context check.

    Close for prose (a word is a token), and never a word count where there are no spaces: digits
    are a token each and a long run of letters several, so a document of numbers or code that is
    longer than the context is refused as the real engine refuses it."""
    return sum(_letters_tokens(len(piece.strip())) if piece[-1].isalpha() else 1 for piece in _PIECES.findall(text))


def _letters_tokens(letters: int) -> int:
    return 1 if letters <= WORD_LETTERS else math.ceil(letters / LETTERS_PER_TOKEN)


def message_text(messages: list[Any]) -> str:
    parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "\n".join(parts)


class RequestError(Exception):
    """An OpenAI-style error answer: status code, message, type and the parameter it is about."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.param = param


def error_body(status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    """The flat error object (SGLang's; vLLM nests it, see VllmProfile.error_body)."""
    return {"object": "error", "message": message, "type": kind, "param": param, "code": status}


# ---------------------------------------------------------------------------------------------------
# Multipart form data (the upload routes) and the request record.


@dataclass(frozen=True)
class Upload:
    """One file part of a multipart request."""

    filename: str
    content_type: str
    data: bytes


def _header_params(value: str) -> tuple[str, dict[str, str]]:
    """`form-data; name="a"; filename="b.wav"` -> ("form-data", {"name": "a", "filename": "b.wav"})."""
    message = Message()
    message["content-disposition"] = value
    params = message.get_params(header="content-disposition") or []
    main = params[0][0] if params else ""
    return main, {key.lower(): collapse_rfc2231_value(val) for key, val in params[1:]}


def parse_multipart(raw: bytes, content_type: str) -> dict[str, Any]:
    """A multipart/form-data body -> {field: text | Upload | [several]} (a repeated field is a list).

    Split on the boundary exactly (no line-ending rewriting), so a file part's bytes are what was sent.
    """
    message = Message()
    message["content-type"] = content_type
    boundary = message.get_param("boundary")
    if not isinstance(boundary, str) or not boundary:
        raise RequestError(400, "multipart/form-data without a boundary.")
    delimiter = b"--" + boundary.encode("latin-1")
    chunks = raw.split(delimiter)
    if len(chunks) < 2 or not chunks[-1].startswith(b"--"):
        raise RequestError(400, "malformed multipart/form-data body (no closing boundary).")
    form: dict[str, Any] = {}
    for chunk in chunks[1:-1]:
        part = chunk[2:] if chunk.startswith(b"\r\n") else chunk
        head, sep, data = part.partition(b"\r\n\r\n")
        if not sep:
            raise RequestError(400, "malformed multipart/form-data part (no header end).")
        data = data[:-2] if data.endswith(b"\r\n") else data
        headers: dict[str, str] = {}
        for line in head.decode("utf-8", "replace").split("\r\n"):
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        kind, params = _header_params(headers.get("content-disposition", ""))
        name = params.get("name")
        if kind != "form-data" or not name:
            raise RequestError(400, "multipart part without `Content-Disposition: form-data; name=...`.")
        value: Any
        if "filename" in params:
            value = Upload(params["filename"], headers.get("content-type", "application/octet-stream"), data)
        else:
            value = data.decode("utf-8", "replace")
        if name in form:
            previous = form[name]
            form[name] = [*previous, value] if isinstance(previous, list) else [previous, value]
        else:
            form[name] = value
    return form


_record_lock = threading.Lock()


def record_request(path: str, method: str, content_type: str, body: dict[str, Any], file: str) -> None:
    """Append one JSON line describing a served request to `file` (STANDIN_RECORD)."""
    entry: dict[str, Any] = {"method": method, "path": path, "content_type": content_type.split(";")[0]}
    if entry["content_type"] == "multipart/form-data":
        fields: dict[str, Any] = {}
        files: list[dict[str, Any]] = []
        for name, value in body.items():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, Upload):
                    files.append({"field": name, "filename": item.filename, "content_type": item.content_type,
                                  "size": len(item.data), "sha256": hashlib.sha256(item.data).hexdigest()})
                elif isinstance(value, list):
                    fields.setdefault(name, []).append(item)
                else:
                    fields[name] = item
        entry.update(form=fields, files=files)
    else:
        entry["json"] = body
    line = json.dumps(entry) + "\n"
    with _record_lock, open(file, "a", encoding="utf-8") as out:
        out.write(line)


# ---------------------------------------------------------------------------------------------------
# Configuration of one run (from the command line) and its state.


@dataclass
class ServeConfig:
    model: str  # what was asked to load (path or hub id)
    served_name: str  # the id in /v1/models and in answers
    host: str  # as given ("" = all interfaces)
    port: int
    max_model_len: int = 4096
    api_key: str | None = None
    access_log: bool = True
    skip_warmup: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class State:
    STARTING = "starting"
    READY = "ready"
    DEAD = "dead"

    def __init__(self) -> None:
        self.value = self.STARTING
        self.requests = 0
        self.lock = threading.Lock()


class EngineProfile:
    """What one engine contributes; subclasses override the hooks. See vllm_engine / sglang_engine."""

    name = "engine"
    display = "Engine"
    version = "0"
    owned_by = "engine"
    bind_early = False  # bind (not listen) before loading, as vLLM does
    listen_before_ready = False  # listen during warm-up answering /health 503, as SGLang does
    warmup_default = 0.0
    # What a listen-before-ready engine asks itself before its warm-up request (SGLang 0.5.23: /model_info).
    warmup_info_path = "/model_info"
    default_fail_reason = "RuntimeError: stand-in failure"
    default_warmup_reason = "RuntimeError: stand-in warm-up failure"
    default_crash_reason = "RuntimeError: stand-in crash"
    # The answers' shape where engines differ (the vLLM profile is held to the real vLLM by
    # tests/bases/test_vllm_differential.py): fields always sent as null, by where they go
    # ("completion", "chat", "text_choice", "chat_choice", "message", "usage", "first_chunk",
    # "chat_chunk_choice", "text_chunk_choice", "chat_finish_choice", "text_finish_choice"); whether
    # every chunk carries system_fingerprint (else only the last: the usage chunk, or without one the
    # finish chunk); whether a stream cut by max_tokens sends its finish_reason with the last token
    # (else in a chunk of its own, as a stream that stops always does); what a chat's own finish
    # chunk's delta holds.
    answer_nulls: ClassVar[dict[str, tuple[str, ...]]] = {}
    fingerprint_in_chunks = True
    finish_with_last_token = False
    finish_delta_content: str | None = None
    # /health's content type (None: the answer has none), for its empty body.
    health_content_type: str | None = "application/json"
    # A body that is not JSON, and a missing field: the error type and the parameter named.
    validation_kind = "BadRequestError"

    def error_body(self, status: int, message: str, kind: str, param: str | None) -> dict[str, Any]:
        """The body of an error answer."""
        return error_body(status, message, kind, param)

    def invalid_json(self, raw: bytes, exc: ValueError) -> RequestError:
        """The error for a body that does not parse as JSON."""
        return RequestError(400, "request body is not valid JSON")

    def missing_field(self, name: str) -> RequestError:
        """The error for a required field left out."""
        return RequestError(400, f"{name} must be a non-empty list.")

    def model_card_extra(self, cfg: ServeConfig) -> dict[str, Any]:
        """Fields of /v1/models' card beyond the common ones."""
        return {}

    def check_max_tokens(self, max_tokens: int | None, max_model_len: int) -> None:
        """Refuse a max_tokens the engine refuses on its own, before the context check (none here)."""

    def check_context(self, prompt_tokens: int, max_tokens: int | None, count: int, max_model_len: int) -> int:
        """Refuse a request the context cannot hold; return the tokens to generate (at most `count`).

        Here the prompt and the tokens asked for (max_tokens, else the full answer) must fit together."""
        wanted = max_tokens or count
        if prompt_tokens + wanted > max_model_len:
            raise RequestError(400, f"This model's maximum context length is {max_model_len} tokens. "
                               f"However, you requested {prompt_tokens + wanted} tokens "
                               f"({prompt_tokens} in the messages, {wanted} in the "
                               "completion). Please reduce the length of the messages or completion.")
        return count

    def missing_prompt(self) -> RequestError:
        """The error for a completion without a prompt (or with an empty one)."""
        return RequestError(400, "prompt must be a string or a list of strings.")

    def nulls(self, where: str) -> dict[str, None]:
        """The always-null fields of one part of an answer."""
        return dict.fromkeys(self.answer_nulls.get(where, ()))

    def parse(self, argv: list[str]) -> ServeConfig:
        raise NotImplementedError

    # Log hooks: each prints the engine's lines for one moment of the timeline.
    def banner(self, cfg: ServeConfig, opts: Options) -> None: ...
    def loading(self, cfg: ServeConfig) -> None: ...
    def loaded(self, cfg: ServeConfig, seconds: float) -> None: ...
    def listening(self, cfg: ServeConfig) -> None: ...
    def ready(self, cfg: ServeConfig) -> None: ...
    def fatal_load(self, cfg: ServeConfig, reason: str) -> None: ...
    def fatal_warmup(self, cfg: ServeConfig, reason: str) -> None: ...
    def crash(self, cfg: ServeConfig, reason: str) -> None: ...
    def bind_error(self, cfg: ServeConfig, exc: OSError) -> None: ...
    def uvicorn(self, msg: str) -> None: ...

    def shutdown(self, cfg: ServeConfig) -> None:
        """uvicorn's shutdown lines: both engines serve through uvicorn, each in its own log format."""
        for line in ("Shutting down", "Waiting for application shutdown.", "Application shutdown complete.",
                     f"Finished server process [{getattr(self, 'pid', 0)}]"):
            self.uvicorn(line)

    def access(self, client: str, method: str, path: str, status: int) -> None: ...

    def extra_routes(self) -> dict[tuple[str, str], Callable[[Handler, dict[str, Any]], None]]:
        return {}

    def display_host(self, cfg: ServeConfig) -> str:
        host = cfg.host or "0.0.0.0"  # noqa: S104 - how engines print "all interfaces"
        return f"[{host}]" if ":" in host else host


# ---------------------------------------------------------------------------------------------------
# HTTP


class StandinServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # uvicorn's listen backlog (socketserver's default is 5: 16 clients connecting at once overflow it
    # and some wait for a SYN retransmit, a stall the real engines do not have).
    request_queue_size = 2048

    def __init__(self, profile: EngineProfile, cfg: ServeConfig, opts: Options, state: State) -> None:
        family = socket.AF_INET6 if ":" in cfg.host else socket.AF_INET
        self.address_family = family
        super().__init__((cfg.host, cfg.port), Handler, bind_and_activate=False)
        self.profile = profile
        self.cfg = cfg
        self.opts = opts
        self.state = state


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY on every connection, as uvicorn's asyncio transports have. Without it a response's
    # body (a second send after the headers) waits for the client's delayed ACK of the headers:
    # ~40 ms per answer on a keep-alive connection, a stall the real engines do not have.
    disable_nagle_algorithm = True
    server_version = "uvicorn"
    sys_version = ""
    server: StandinServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the engine's own access-log format is printed by send_head()

    # -- plumbing ---------------------------------------------------------------------------------

    def send_head(self, status: int, content_type: str | None, length: int | None) -> None:
        self.send_response_only(status)
        self.send_header("date", self.date_time_string())
        self.send_header("server", "uvicorn")
        if content_type is not None:
            self.send_header("content-type", content_type)
        if length is None:
            self.send_header("transfer-encoding", "chunked")
        else:
            self.send_header("content-length", str(length))
        self.end_headers()
        if self.server.cfg.access_log:
            path = self.path
            self.server.profile.access(self._client(), self.command, path, status)

    def _client(self) -> str:
        host, port = self.client_address[:2]
        return f"{host}:{port}"

    def send_json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_head(status, "application/json", len(data))
        self.wfile.write(data)

    def send_empty(self, status: int, content_type: str | None = "application/json") -> None:
        self.send_head(status, content_type, 0)

    def send_error_json(self, status: int, message: str, kind: str = "BadRequestError",
                        param: str | None = None) -> None:
        self.send_json(status, self.server.profile.error_body(status, message, kind, param))

    def read_json(self) -> dict[str, Any]:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"null")
        except ValueError as exc:
            raise self.server.profile.invalid_json(raw, exc) from None
        if not isinstance(body, dict):
            raise RequestError(400, "request body must be a JSON object")
        return body

    def read_raw(self) -> bytes:
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    def read_form(self) -> dict[str, Any]:
        """A multipart/form-data body (the upload routes), parsed by parse_multipart."""
        content_type = self.headers.get("content-type", "")
        raw = self.read_raw()
        if not content_type.lower().startswith("multipart/form-data"):
            raise RequestError(400, "this route takes multipart/form-data.")
        return parse_multipart(raw, content_type)

    def send_bytes(self, status: int, content_type: str, data: bytes) -> None:
        self.send_head(status, content_type, len(data))
        self.wfile.write(data)

    def chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def sse(self, payload: Any) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload)
        self.chunk(f"data: {text}\n\n".encode())

    # -- dispatch ---------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self.dispatch("GET")

    def do_POST(self) -> None:
        self.dispatch("POST")

    def dispatch(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        routes = {**BASE_ROUTES, **self.server.profile.extra_routes()}
        handler = routes.get((method, path))
        try:
            if handler is None:
                if any(p == path for (_, p) in routes):
                    self.send_json(405, {"detail": "Method Not Allowed"})
                else:
                    self.send_json(404, {"detail": "Not Found"})
                return
            body: dict[str, Any] = {}
            if method == "POST":
                body = self.read_form() if getattr(handler, "takes_form", False) else self.read_json()
                if self.server.opts.record:
                    record_request(path, method, self.headers.get("content-type", ""), body,
                                   self.server.opts.record)
            handler(self, body)
        except RequestError as exc:
            self.send_error_json(exc.status, str(exc), exc.kind, exc.param)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # -- state gates ------------------------------------------------------------------------------

    def require_ready(self, *, auth: bool = True, starting_ok: bool = False) -> None:
        state = self.server.state.value
        if state == State.DEAD:
            raise RequestError(500, "EngineCore encountered an issue. See stack trace (above) for "
                               "the root cause.", "EngineDeadError")
        if state != State.READY and not starting_ok:
            raise RequestError(503, "The server is starting up.", "ServiceUnavailableError")
        key = self.server.cfg.api_key
        if auth and key and self.headers.get("authorization", "") != f"Bearer {key}":
            raise RequestError(401, "Unauthorized", "AuthenticationError")

    def check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        cfg = self.server.cfg
        if model and model not in (cfg.served_name, cfg.model):
            raise RequestError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")


def _health(h: Handler, _body: dict[str, Any]) -> None:
    h.send_empty(200 if h.server.state.value == State.READY else 503, h.server.profile.health_content_type)


def _models(h: Handler, _body: dict[str, Any]) -> None:
    h.require_ready()
    cfg = h.server.cfg
    h.send_json(200, {"object": "list", "data": [{
        "id": cfg.served_name, "object": "model", "created": int(time.time()),
        "owned_by": h.server.profile.owned_by, "root": cfg.model, "parent": None,
        "max_model_len": cfg.max_model_len, **h.server.profile.model_card_extra(cfg),
    }]})


def _max_tokens(body: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RequestError(400, f"{key} must be at least 1, got {value!r}.")
        return value
    return None


def _n_choices(body: dict[str, Any]) -> int:
    n = body.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 16:
        raise RequestError(400, f"n must be an integer between 1 and 16, got {n!r}.")
    return n


def _generate(h: Handler, kind: str, seed: str, prompt_tokens: int, body: dict[str, Any],
              max_tokens: int | None) -> None:
    """Answer a completion (`kind` "text") or chat completion (`kind` "chat"), streaming or not."""
    cfg, opts, profile = h.server.cfg, h.server.opts, h.server.profile
    full = opts.reply_tokens
    profile.check_max_tokens(max_tokens, cfg.max_model_len)
    count = profile.check_context(prompt_tokens, max_tokens, min(full, max_tokens) if max_tokens else full,
                                  cfg.max_model_len)
    finish = "length" if count < full else "stop"
    n = _n_choices(body)
    choices = [reply_tokens(f"{seed}\x00{i}" if i else seed, count) for i in range(n)]
    with h.server.state.lock:
        h.server.state.requests += 1
    created = int(time.time())
    rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
    obj = "chat.completion" if kind == "chat" else "text_completion"
    kind_name = "chat" if kind == "chat" else "completion"
    fingerprint = f"{profile.name}-{profile.version}"
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": count * n,
             "total_tokens": prompt_tokens + count * n}
    if not body.get("stream"):
        if opts.token_delay:
            time.sleep(opts.token_delay * count)
        out = []
        for i, tokens in enumerate(choices):
            text = "".join(tokens)
            if kind == "chat":
                out.append({"index": i, "message": {"role": "assistant", "content": text, **profile.nulls("message")},
                            "logprobs": None, "finish_reason": finish, **profile.nulls("chat_choice")})
            else:
                out.append({"index": i, "text": text, "logprobs": None, "finish_reason": finish,
                            **profile.nulls("text_choice")})
        h.send_json(200, {"id": rid, "object": obj, "created": created, "model": cfg.served_name,
                          "system_fingerprint": fingerprint, "choices": out,
                          "usage": {**usage, **profile.nulls("usage")}, **profile.nulls(kind_name)})
        return
    h.send_head(200, "text/event-stream; charset=utf-8", None)
    obj += ".chunk" if kind == "chat" else ""
    head = {"id": rid, "object": obj, "created": created, "model": cfg.served_name,
            **({"system_fingerprint": fingerprint} if profile.fingerprint_in_chunks else {})}

    def choice(i: int, piece: str | None, reason: str | None, role: bool = False) -> dict[str, Any]:
        part = "chat" if kind == "chat" else "text"
        extra = {} if role else profile.nulls(f"{part}_finish_choice" if reason else f"{part}_chunk_choice")
        if kind == "chat":
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if reason is not None and piece is None:
                piece = profile.finish_delta_content
            if piece is not None:
                delta["content"] = piece
            return {"index": i, "delta": delta, "logprobs": None, "finish_reason": reason, **extra}
        return {"index": i, "text": piece or "", "logprobs": None, "finish_reason": reason, **extra}

    # (event, whether the token delay comes before it): one delay per generated token step.
    events: list[tuple[Any, bool]] = []
    if kind == "chat":
        events += [({**head, "choices": [choice(i, "", None, role=True)], **profile.nulls("first_chunk")}, False)
                   for i in range(n)]
    options = body.get("stream_options") or {}
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    # Without a usage chunk after them the finish chunks end the stream, and carry the fingerprint.
    last_head = head if include_usage else {**head, "system_fingerprint": fingerprint}
    # Cut by max_tokens, the last token's chunk carries finish_reason; a stop is a step of its own
    # (the end-of-sequence token, no text).
    joined = profile.finish_with_last_token and finish == "length"
    for step in range(count):
        last = joined and step == count - 1
        events += [({**(last_head if last else head), "choices": [choice(i, tokens[step], finish if last else None)]},
                    i == 0) for i, tokens in enumerate(choices)]
    if not joined:
        events += [({**last_head, "choices": [choice(i, "" if kind == "text" else None, finish)]}, False)
                   for i in range(n)]
    if include_usage:
        events.append(({**head, "system_fingerprint": fingerprint, "choices": [], "usage": usage}, False))
    events.append(("[DONE]", False))
    _stream(h, events, seed)


def _stream(h: Handler, events: list[tuple[Any, bool]], prompt: str) -> None:
    """Write `events` as SSE (the token delay before each marked one; in step mode the test's release
    before every event after the first) and record how the stream ended (STANDIN_STREAM_RECORD), with
    the prompt it answered so that a test finds its own stream's record, not an earlier one's."""
    opts = h.server.opts
    steps = Steps(opts.step_dir) if opts.step_dir else None
    written, outcome = 0, "complete"
    try:
        for event, delayed in events:
            if steps is not None and written and not steps.wait(written):
                outcome = "step timeout"
                break
            if delayed and opts.token_delay:
                time.sleep(opts.token_delay)
            h.sse(event)
            written += 1
            if steps is not None:
                steps.wrote(written)
        if outcome == "complete":
            h.chunk(b"")
    except OSError as exc:  # the client (the worker) closed the connection: generation stops here
        outcome = type(exc).__name__
        h.close_connection = True
    if opts.stream_record:
        line = json.dumps({"stream": h.path, "prompt": prompt, "events": written, "outcome": outcome}) + "\n"
        with _record_lock, open(opts.stream_record, "a", encoding="utf-8") as out:
            out.write(line)


def _completions(h: Handler, body: dict[str, Any]) -> None:
    h.require_ready()
    h.check_model(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        prompt = "\n".join(prompt)
    if prompt is None or prompt == "":
        raise h.server.profile.missing_prompt()
    if not isinstance(prompt, str):
        raise RequestError(400, "prompt must be a string or a list of strings.")
    _generate(h, "text", prompt, count_tokens(prompt), body, _max_tokens(body, "max_tokens"))


def _chat(h: Handler, body: dict[str, Any]) -> None:
    h.require_ready()
    h.check_model(body)
    messages = body.get("messages")
    if "messages" not in body:
        raise h.server.profile.missing_field("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages must be a non-empty list.")
    text = message_text(messages)
    _generate(h, "chat", text, count_tokens(text) + 4 * len(messages), body,
              _max_tokens(body, "max_completion_tokens", "max_tokens"))


BASE_ROUTES: dict[tuple[str, str], Callable[[Handler, dict[str, Any]], None]] = {
    ("GET", "/health"): _health,
    ("GET", "/v1/models"): _models,
    ("POST", "/v1/completions"): _completions,
    ("POST", "/v1/chat/completions"): _chat,
}


def generate_route(h: Handler, body: dict[str, Any]) -> None:
    """SGLang's native /generate: {"text": ..., "sampling_params": {"max_new_tokens": N}}."""
    h.require_ready(auth=False, starting_ok=True)  # SGLang's own warm-up calls it while starting
    text = body.get("text", "")
    if isinstance(text, list):
        text = "\n".join(str(t) for t in text)
    params = body.get("sampling_params") or {}
    max_new = params.get("max_new_tokens") if isinstance(params, dict) else None
    full = h.server.opts.reply_tokens
    count = min(full, max_new) if isinstance(max_new, int) and max_new > 0 else full
    h.send_json(200, {"text": "".join(reply_tokens(str(text), count)), "meta_info": {
        "id": uuid.uuid4().hex, "finish_reason": {"type": "length" if count < full else "stop"},
        "prompt_tokens": count_tokens(str(text)), "completion_tokens": count}})


# ---------------------------------------------------------------------------------------------------
# The run loop


def _connect_host(host: str) -> str:
    if host in ("", "0.0.0.0"):  # noqa: S104 - a bind address, mapped to loopback
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def self_request(cfg: ServeConfig, method: str, path: str, body: Any = None) -> tuple[int, str]:
    """One request to our own port (SGLang's warm-up does this to itself)."""
    conn = http.client.HTTPConnection(_connect_host(cfg.host), cfg.port, timeout=30)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"content-type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()


def run(profile: EngineProfile, argv: list[str]) -> int:
    """Run the stand-in engine `profile` with command-line `argv`; return the exit code."""
    try:
        opts = Options.from_env(warmup_default=profile.warmup_default)
        cfg = profile.parse(argv)
    except UsageError as exc:
        emit(f"{profile.name}: error: {exc}", sys.stderr)
        return 2
    state = State()
    server = StandinServer(profile, cfg, opts, state)
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    profile.banner(cfg, opts)

    def bind() -> bool:
        try:
            server.server_bind()
        except OSError as exc:
            profile.bind_error(cfg, exc)
            server.server_close()
            return False
        cfg.port = server.server_address[1]  # resolves --port 0
        return True

    if profile.bind_early and not bind():
        return 1
    profile.loading(cfg)
    started = time.monotonic()
    if waited(stop, opts.load_seconds):
        server.server_close()
        return 0
    if opts.fail_load == "load" or (opts.fail_load == "warmup" and not profile.listen_before_ready):
        profile.fatal_load(cfg, opts.fail_reason or profile.default_fail_reason)
        server.server_close()
        return 1
    profile.loaded(cfg, time.monotonic() - started)
    if not profile.bind_early and not bind():
        return 1

    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                               name="standin-http", daemon=True)
    warmup = 0.0 if cfg.skip_warmup else opts.warmup_seconds
    if profile.listen_before_ready:
        server.server_activate()
        serving.start()
        profile.listening(cfg)
        if waited(stop, warmup):
            return _stop(profile, cfg, server, 0)
        if opts.fail_load == "warmup":
            profile.fatal_warmup(cfg, opts.fail_reason or profile.default_warmup_reason)
            server.shutdown()
            server.server_close()
            return 1
        if not cfg.skip_warmup:
            try:
                self_request(cfg, "GET", profile.warmup_info_path)
                status, text = self_request(cfg, "POST", "/generate", {
                    "text": "The capital city of France is",
                    "sampling_params": {"temperature": 0, "max_new_tokens": 8}})
            except OSError as exc:
                status, text = 0, str(exc)
            if status != 200:
                # SGLang 0.5.23 asserts the warm-up answer with `assert res.status_code == 200, f"{res.text}"`.
                profile.fatal_warmup(cfg, f"AssertionError: {text}")
                server.shutdown()
                server.server_close()
                return 1
        state.value = State.READY
        profile.ready(cfg)
    else:
        if waited(stop, warmup):
            server.server_close()
            return 0
        # vLLM's order: uvicorn prints its startup lines (the load line among them) and only then
        # listens on the socket bound before the load; a client acting on the load line can be refused.
        state.value = State.READY
        profile.listening(cfg)
        profile.ready(cfg)
        server.server_activate()
        serving.start()

    if opts.crash_after_load is not None and not waited(stop, opts.crash_after_load):
        state.value = State.DEAD
        profile.crash(cfg, opts.fail_reason or profile.default_crash_reason)
        waited(stop, opts.exit_delay)
        return _stop(profile, cfg, server, 1)
    waited(stop)
    return _stop(profile, cfg, server, 0)


def waited(stop: threading.Event, seconds: float | None = None) -> bool:
    """`stop.wait(seconds)` in steps of SIGNAL_STEP. The kernel may hand SIGTERM to any thread (the
    HTTP threads included); Python then runs its handler only when the main thread next runs
    bytecode, so a main thread blocked in one long wait never saw it: a stop right after the load,
    with the worker's 256 engine connections each on a thread, hung until Docker's SIGKILL."""
    deadline = None if seconds is None else time.monotonic() + seconds
    while True:
        step = SIGNAL_STEP if deadline is None else min(SIGNAL_STEP, deadline - time.monotonic())
        if step <= 0:
            return stop.is_set()
        if stop.wait(step):
            return True


def _stop(profile: EngineProfile, cfg: ServeConfig, server: StandinServer, code: int) -> int:
    profile.shutdown(cfg)
    server.shutdown()
    server.server_close()
    return code
