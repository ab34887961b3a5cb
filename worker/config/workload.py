"""One workload unit for every route: a request counts as a multiple of one benchmark request.

The SDK estimates a request's wait as the in-flight workload of every route over the benchmarked route's
throughput, so all routes need one unit. Multiples are clamped to [MIN_MULTIPLE, MAX_MULTIPLE]; every function
returns a finite number for any body (a raise makes the SDK fall back or answer 500). See docs/routes.md.
"""

from __future__ import annotations

import io
import math
import wave
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MIN_MULTIPLE = 0.1  # upstream's clamp: a tiny request still costs a scheduling slot
MAX_MULTIPLE = 8.0  # and a huge one cannot fill the queue estimate alone
CHARS_PER_TOKEN = 4  # for token-id inputs to the embeddings route

# Reference requests (what each route's benchmark sends; upstream's sizes).
REF_IMAGE_SIDE = 1024
REF_AUDIO_SECONDS = 30.0  # one Whisper window
REF_SPEECH_CHARS = 500
RERANK_DOCS, RERANK_QUERY_CHARS, RERANK_DOC_CHARS = 16, 60, 250
REF_RERANK_CHARS = RERANK_DOCS * (RERANK_QUERY_CHARS + RERANK_DOC_CHARS)
REF_VIDEO_WIDTH, REF_VIDEO_HEIGHT, REF_VIDEO_FRAMES, REF_VIDEO_FPS = 832, 480, 33, 24
DEFAULT_EMBED_CHARS = 600

# Typical byte rates for compressed audio whose length cannot be read from a header.
AUDIO_BYTES_PER_SECOND = {"wav": 32000, "flac": 12000, "ogg": 8000, "webm": 8000}
DEFAULT_AUDIO_BYTES_PER_SECOND = 16000  # mp3, m4a/mp4


@dataclass(frozen=True)
class References:
    """The sizes of one reference request that depend on settings.

    `max_tokens` is BENCHMARK_MAX_TOKENS: the completion budget of one benchmark request, and also
    the scale of the unit (one benchmark request reports `max_tokens` workload, as upstream's did,
    so the autoscaler's figures keep their size). `embed_chars` is BENCHMARK_EMBED_CHARS.
    """

    max_tokens: int = 500
    embed_chars: int = DEFAULT_EMBED_CHARS


def number(value: Any, default: float) -> float:
    """`value` as a finite non-negative float; `default` for anything else (text, bool, nan, < 0)."""
    if isinstance(value, bool):
        return default
    try:
        result = float(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return result if math.isfinite(result) and result >= 0 else default


def clamp(multiple: float) -> float:
    """A multiple of the reference request, held within [MIN_MULTIPLE, MAX_MULTIPLE]."""
    if not math.isfinite(multiple):
        return MAX_MULTIPLE if multiple > 0 else 1.0
    return min(max(multiple, MIN_MULTIPLE), MAX_MULTIPLE)


def _token_budget(data: Mapping[str, Any]) -> float | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = number(data.get(key), -1.0)
        if value > 0:
            return value
    return None


def generation(data: Mapping[str, Any], refs: References) -> float:
    """Completions and chat: the completion budget (max_tokens x n) against the benchmark's.

    A request without a budget counts as one reference request, not 0: most chat clients send no
    max_tokens, and counting those as free showed a loaded worker as idle.
    """
    budget = _token_budget(data)
    if budget is None:
        return 1.0
    return clamp(budget * max(number(data.get("n"), 1.0), 1.0) / refs.max_tokens)


def chat_batch(data: Mapping[str, Any], refs: References) -> float:
    """A list of conversations: each weighs its budget (or one reference budget without one)."""
    messages = data.get("messages")
    count = len(messages) if isinstance(messages, list) else 1
    per = _token_budget(data) or refs.max_tokens
    return clamp(per * count / refs.max_tokens)


def embeddings(data: Mapping[str, Any], refs: References) -> float:
    """`input`: a string, a list of strings, token ids or lists of token ids; all items summed."""
    value = data.get("input")
    items = value if isinstance(value, list) else [value]
    chars = 0
    for item in items:
        if isinstance(item, str):
            chars += len(item)
        elif isinstance(item, list):
            chars += len(item) * CHARS_PER_TOKEN
        elif isinstance(item, int) and not isinstance(item, bool):
            chars += CHARS_PER_TOKEN
    return clamp(chars / refs.embed_chars)


def _chars(value: Any) -> int:
    """Text by length; anything else (an image, a multimodal part) counts as one reference document."""
    return len(value) if isinstance(value, str) else RERANK_DOC_CHARS


def _pairs(queries: Sequence[Any], documents: Any) -> float:
    docs = documents if isinstance(documents, list) else [documents]
    pairs = [(queries[0], d) for d in docs] if len(queries) == 1 else list(zip(queries, docs, strict=False))
    return clamp(sum(_chars(q) + _chars(d) for q, d in pairs) / REF_RERANK_CHARS)


def rerank(data: Mapping[str, Any], refs: References) -> float:
    """One query read against each document."""
    return _pairs([data.get("query")], data.get("documents"))


def score(data: Mapping[str, Any], refs: References) -> float:
    """vLLM's shapes: queries + documents/items, text_1 + text_2, data_1 + data_2."""
    def first(*keys: str) -> Any:
        return next((data[k] for k in keys if data.get(k) is not None), None)

    queries = first("queries", "text_1", "data_1")
    queries = queries if isinstance(queries, list) and queries else [queries]
    return _pairs(queries, first("documents", "items", "text_2", "data_2"))


def speech_references(data: Mapping[str, Any]) -> list[Any]:
    """The voice-clone references of a speech request: ref_audio (one or a list), ref_audio_2 and
    `references[].audio_path` (vLLM-Omni's alias)."""
    refs = data.get("references")
    listed = refs if isinstance(refs, list) else ([] if refs is None else [refs])
    paths = [r.get("audio_path") if isinstance(r, dict) else r for r in listed]
    first = data.get("ref_audio")
    return [*(first if isinstance(first, list) else [first]), data.get("ref_audio_2"), *paths]


def speech(data: Mapping[str, Any], refs: References) -> float:
    """The text to speak, plus one reference request for each voice-clone reference."""
    text = data.get("input")
    chars = len(text) if isinstance(text, str) else 0
    chars += REF_SPEECH_CHARS * sum(1 for r in speech_references(data) if isinstance(r, str) and r)
    return clamp(chars / REF_SPEECH_CHARS)


def speech_batch(data: Mapping[str, Any], refs: References) -> float:
    """Each item as on /v1/audio/speech; the batch's ref_audio applies to items without one."""
    items = data.get("items")
    chars = 0
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict):
            text = item.get("input")
            chars += len(text) if isinstance(text, str) else 0
            if item.get("ref_audio") or data.get("ref_audio"):
                chars += REF_SPEECH_CHARS
    return clamp(chars / REF_SPEECH_CHARS)


def audio_generate(data: Mapping[str, Any], refs: References) -> float:
    """One reference request: Stable Audio renders its full window whatever length is asked."""
    return 1.0


def image_pixels(data: Mapping[str, Any]) -> float:
    """n x width x height; `size` is "WxH", or "auto"/absent when the engine decides (the reference)."""
    width, sep, height = str(data.get("size") or "").lower().partition("x")
    pixels = float(REF_IMAGE_SIDE * REF_IMAGE_SIDE)
    if sep:
        pixels = number(width, REF_IMAGE_SIDE) * number(height, REF_IMAGE_SIDE)
    return max(number(data.get("n"), 1.0), 1.0) * pixels


def images(data: Mapping[str, Any], refs: References) -> float:
    """Image generations and edits: the pixels asked for against one 1024x1024 image."""
    return clamp(image_pixels(data) / (REF_IMAGE_SIDE * REF_IMAGE_SIDE))


def video(data: Mapping[str, Any], refs: References) -> float:
    """Pixels x frames x outputs against the reference clip; what the model picks is the reference."""
    width, height = data.get("width"), data.get("height")
    w, sep, h = str(data.get("size") or "").lower().partition("x")
    if sep:  # vLLM-Omni lets `size` win over width/height
        width, height = w, h
    pixels = (number(width, REF_VIDEO_WIDTH) * number(height, REF_VIDEO_HEIGHT)
              if width and height else float(REF_VIDEO_WIDTH * REF_VIDEO_HEIGHT))
    frames = float(REF_VIDEO_FRAMES)
    if data.get("num_frames"):
        frames = number(data["num_frames"], REF_VIDEO_FRAMES)
    elif data.get("seconds"):
        frames = number(data["seconds"], 1.0) * number(data.get("fps"), REF_VIDEO_FPS)
    outputs = max(number(data.get("num_outputs_per_prompt"), 1.0), 1.0)
    return clamp(pixels * frames * outputs / (REF_VIDEO_WIDTH * REF_VIDEO_HEIGHT * REF_VIDEO_FRAMES))


def audio_seconds(raw: bytes, filename: str) -> float:
    """An upload's length: read from a PCM WAV (never more than its bytes can hold), else estimated
    from a typical byte rate for its extension."""
    if raw[:4] == b"RIFF":
        try:
            with wave.open(io.BytesIO(raw)) as clip:
                rate, frames = clip.getframerate(), clip.getnframes()
                frame_bytes = clip.getsampwidth() * clip.getnchannels()
            if rate > 0 and frame_bytes > 0:
                # The header may claim more frames than the file holds; count what is there.
                return min(frames, len(raw) // frame_bytes) / rate
        except (wave.Error, EOFError, ValueError):
            pass
    ext = filename.rpartition(".")[2].lower()
    return len(raw) / AUDIO_BYTES_PER_SECOND.get(ext, DEFAULT_AUDIO_BYTES_PER_SECOND)


def transcription(raw: bytes, filename: str) -> float:
    """Transcriptions and translations: the clip's seconds against one 30 s Whisper window."""
    return clamp(audio_seconds(raw, filename) / REF_AUDIO_SECONDS)


RULES: dict[str, Callable[[Mapping[str, Any], References], float]] = {
    "/v1/completions": generation,
    "/v1/chat/completions": generation,
    "/v1/chat/completions/batch": chat_batch,
    "/v1/embeddings": embeddings,
    "/v1/rerank": rerank,
    "/v1/score": score,
    "/v1/audio/speech": speech,
    "/v1/audio/speech/batch": speech_batch,
    "/v1/audio/generate": audio_generate,
    "/v1/images/generations": images,
    "/v1/images/edits": images,
    "/v1/videos/sync": video,
}


def multiple(route: str, data: Any, refs: References) -> float:
    """How many benchmark requests one JSON request to `route` is worth, clamped; 1.0 when the
    body cannot be read (never raises)."""
    rule = RULES.get(route)
    if rule is None or not isinstance(data, Mapping):
        return 1.0
    try:
        return clamp(rule(data, refs))
    except Exception:  # noqa: BLE001 (a workload must never fail a request; see module docstring)
        return 1.0


def calculator(route: str, refs: References) -> Callable[[dict[str, Any]], float]:
    """The SDK `workload_calculator` of a JSON route: its multiple x the unit (refs.max_tokens)."""
    def workload(data: dict[str, Any]) -> float:
        return multiple(route, data, refs) * refs.max_tokens

    workload.__name__ = f"workload_{route.strip('/').replace('/', '_')}"
    return workload
