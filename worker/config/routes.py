"""The routes the worker can serve, which of them it serves (OPENAI_ROUTES), which one it
benchmarks (BENCHMARK_ROUTE), and a benchmark request for each.

app/core.py turns `handler_specs()` into the SDK's HandlerConfigs. Everything here is pure (no SDK), so every
rule is unit-tested on the host. See docs/routes.md.
"""

from __future__ import annotations

import base64
import io
import random
import struct
import wave
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from config import table, uploads, workload
from config.uploads import UploadLimits
from config.workload import References

ROUTES_VAR = "OPENAI_ROUTES"
BENCHMARK_ROUTE_VAR = "BENCHMARK_ROUTE"
EMBED_CHARS_VAR = "BENCHMARK_EMBED_CHARS"
SPEECH_VOICE_VAR = "BENCHMARK_SPEECH_VOICE"
DEFAULT_ROUTES = ("/v1/completions", "/v1/chat/completions")
DEFAULT_BENCHMARK_ROUTE = "/v1/completions"
SPEECH_FILE = Path(__file__).with_name("benchmark_speech.wav")
PROMPT_WORDS = 250  # the completion benchmark's prompt (upstream's)
BATCH_ITEMS = 4  # a batch benchmark splits one reference request this many ways
ENGINE_SPEAKS = "vLLM-Omni"


@dataclass(frozen=True)
class Route:
    """One route: how the client sends it (always a JSON envelope) and how the engine gets it.

    `request` is "json" or "multipart" (what the engine receives); `uploads` the envelope fields
    that carry base64 files; `references` the fields that must be http(s) URLs or data: URIs;
    `streams` whether the engine can answer it as a server-sent-event stream; `runs` and
    `concurrency` its benchmark size (upstream's); `response` what comes back.
    """

    path: str
    request: str
    response: str
    streams: bool = False
    uploads: tuple[str, ...] = ()
    references: tuple[str, ...] = ()
    runs: int = 3
    concurrency: int = 10
    method: str = "POST"  # the SDK proxies POSTs only


ROUTE_TABLE: tuple[Route, ...] = (
    Route("/v1/completions", "json", "JSON, or SSE with stream", streams=True),
    Route("/v1/chat/completions", "json", "JSON, or SSE with stream", streams=True),
    Route("/v1/chat/completions/batch", "json", "JSON (one choice list per conversation)"),
    Route("/v1/embeddings", "json", "JSON"),
    Route("/v1/rerank", "json", "JSON"),
    Route("/v1/score", "json", "JSON"),
    Route("/v1/audio/speech", "json", "audio bytes",
          references=("ref_audio", "ref_audio_2", "references[].audio_path"), runs=2, concurrency=4),
    Route("/v1/audio/speech/batch", "json", "JSON, audio base64'd per item",
          references=("ref_audio", "items[].ref_audio"), runs=2, concurrency=4),
    Route("/v1/audio/generate", "json", "audio bytes", runs=1, concurrency=2),
    Route("/v1/audio/transcriptions", "multipart", "JSON or text, or SSE with stream", streams=True,
          uploads=("file",), runs=2, concurrency=4),
    Route("/v1/audio/translations", "multipart", "JSON or text, or SSE with stream", streams=True,
          uploads=("file",), runs=2, concurrency=4),
    Route("/v1/images/generations", "json", "JSON (b64_json or url)", runs=1, concurrency=2),
    Route("/v1/images/edits", "multipart", "JSON (b64_json or url)", uploads=("image", "mask"),
          references=("url", "url[]"), runs=1, concurrency=2),
    Route("/v1/videos/sync", "multipart", "video/mp4 bytes",
          uploads=tuple(f.name for f in uploads.UPLOAD_FIELDS["/v1/videos/sync"]),
          references=tuple(f"{k}.{v}" for k, v in uploads.VIDEO_REFERENCE_FIELDS.items()),
          runs=1, concurrency=1),
)
ROUTES: dict[str, Route] = {r.path: r for r in ROUTE_TABLE}
SPEECH_ROUTES = ("/v1/audio/speech", "/v1/audio/speech/batch")


class RouteConfigError(ValueError):
    """OPENAI_ROUTES / BENCHMARK_ROUTE cannot run a worker; each of `lines` is one user-facing line."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines


@dataclass(frozen=True)
class RouteSettings:
    """What this module reads from the environment (see load_route_settings)."""

    routes: tuple[str, ...]
    benchmark_route: str
    embed_chars: int = workload.DEFAULT_EMBED_CHARS
    speech_voice: str | None = None
    limits: UploadLimits = field(default_factory=UploadLimits)
    warnings: tuple[str, ...] = ()


def _value(env: Mapping[str, str], name: str) -> str | None:
    return table.text(env, name)


def _positive(env: Mapping[str, str], name: str, default: int, warnings: list[str]) -> int:
    return table.parse(env, name, "digits", "warn", default, warnings)


def _route_name(raw: str) -> str:
    """A route as written by a user: surrounding blanks and a trailing slash do not matter."""
    text = raw.strip()
    return text.rstrip("/") if len(text) > 1 else text


def load_route_settings(env: Mapping[str, str]) -> RouteSettings:
    """OPENAI_ROUTES, BENCHMARK_ROUTE, BENCHMARK_EMBED_CHARS, BENCHMARK_SPEECH_VOICE and the upload
    limits. Raises RouteConfigError (one line per problem) on an unknown route or a benchmark route
    OPENAI_ROUTES leaves out; a malformed number is a warning and its default.
    """
    known = ", ".join(ROUTES)
    lines: list[str] = []
    warnings: list[str] = []
    benchmarked = _route_name(_value(env, BENCHMARK_ROUTE_VAR) or DEFAULT_BENCHMARK_ROUTE)
    if benchmarked not in ROUTES:
        lines.append(f"{BENCHMARK_ROUTE_VAR}={benchmarked!r} is not a route this worker serves; "
                     f"set it to one of {known}")
    raw_routes = _value(env, ROUTES_VAR)
    if raw_routes is None:
        # Unset: what the worker served before, plus the benchmarked route so it can become ready.
        routes = list(DEFAULT_ROUTES)
        if benchmarked in ROUTES and benchmarked not in routes:
            routes.append(benchmarked)
    else:
        routes = []
        for item in raw_routes.split(","):
            name = _route_name(item)
            if not name:
                continue
            if name not in ROUTES:
                lines.append(f"{ROUTES_VAR} names {name!r}, which is not a route; use any of {known}")
            elif name not in routes:
                routes.append(name)
        if not routes and not lines:
            lines.append(f"{ROUTES_VAR}={raw_routes!r} names no route; list them comma-separated, "
                         f"e.g. {','.join(DEFAULT_ROUTES)}")
        elif benchmarked in ROUTES and routes and benchmarked not in routes:
            lines.append(f"{BENCHMARK_ROUTE_VAR}={benchmarked} is not served: {ROUTES_VAR} leaves it "
                         f"out. Add {benchmarked} to {ROUTES_VAR}, or set {BENCHMARK_ROUTE_VAR} to "
                         f"one of {', '.join(routes)}")
    if lines:
        raise RouteConfigError(lines)
    if benchmarked == "/v1/audio/speech/batch":
        warnings.append(f"{BENCHMARK_ROUTE_VAR}=/v1/audio/speech/batch: vLLM-Omni answers a batch 200 even "
                        "when its items fail, so this benchmark cannot see a failing model; benchmark "
                        "/v1/audio/speech instead")
    file_bytes = _positive(env, uploads.MAX_UPLOAD_BYTES_VAR, uploads.DEFAULT_MAX_UPLOAD_BYTES, warnings)
    request_bytes = _positive(env, uploads.MAX_REQUEST_UPLOAD_BYTES_VAR,
                              max(uploads.DEFAULT_MAX_REQUEST_UPLOAD_BYTES, file_bytes), warnings)
    return RouteSettings(
        routes=tuple(routes),
        benchmark_route=benchmarked,
        embed_chars=_positive(env, EMBED_CHARS_VAR, workload.DEFAULT_EMBED_CHARS, warnings),
        speech_voice=_value(env, SPEECH_VOICE_VAR),
        limits=UploadLimits(file_bytes=file_bytes, request_bytes=request_bytes),
        warnings=tuple(warnings),
    )


def startup_lines(settings: RouteSettings) -> list[str]:
    """What the worker prints at start: the routes served and the benchmarked one, with the hint."""
    return [f"bakery-worker: serving: {', '.join(settings.routes)}",
            f"bakery-worker: benchmarking: {settings.benchmark_route}. If this model does not serve "
            f"it, set {BENCHMARK_ROUTE_VAR} to the route it does (and list it in {ROUTES_VAR})."]


# --------------------------------------------------------------------------- benchmark requests


def words_text(words: list[str], chars: int, rng: random.Random) -> str:
    """Random words from `words`, exactly `chars` characters long (the last word cut)."""
    out: list[str] = []
    size = -1  # the joined length: each word adds itself and a space, the first no space
    while size < chars or not out:
        word = rng.choice(words)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:max(chars, 1)]


def speech_clip(seconds: float = workload.REF_AUDIO_SECONDS, rng: random.Random | None = None,
                path: Path = SPEECH_FILE) -> bytes:
    """The bundled speech (scripts/make_benchmark_speech.py) tiled to `seconds`, as a WAV whose last
    frames are random, so no engine serves it from a cache keyed by content."""
    with wave.open(str(path)) as clip:
        params = clip.getparams()
        frames = clip.readframes(clip.getnframes())
    frame = params.sampwidth * params.nchannels
    want = int(seconds * params.framerate) * frame
    data = (frames * (want // len(frames) + 1))[:want]
    tail = (rng or random.Random()).randbytes(8 * frame)  # noqa: S311 (cache-busting, not a secret)
    data = data[:len(data) - len(tail)] + tail
    out = io.BytesIO()
    with wave.open(out, "wb") as clip:
        clip.setnchannels(params.nchannels)
        clip.setsampwidth(params.sampwidth)
        clip.setframerate(params.framerate)
        clip.writeframes(data)
    return out.getvalue()


def png_image(side: int, rng: random.Random, tile: int = 64) -> bytes:
    """An RGB PNG of `side` x `side` random tiles: cheap to make and new each call."""
    rows = [rng.randbytes(tile * 3) * (side // tile + 1) for _ in range(tile)]
    raw = b"".join(b"\x00" + rows[y % tile][:side * 3] for y in range(side))  # filter 0 each row

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 1))
            + chunk(b"IEND", b""))


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


@dataclass(frozen=True)
class BenchmarkInputs:
    """What benchmark requests are made of: the word list, model id, BENCHMARK_MAX_TOKENS,
    BENCHMARK_EMBED_CHARS and BENCHMARK_SPEECH_VOICE."""

    words: list[str]
    model_id: str | None = None
    max_tokens: int = 500
    embed_chars: int = workload.DEFAULT_EMBED_CHARS
    speech_voice: str | None = None


def benchmark_generator(route: str, inputs: BenchmarkInputs,
                        rng: random.Random | None = None) -> Callable[[], dict[str, Any]]:
    """A factory of benchmark requests for `route`, each the body a client would send (uploads
    base64'd) and each worth exactly one reference request (workload.py)."""
    if route not in ROUTES:
        raise KeyError(route)
    rand = rng or random.Random()  # noqa: S311 (benchmark text, not a secret)
    words, tokens = inputs.words, inputs.max_tokens
    side = workload.REF_IMAGE_SIDE

    def text(chars: int) -> str:
        return words_text(words, chars, rand)

    def prompt(count: int) -> str:
        return " ".join(rand.choices(words, k=count))

    voice = {"voice": inputs.speech_voice} if inputs.speech_voice else {}
    bodies: dict[str, Callable[[], dict[str, Any]]] = {
        "/v1/completions": lambda: {"prompt": prompt(PROMPT_WORDS), "temperature": 0.7,
                                    "max_tokens": tokens},
        "/v1/chat/completions": lambda: {
            "messages": [{"role": "user", "content": prompt(PROMPT_WORDS)}], "temperature": 0.7,
            "max_tokens": tokens},
        "/v1/chat/completions/batch": lambda: {
            "messages": [[{"role": "user", "content": prompt(PROMPT_WORDS // BATCH_ITEMS)}]
                         for _ in range(BATCH_ITEMS)],
            "temperature": 0.7, "max_tokens": max(tokens // BATCH_ITEMS, 1)},
        "/v1/embeddings": lambda: {"input": text(inputs.embed_chars)},
        "/v1/rerank": lambda: {"query": text(workload.RERANK_QUERY_CHARS),
                               "documents": [text(workload.RERANK_DOC_CHARS)
                                             for _ in range(workload.RERANK_DOCS)]},
        # text_1/text_2: the score shape every vLLM release with /v1/score accepts (queries/items only newer ones).
        "/v1/score": lambda: {"text_1": text(workload.RERANK_QUERY_CHARS),
                              "text_2": [text(workload.RERANK_DOC_CHARS)
                                         for _ in range(workload.RERANK_DOCS)]},
        "/v1/audio/speech": lambda: {"input": text(workload.REF_SPEECH_CHARS), **voice},
        "/v1/audio/speech/batch": lambda: {
            "items": [{"input": text(workload.REF_SPEECH_CHARS // BATCH_ITEMS)}
                      for _ in range(BATCH_ITEMS)], **voice},
        "/v1/audio/generate": lambda: {"input": text(60), "audio_length": 10.0},
        "/v1/audio/transcriptions": lambda: {"file": _b64(speech_clip(rng=rand)),
                                             "filename": "benchmark.wav"},
        "/v1/audio/translations": lambda: {"file": _b64(speech_clip(rng=rand)),
                                           "filename": "benchmark.wav"},
        "/v1/images/generations": lambda: {"prompt": text(60), "size": f"{side}x{side}", "n": 1},
        "/v1/images/edits": lambda: {"image": _b64(png_image(side, rand)), "filename": "image.png",
                                     "prompt": text(60), "size": f"{side}x{side}", "n": 1},
        "/v1/videos/sync": lambda: {"prompt": text(60), "width": workload.REF_VIDEO_WIDTH,
                                    "height": workload.REF_VIDEO_HEIGHT,
                                    "num_frames": workload.REF_VIDEO_FRAMES},
    }
    make = bodies[route]

    def generate() -> dict[str, Any]:
        body = make()
        if inputs.model_id:  # without one, engines serve their only model (llama.cpp ignores it)
            body["model"] = inputs.model_id
        return body

    return generate


# --------------------------------------------------------------------------- handler specs


@dataclass(frozen=True)
class BenchmarkSpec:
    """The benchmark of the benchmarked route (SDK BenchmarkConfig)."""

    generator: Callable[[], dict[str, Any]]
    runs: int
    concurrency: int


@dataclass(frozen=True)
class HandlerSpec:
    """One served route, SDK-free. A JSON route has `request_parser` and `workload`; a multipart
    route has `upload` (its payload class comes from uploads.payload_class)."""

    route: str
    request_parser: Callable[[Any], dict[str, Any]] | None
    workload: Callable[[dict[str, Any]], float] | None
    benchmark: BenchmarkSpec | None
    upload: bool
    limits: UploadLimits
    references: References
    model_id: str | None = None


def request_parser(route: str, limits: UploadLimits) -> Callable[[Any], dict[str, Any]]:
    """The request parser of a JSON route: the body (or its `input` object); the speech routes
    also refuse a reference that is not an http(s) URL or a data: URI (UploadError)."""
    if route in SPEECH_ROUTES:
        def parse_speech(body: Any) -> dict[str, Any]:
            return uploads.check_speech(route, body, limits)
        return parse_speech

    def parse(body: Any) -> dict[str, Any]:
        # `input` is the text itself on embeddings and speech: only an object is an envelope.
        inner = body.get("input") if isinstance(body, dict) else None
        return inner if isinstance(inner, dict) else body

    return parse


def handler_specs(settings: RouteSettings, *, words: list[str], model_id: str | None,
                  max_tokens: int, runs: int | None = None,
                  concurrency: int | None = None) -> list[HandlerSpec]:
    """The served routes, in OPENAI_ROUTES order; only the benchmarked one has a benchmark.

    `max_tokens` is BENCHMARK_MAX_TOKENS (also the workload unit). `runs` / `concurrency` override
    the route's own benchmark size (pass BENCHMARK_RUNS / BENCHMARK_CONCURRENCY only when set).
    """
    refs = References(max_tokens=max_tokens, embed_chars=settings.embed_chars)
    inputs = BenchmarkInputs(words=words, model_id=model_id, max_tokens=max_tokens,
                             embed_chars=settings.embed_chars, speech_voice=settings.speech_voice)
    specs = []
    for path in settings.routes:
        route = ROUTES[path]
        bench = None
        if path == settings.benchmark_route:
            bench = BenchmarkSpec(benchmark_generator(path, inputs), runs or route.runs,
                                  concurrency or route.concurrency)
        upload = route.request == "multipart"
        specs.append(HandlerSpec(
            route=path,
            request_parser=None if upload else request_parser(path, settings.limits),
            workload=None if upload else workload.calculator(path, refs),
            benchmark=bench, upload=upload, limits=settings.limits, references=refs,
            model_id=model_id))
    return specs


def env_overrides(env: Mapping[str, str], name: str, value: int) -> int | None:
    """`value` (core's resolved BENCHMARK_RUNS / BENCHMARK_CONCURRENCY) when `name` is set in
    `env`, else None (the route's own benchmark size)."""
    return value if _value(env, name) is not None else None

