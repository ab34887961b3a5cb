"""The stand-ins' routes beyond completions and chat, in the shapes vLLM (with vLLM-Omni) and SGLang answer.

Answers are deterministic (derived from a hash of the input) and say they come from a stand-in:
texts start with "Stand-in", embeddings and scores are hash-derived numbers, audio is a tone, images
a flat colour, video a minimal MP4 container. Upload routes take multipart form data, as the
engines do; the request record (STANDIN_RECORD, core.record_request) shows what arrived.

vLLM serves every route here (`VLLM_ROUTES`); SGLang serves embeddings, rerank and transcriptions
in its own shapes, and its `/v1/score` is a different API (`SGLANG_ROUTES`); any other route is
SGLang's 404.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import struct
import time
import uuid
import wave
import zlib
from collections.abc import Callable
from typing import Any

from bakery_standin.core import Handler, RequestError, Upload, count_tokens, message_text, reply_tokens

Route = Callable[[Handler, dict[str, Any]], None]
EMBED_DIMS = 16  # the stand-in's "hidden size"
AUDIO_RATE = 16000
MAX_AUDIO_SECONDS = 47.0  # Stable Audio's longest clip
AUDIO_MAGIC = (b"RIFF", b"ID3", b"\xff\xfb", b"\xff\xf3", b"\xff\xf2", b"fLaC", b"OggS", b"\x1aE\xdf\xa3")
IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"RIFF")
REFERENCE_SCHEMES = ("http://", "https://", "data:")


def _form(handler: Route) -> Route:
    handler.takes_form = True  # type: ignore[attr-defined]
    return handler


def _unit(seed: str) -> float:
    """A number in [0, 1) from `seed`."""
    return int.from_bytes(hashlib.sha256(seed.encode("utf-8", "replace")).digest()[:8], "big") / 2**64


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise RequestError(400, f"{name} must be a non-empty string.")
    return value


def _head(h: Handler, prefix: str) -> dict[str, Any]:
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "created": int(time.time()), "model": h.server.cfg.served_name}


def _ready(h: Handler, body: dict[str, Any]) -> None:
    h.require_ready()
    model = body.get("model")
    h.check_model({"model": model} if isinstance(model, str) else {})


# --------------------------------------------------------------------------- embeddings, rerank, score


def embedding(text: str, dims: int = EMBED_DIMS) -> list[float]:
    """A unit vector derived from `text`."""
    raw = b""
    block = hashlib.sha256(text.encode("utf-8", "replace")).digest()
    while len(raw) < dims * 4:
        raw += block
        block = hashlib.sha256(block).digest()
    values = [int.from_bytes(raw[i * 4:i * 4 + 4], "big") / 2**31 - 1.0 for i in range(dims)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def _embed_inputs(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return [" ".join(map(str, value))]
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        return [" ".join(map(str, v)) for v in value]
    raise RequestError(400, "input must be a string, a list of strings, or token ids.")


def embeddings(h: Handler, body: dict[str, Any]) -> None:
    """OpenAI's /v1/embeddings (vLLM and SGLang answer alike)."""
    _ready(h, body)
    texts = _embed_inputs(body.get("input"))
    dims = body.get("dimensions") or EMBED_DIMS
    if not isinstance(dims, int) or not 1 <= dims <= 1024:
        raise RequestError(400, "dimensions must be an integer between 1 and 1024.")
    as_base64 = body.get("encoding_format") == "base64"
    data = []
    for i, text in enumerate(texts):
        vector = embedding(text, dims)
        value: Any = base64.b64encode(struct.pack(f"<{dims}f", *vector)).decode() if as_base64 else vector
        data.append({"index": i, "object": "embedding", "embedding": value})
    tokens = sum(count_tokens(t) for t in texts)
    h.send_json(200, {**_head(h, "embd"), "object": "list", "data": data,
                      "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}})


def _doc_text(doc: Any) -> str:
    if isinstance(doc, str):
        return doc
    if isinstance(doc, dict):
        return str(doc.get("text", json.dumps(doc, sort_keys=True)))
    return json.dumps(doc, sort_keys=True)


def rerank(h: Handler, body: dict[str, Any]) -> None:
    """vLLM's /v1/rerank (Jina/Cohere shape): results sorted by relevance, top_n kept."""
    _ready(h, body)
    query = body.get("query")
    documents = body.get("documents")
    if query is None or not isinstance(documents, list) or not documents:
        raise RequestError(400, "query and a non-empty list of documents are required.")
    results = [{"index": i, "document": {"text": _doc_text(d)},
                "relevance_score": _unit(f"{_doc_text(query)}\x00{_doc_text(d)}")} for i, d in enumerate(documents)]
    results.sort(key=lambda r: -r["relevance_score"])
    top = body.get("top_n")
    if isinstance(top, int) and top > 0:
        results = results[:top]
    tokens = count_tokens(_doc_text(query)) * len(documents) + sum(count_tokens(_doc_text(d)) for d in documents)
    h.send_json(200, {**_head(h, "rerank"), "usage": {"total_tokens": tokens}, "results": results})


def sglang_rerank(h: Handler, body: dict[str, Any]) -> None:
    """SGLang's /v1/rerank: a bare list of {score, document, index, meta_info}, best first."""
    _ready(h, body)
    query, documents = body.get("query"), body.get("documents")
    if not isinstance(query, str) or not isinstance(documents, list) or not documents:
        raise RequestError(400, "query and a non-empty list of documents are required.")
    out = [{"score": _unit(f"{query}\x00{_doc_text(d)}"), "document": _doc_text(d), "index": i,
            "meta_info": {"id": uuid.uuid4().hex}} for i, d in enumerate(documents)]
    out.sort(key=lambda r: -r["score"])
    h.send_json(200, out)


def _score_pairs(body: dict[str, Any]) -> list[tuple[str, str]]:
    for left, rights in (("queries", ("documents", "items")), ("text_1", ("text_2",)), ("data_1", ("data_2",))):
        if body.get(left) is None:
            continue
        right = next((body[r] for r in rights if body.get(r) is not None), None)
        if right is None:
            break
        queries = body[left] if isinstance(body[left], list) else [body[left]]
        docs = right if isinstance(right, list) else [right]
        if not queries or not docs:
            break
        if len(queries) == 1:
            return [(_doc_text(queries[0]), _doc_text(d)) for d in docs]
        if len(queries) != len(docs):
            raise RequestError(400, "the two lists of a score request must be of equal length.")
        return [(_doc_text(q), _doc_text(d)) for q, d in zip(queries, docs, strict=True)]
    raise RequestError(400, "a score request takes queries with documents or items, text_1 with text_2, "
                            "or data_1 with data_2.")


def score(h: Handler, body: dict[str, Any]) -> None:
    """vLLM's /v1/score: one score per (query, document) pair."""
    _ready(h, body)
    pairs = _score_pairs(body)
    data = [{"index": i, "object": "score", "score": _unit(f"{q}\x00{d}")} for i, (q, d) in enumerate(pairs)]
    tokens = sum(count_tokens(q) + count_tokens(d) for q, d in pairs)
    h.send_json(200, {**_head(h, "score"), "object": "list", "data": data,
                      "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}})


def sglang_score(h: Handler, body: dict[str, Any]) -> None:
    """SGLang's /v1/score: label-token probabilities of `items` after `query` (not vLLM's API)."""
    _ready(h, body)
    query, items, labels = body.get("query"), body.get("items"), body.get("label_token_ids")
    if query is None or items is None or not isinstance(labels, list) or not labels:
        raise RequestError(400, "query, items and label_token_ids are required.")
    listed = items if isinstance(items, list) else [items]
    scores = []
    for item in listed:
        raw = [_unit(f"{query}\x00{item}\x00{label}") for label in labels]
        total = sum(raw) or 1.0
        scores.append([r / total for r in raw] if body.get("apply_softmax") else raw)
    h.send_json(200, {"scores": scores, "model": h.server.cfg.served_name, "object": "scoring",
                      "usage": {"prompt_tokens": len(listed), "total_tokens": len(listed), "completion_tokens": 0}})


# --------------------------------------------------------------------------- chat batch


def chat_batch(h: Handler, body: dict[str, Any]) -> None:
    """vLLM's /v1/chat/completions/batch: one choice per conversation, indexed 0..N-1 (no streaming)."""
    _ready(h, body)
    conversations = body.get("messages")
    if not isinstance(conversations, list) or not conversations or not all(
            isinstance(c, list) and c for c in conversations):
        raise RequestError(400, "messages must be a non-empty list of conversations.")
    if body.get("stream"):
        raise RequestError(400, "Streaming is not supported for batch chat completions.")
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    full = h.server.opts.reply_tokens
    count = min(full, limit) if isinstance(limit, int) and limit > 0 else full
    choices, prompt = [], 0
    for i, messages in enumerate(conversations):
        text = message_text(messages)
        prompt += count_tokens(text)
        choices.append({"index": i, "message": {"role": "assistant", "content": "".join(reply_tokens(text, count))},
                        "logprobs": None, "finish_reason": "length" if count < full else "stop"})
    done = count * len(conversations)
    h.send_json(200, {**_head(h, "chatcmpl"), "object": "chat.completion", "choices": choices,
                      "usage": {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}})


# --------------------------------------------------------------------------- audio


def tone(seconds: float, seed: str, rate: int = AUDIO_RATE) -> bytes:
    """A 16-bit mono PCM sine tone, its pitch derived from `seed`."""
    pitch = 220 + 440 * _unit(seed)
    frames = int(max(seconds, 0.05) * rate)
    return b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * pitch * n / rate))) for n in range(frames))


def wav_bytes(pcm: bytes, rate: int = AUDIO_RATE) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as clip:
        clip.setnchannels(1)
        clip.setsampwidth(2)
        clip.setframerate(rate)
        clip.writeframes(pcm)
    return out.getvalue()


def _check_reference(value: Any, name: str) -> None:
    """vLLM-Omni fetches http(s) and decodes data: URIs; a local path needs --allowed-local-media-path."""
    if value is None:
        return
    for item in value if isinstance(value, list) else [value]:
        if not isinstance(item, str) or not item.lower().startswith(REFERENCE_SCHEMES):
            raise RequestError(400, f"{name}: loading local files requires --allowed-local-media-path.")


def _speech_audio(h: Handler, item: dict[str, Any], defaults: dict[str, Any]) -> tuple[bytes, str]:
    text = _text(item.get("input"), "input")
    fmt = item.get("response_format") or defaults.get("response_format") or "wav"
    if fmt not in ("wav", "pcm"):
        raise RequestError(400, f"response_format {fmt!r}: the stand-in encodes wav and pcm only.")
    pcm = tone(min(0.05 * len(text), 5.0), f"{text}\x00{item.get('voice') or defaults.get('voice')}")
    return (wav_bytes(pcm), "audio/wav") if fmt == "wav" else (pcm, "audio/pcm")


def speech(h: Handler, body: dict[str, Any]) -> None:
    """vLLM-Omni's /v1/audio/speech: the audio bytes (wav by default)."""
    _ready(h, body)
    _check_reference(body.get("ref_audio"), "ref_audio")
    _check_reference(body.get("ref_audio_2"), "ref_audio_2")
    data, content_type = _speech_audio(h, body, {})
    h.send_bytes(200, content_type, data)


def speech_batch(h: Handler, body: dict[str, Any]) -> None:
    """vLLM-Omni's /v1/audio/speech/batch: each item's audio base64'd; a failed item is reported, not fatal."""
    _ready(h, body)
    items = body.get("items")
    if not isinstance(items, list) or not 1 <= len(items) <= 32 or not all(isinstance(i, dict) for i in items):
        raise RequestError(400, "items must be a list of 1 to 32 objects.")
    _check_reference(body.get("ref_audio"), "ref_audio")
    results = []
    for i, item in enumerate(items):
        try:
            _check_reference(item.get("ref_audio"), "ref_audio")
            data, media = _speech_audio(h, item, body)
        except RequestError as exc:
            results.append({"index": i, "status": "error", "error": str(exc)})
            continue
        results.append({"index": i, "status": "success", "audio_data": base64.b64encode(data).decode(),
                        "media_type": media})
    ok = sum(1 for r in results if r["status"] == "success")
    h.send_json(200, {"id": f"speech-batch-{uuid.uuid4().hex}", "results": results, "total": len(results),
                      "succeeded": ok, "failed": len(results) - ok})


def audio_generate(h: Handler, body: dict[str, Any]) -> None:
    """vLLM-Omni's /v1/audio/generate (Stable Audio): `audio_length` seconds of wav."""
    _ready(h, body)
    prompt = _text(body.get("input"), "input")
    length = body.get("audio_length", 10.0)
    if isinstance(length, bool) or not isinstance(length, (int, float)) or not 0 < length <= MAX_AUDIO_SECONDS:
        raise RequestError(400, f"audio_length must be a number of seconds in (0, {MAX_AUDIO_SECONDS:g}].")
    h.send_bytes(200, "audio/wav", wav_bytes(tone(length, prompt, 8000), 8000))


def _audio_seconds(data: bytes) -> float:
    if data[:4] == b"RIFF":
        try:
            with wave.open(io.BytesIO(data)) as clip:
                return clip.getnframes() / clip.getframerate()
        except (wave.Error, EOFError, ZeroDivisionError):
            raise RequestError(400, "Invalid or unsupported audio file.") from None
    return len(data) / 16000


def _upload(form: dict[str, Any], name: str) -> Upload:
    value = form.get(name)
    if isinstance(value, list):
        value = value[0]
    if not isinstance(value, Upload):
        raise RequestError(400, f"`{name}` must be an uploaded file.")
    return value


def _transcribe(task: str) -> Route:
    def route(h: Handler, form: dict[str, Any]) -> None:
        _ready(h, form)
        upload = _upload(form, "file")
        if not upload.data.startswith(AUDIO_MAGIC) and upload.data[4:8] != b"ftyp":
            raise RequestError(400, "Invalid or unsupported audio file.")
        seconds = _audio_seconds(upload.data)
        words = reply_tokens(hashlib.sha256(upload.data).hexdigest(), h.server.opts.reply_tokens)
        text = "Stand-in transcript:" + "".join(words[4:])
        fmt = form.get("response_format") or "json"
        if str(form.get("stream", "")).lower() == "true":
            _stream_transcript(h, task, words[4:])
            return
        if fmt == "text":
            h.send_bytes(200, "text/plain; charset=utf-8", text.encode())
        elif fmt == "json":
            h.send_json(200, {"text": text, "usage": {"type": "duration", "seconds": math.ceil(seconds)}})
        elif fmt == "verbose_json":
            h.send_json(200, {"task": task, "language": form.get("language") or "en", "duration": seconds,
                              "text": text, "segments": [{"id": 0, "start": 0.0, "end": seconds, "text": text}]})
        else:
            raise RequestError(400, "Currently only support response_format `text`, `json` or `verbose_json`")

    return _form(route)


def _stream_transcript(h: Handler, task: str, words: list[str]) -> None:
    h.send_head(200, "text/event-stream; charset=utf-8", None)
    head = {**_head(h, "trsc"), "object": f"{task}.chunk"}
    for word in ["Stand-in transcript:", *words]:
        h.sse({**head, "choices": [{"delta": {"content": word}, "finish_reason": None}]})
    h.sse({**head, "choices": [{"delta": {}, "finish_reason": "stop"}]})
    h.sse("[DONE]")
    h.chunk(b"")


# --------------------------------------------------------------------------- images and video


def png_bytes(width: int, height: int, seed: str) -> bytes:
    """A flat-colour RGB PNG (compresses to almost nothing at any size)."""
    colour = hashlib.sha256(seed.encode("utf-8", "replace")).digest()[:3]
    raw = (b"\x00" + colour * width) * height

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b""))


def _size(value: Any) -> tuple[int, int]:
    if value in (None, "", "auto"):
        return 1024, 1024
    width, sep, height = str(value).lower().partition("x")
    if not sep or not width.isdigit() or not height.isdigit() or not (
            16 <= int(width) <= 4096 and 16 <= int(height) <= 4096):
        raise RequestError(400, f"size must be WIDTHxHEIGHT (16 to 4096) or auto, got {value!r}.")
    return int(width), int(height)


def _images(h: Handler, body: dict[str, Any], seed: str) -> None:
    n = int(body.get("n") or 1) if str(body.get("n") or 1).isdigit() else 0
    if not 1 <= n <= 10:
        raise RequestError(400, "n must be between 1 and 10.")
    if (body.get("response_format") or "b64_json") != "b64_json":
        raise RequestError(400, "response_format: only b64_json is supported.")
    width, height = _size(body.get("size"))
    data = [{"b64_json": base64.b64encode(png_bytes(width, height, f"{seed}\x00{i}")).decode()} for i in range(n)]
    h.send_json(200, {"created": int(time.time()), "data": data})


def images_generations(h: Handler, body: dict[str, Any]) -> None:
    """vLLM-Omni's /v1/images/generations: {"created", "data": [{"b64_json"}]}."""
    _ready(h, body)
    _images(h, body, _text(body.get("prompt"), "prompt"))


@_form
def images_edits(h: Handler, form: dict[str, Any]) -> None:
    """vLLM-Omni's /v1/images/edits: image part(s) (or `url`), an optional mask part, a prompt."""
    _ready(h, form)
    prompt = _text(form.get("prompt"), "prompt")
    images = form.get("image")
    listed = images if isinstance(images, list) else ([] if images is None else [images])
    if not listed and not form.get("url") and not form.get("url[]"):
        raise RequestError(400, "an image part or a url is required.")
    for item in listed:
        if not isinstance(item, Upload) or not item.data.startswith(IMAGE_MAGIC):
            raise RequestError(400, "image must be an uploaded PNG, JPEG or WebP file.")
    for key in ("url", "url[]"):
        _check_reference(form.get(key), key)
    seed = prompt + "".join(hashlib.sha256(i.data).hexdigest() for i in listed)
    _images(h, form, seed)


def mp4_bytes(seed: str) -> bytes:
    """A minimal ISO-BMFF (MP4) container: an ftyp box and an mdat of hash-derived bytes."""
    ftyp = b"isom" + struct.pack(">I", 512) + b"isomiso2avc1mp41"
    payload = hashlib.sha256(seed.encode("utf-8", "replace")).digest() * 8
    return (struct.pack(">I", 8 + len(ftyp)) + b"ftyp" + ftyp + struct.pack(">I", 8 + len(payload)) + b"mdat"
            + payload)


@_form
def videos_sync(h: Handler, form: dict[str, Any]) -> None:
    """vLLM-Omni's /v1/videos/sync: the finished video's bytes (video/mp4)."""
    _ready(h, form)
    prompt = _text(form.get("prompt"), "prompt")
    for name, key in (("image_reference", "image_url"), ("video_reference", "video_url"),
                      ("audio_reference", "audio_url")):
        raw = form.get(name)
        if raw is None:
            continue
        try:
            refs = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            raise RequestError(400, f"{name} must be a JSON object or list.") from None
        for ref in refs if isinstance(refs, list) else [refs]:
            if isinstance(ref, dict) and ref.get(key) is not None:
                _check_reference(ref[key], f"{name}.{key}")
    h.send_bytes(200, "video/mp4", mp4_bytes(prompt))


VLLM_ROUTES: dict[tuple[str, str], Route] = {
    ("POST", "/v1/chat/completions/batch"): chat_batch,
    ("POST", "/v1/embeddings"): embeddings,
    ("POST", "/v1/rerank"): rerank,
    ("POST", "/v1/score"): score,
    ("POST", "/v1/audio/speech"): speech,
    ("POST", "/v1/audio/speech/batch"): speech_batch,
    ("POST", "/v1/audio/generate"): audio_generate,
    ("POST", "/v1/audio/transcriptions"): _transcribe("transcribe"),
    ("POST", "/v1/audio/translations"): _transcribe("translate"),
    ("POST", "/v1/images/generations"): images_generations,
    ("POST", "/v1/images/edits"): images_edits,
    ("POST", "/v1/videos/sync"): videos_sync,
}
SGLANG_ROUTES: dict[tuple[str, str], Route] = {
    ("POST", "/v1/embeddings"): embeddings,
    ("POST", "/v1/rerank"): sglang_rerank,
    ("POST", "/v1/score"): sglang_score,
    ("POST", "/v1/audio/transcriptions"): _transcribe("transcribe"),
}
