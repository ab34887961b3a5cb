"""OPENAI_ROUTES, BENCHMARK_ROUTE, the handler specs and the benchmark requests
(config/routes.py), no SDK needed."""

from __future__ import annotations

import base64
import hashlib
import io
import random
import struct
import wave
import zlib

import pytest

import tests.worker.helpers  # noqa: F401 (puts worker/ on sys.path first)
from config import routes, uploads
from config.routes import RouteConfigError

WORDS = ["alpha", "beta", "gamma", "delta"]
ALL = ",".join(routes.ROUTES)


def load(**env: str) -> routes.RouteSettings:
    return routes.load_route_settings(env)


def config_error(**env: str) -> list[str]:
    with pytest.raises(RouteConfigError) as caught:
        load(**env)
    return caught.value.lines


# --------------------------------------------------------------------------- settings


def test_fourteen_routes_as_upstream() -> None:
    assert len(routes.ROUTES) == 14
    multipart = {r.path for r in routes.ROUTE_TABLE if r.request == "multipart"}
    assert multipart == {"/v1/audio/transcriptions", "/v1/audio/translations", "/v1/images/edits",
                         "/v1/videos/sync"} == set(uploads.UPLOAD_FIELDS)


def test_the_default_is_completions_and_chat_benchmarking_completions() -> None:
    settings = load()
    assert settings.routes == ("/v1/completions", "/v1/chat/completions")
    assert settings.benchmark_route == "/v1/completions"
    assert load(OPENAI_ROUTES="  ", BENCHMARK_ROUTE="").routes == settings.routes  # blank is unset


def test_the_benchmarked_route_is_served_by_default() -> None:
    settings = load(BENCHMARK_ROUTE="/v1/embeddings")
    assert settings.routes == ("/v1/completions", "/v1/chat/completions", "/v1/embeddings")


def test_openai_routes_is_comma_separated_in_its_order_without_duplicates() -> None:
    settings = load(OPENAI_ROUTES=" /v1/embeddings/ ,/v1/rerank,,/v1/embeddings", BENCHMARK_ROUTE="/v1/rerank")
    assert settings.routes == ("/v1/embeddings", "/v1/rerank")
    assert load(OPENAI_ROUTES=ALL).routes == tuple(routes.ROUTES)


def test_an_unknown_route_is_one_line_naming_the_variable() -> None:
    lines = config_error(OPENAI_ROUTES="/v1/completions,/v1/embedding")
    assert len(lines) == 1
    assert lines[0].startswith("OPENAI_ROUTES names '/v1/embedding', which is not a route; use any of /v1/completions")


def test_a_benchmark_route_left_out_of_openai_routes_is_refused_naming_both_variables() -> None:
    lines = config_error(OPENAI_ROUTES="/v1/embeddings", BENCHMARK_ROUTE="/v1/audio/speech")
    assert lines == ["BENCHMARK_ROUTE=/v1/audio/speech is not served: OPENAI_ROUTES leaves it out. Add "
                     "/v1/audio/speech to OPENAI_ROUTES, or set BENCHMARK_ROUTE to one of /v1/embeddings"]
    # the default benchmark route counts too: an embeddings-only deployment must move it
    assert "BENCHMARK_ROUTE=/v1/completions is not served" in config_error(OPENAI_ROUTES="/v1/embeddings")[0]


def test_an_unknown_benchmark_route_is_refused() -> None:
    lines = config_error(BENCHMARK_ROUTE="/v1/audio/speach")
    assert lines[0].startswith("BENCHMARK_ROUTE='/v1/audio/speach' is not a route")


def test_openai_routes_naming_nothing_is_refused() -> None:
    assert config_error(OPENAI_ROUTES=" , ,")[0].startswith("OPENAI_ROUTES=', ,' names no route")


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1.5"])
def test_a_bad_number_is_a_warning_and_the_default(value: str) -> None:
    settings = load(BENCHMARK_EMBED_CHARS=value, OPENAI_MAX_UPLOAD_BYTES=value)
    assert settings.embed_chars == 600
    assert settings.limits.file_bytes == uploads.DEFAULT_MAX_UPLOAD_BYTES
    assert len(settings.warnings) == 2 and all("is not a positive integer" in w for w in settings.warnings)


def test_benchmarking_a_speech_batch_is_warned_about() -> None:
    """vLLM-Omni answers a speech batch 200 even when every item failed: the benchmark sees success."""
    settings = load(BENCHMARK_ROUTE="/v1/audio/speech/batch")
    assert len(settings.warnings) == 1 and "benchmark /v1/audio/speech instead" in settings.warnings[0]
    assert load(BENCHMARK_ROUTE="/v1/audio/speech").warnings == ()


def test_upload_limits_and_voice_come_from_the_environment() -> None:
    settings = load(OPENAI_MAX_UPLOAD_BYTES="1000", OPENAI_MAX_REQUEST_UPLOAD_BYTES="5000",
                    BENCHMARK_SPEECH_VOICE=" alloy ", BENCHMARK_EMBED_CHARS="1200")
    assert (settings.limits.file_bytes, settings.limits.request_bytes) == (1000, 5000)
    assert (settings.speech_voice, settings.embed_chars) == ("alloy", 1200)
    big = load(OPENAI_MAX_UPLOAD_BYTES=str(100 * 2**20)).limits
    assert big.request_bytes == 100 * 2**20  # the request budget is never below one file


def test_the_startup_lines_name_the_route_and_the_variable() -> None:
    lines = routes.startup_lines(load(BENCHMARK_ROUTE="/v1/embeddings"))
    assert lines[0] == "bakery-worker: serving: /v1/completions, /v1/chat/completions, /v1/embeddings"
    assert lines[1].startswith("bakery-worker: benchmarking: /v1/embeddings. If this model does not serve it, "
                               "set BENCHMARK_ROUTE")


# --------------------------------------------------------------------------- handler specs


def specs(**env: str) -> dict[str, routes.HandlerSpec]:
    out = routes.handler_specs(load(**env), words=WORDS, model_id="m", max_tokens=500)
    return {s.route: s for s in out}


@pytest.mark.parametrize("route", list(routes.ROUTES))
def test_benchmark_route_moves_the_one_benchmark(route: str) -> None:
    table = specs(OPENAI_ROUTES=ALL, BENCHMARK_ROUTE=route)
    assert list(table) == list(routes.ROUTES)
    assert [r for r, s in table.items() if s.benchmark] == [route]
    size = table[route].benchmark
    assert size is not None and (size.runs, size.concurrency) == (routes.ROUTES[route].runs,
                                                                  routes.ROUTES[route].concurrency)


def test_benchmark_runs_and_concurrency_override_the_routes_own() -> None:
    settings = load(BENCHMARK_ROUTE="/v1/embeddings")
    table = routes.handler_specs(settings, words=WORDS, model_id=None, max_tokens=8, runs=1, concurrency=2)
    bench = next(s.benchmark for s in table if s.benchmark)
    assert (bench.runs, bench.concurrency) == (1, 2)
    assert routes.env_overrides({"BENCHMARK_RUNS": "1"}, "BENCHMARK_RUNS", 1) == 1
    assert routes.env_overrides({"BENCHMARK_RUNS": " "}, "BENCHMARK_RUNS", 3) is None


def test_json_routes_get_a_parser_and_a_calculator_upload_routes_a_payload_class() -> None:
    for route, spec in specs(OPENAI_ROUTES=ALL).items():
        multipart = routes.ROUTES[route].request == "multipart"
        assert spec.upload is multipart
        assert (spec.request_parser is None, spec.workload is None) == (multipart, multipart)


@pytest.mark.parametrize("route", ["/v1/audio/speech", "/v1/embeddings", "/v1/audio/generate", "/v1/chat/completions",
                                   "/v1/completions"])
def test_input_is_a_field_on_speech_and_embeddings_and_an_envelope_only_when_an_object(route: str) -> None:
    parse = routes.request_parser(route, uploads.UploadLimits())
    body = {"model": "t", "input": "Hi", "voice": "a"}
    assert parse(dict(body)) == body
    assert parse({"input": dict(body)}) == body


def test_the_speech_parser_refuses_a_path() -> None:
    parse = routes.request_parser("/v1/audio/speech", uploads.UploadLimits())
    with pytest.raises(uploads.UploadError) as caught:
        parse({"input": "hi", "ref_audio": "/root/voice.wav"})
    assert caught.value.field == "ref_audio"


# --------------------------------------------------------------------------- benchmark requests


def inputs(**kw: object) -> routes.BenchmarkInputs:
    return routes.BenchmarkInputs(**{"words": WORDS, "model_id": "m", "max_tokens": 500, **kw})  # type: ignore[arg-type]


def test_the_completion_benchmark_is_as_before() -> None:
    body = routes.benchmark_generator("/v1/completions", inputs(), random.Random(1))()  # noqa: S311
    assert set(body) == {"prompt", "temperature", "max_tokens", "model"}
    assert len(body["prompt"].split()) == 250 and body["max_tokens"] == 500 and body["model"] == "m"
    assert body["temperature"] == 0.7 and set(body["prompt"].split()) <= set(WORDS)


def test_without_a_model_id_the_field_is_left_out() -> None:
    for route in routes.ROUTES:
        assert "model" not in routes.benchmark_generator(route, inputs(model_id=None))()


@pytest.mark.parametrize(("route", "keys"), [
    ("/v1/chat/completions", {"messages", "max_tokens"}),
    ("/v1/chat/completions/batch", {"messages", "max_tokens"}),
    ("/v1/embeddings", {"input"}),
    ("/v1/rerank", {"query", "documents"}),
    ("/v1/score", {"text_1", "text_2"}),
    ("/v1/audio/speech", {"input"}),
    ("/v1/audio/speech/batch", {"items"}),
    ("/v1/audio/generate", {"input", "audio_length"}),
    ("/v1/audio/transcriptions", {"file", "filename"}),
    ("/v1/audio/translations", {"file", "filename"}),
    ("/v1/images/generations", {"prompt", "size", "n"}),
    ("/v1/images/edits", {"image", "filename", "prompt", "size"}),
    ("/v1/videos/sync", {"prompt", "width", "height", "num_frames"}),
])
def test_each_route_benchmarks_with_its_own_request(route: str, keys: set[str]) -> None:
    body = routes.benchmark_generator(route, inputs())()
    assert keys <= set(body)


def test_the_embeddings_benchmark_fits_a_256_token_encoder() -> None:
    """At 2000 characters upstream's tokenised past bge-small's 512 and the worker never became ready."""
    make = routes.benchmark_generator("/v1/embeddings", inputs(), random.Random(5))  # noqa: S311
    for _ in range(200):
        text = make()["input"]
        assert len(text) == 600 and len(text) / 3.1 < 256 * 0.8


def test_the_speech_voice_is_sent_only_when_set() -> None:
    assert "voice" not in routes.benchmark_generator("/v1/audio/speech", inputs())()
    assert routes.benchmark_generator("/v1/audio/speech", inputs(speech_voice="alloy"))()["voice"] == "alloy"


def _frames(clip: bytes) -> tuple[tuple[int, int, int], bytes]:
    with wave.open(io.BytesIO(clip)) as w:
        return (w.getnchannels(), w.getsampwidth(), w.getframerate()), w.readframes(w.getnframes())


def test_the_bundled_speech_is_small_and_sounds_like_speech() -> None:
    """Real speech has pauses between words; noise (which leaves a decoder idle) has none."""
    raw = routes.SPEECH_FILE.read_bytes()
    assert len(raw) < 100_000
    params, frames = _frames(raw)
    assert params == (1, 2, 8000)
    samples = struct.unpack(f"<{len(frames) // 2}h", frames)
    window = 160  # 20 ms
    energies = [sum(abs(s) for s in samples[i:i + window]) / window for i in range(0, len(samples) - window, window)]
    loud = max(energies)
    quiet = sum(1 for e in energies if e < loud * 0.05) / len(energies)
    assert 4.0 < len(samples) / 8000 < 8.0
    assert 0.05 < quiet < 0.6, quiet  # pauses, but mostly voiced


def test_the_transcription_benchmark_sends_the_speech_tiled_to_30_seconds() -> None:
    body = routes.benchmark_generator("/v1/audio/transcriptions", inputs())()
    params, frames = _frames(base64.b64decode(body["file"]))
    sample_params, sample = _frames(routes.SPEECH_FILE.read_bytes())
    assert params == sample_params
    assert len(frames) == 30 * 8000 * 2
    assert frames[:2 * len(sample)] == sample * 2


def test_benchmark_uploads_differ_per_request() -> None:
    """Engines cache multimodal input by content hash."""
    clips = {hashlib.sha256(routes.speech_clip()).hexdigest() for _ in range(4)}
    assert len(clips) == 4
    rng = random.Random(3)  # noqa: S311
    assert routes.png_image(64, rng) != routes.png_image(64, rng)


def test_the_edit_benchmark_image_is_a_valid_png() -> None:
    png = routes.png_image(100, random.Random(2))  # noqa: S311
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(png):
        (n,) = struct.unpack(">I", png[pos:pos + 4])
        kind, data = png[pos + 4:pos + 8], png[pos + 8:pos + 8 + n]
        assert struct.unpack(">I", png[pos + 8 + n:pos + 12 + n])[0] == zlib.crc32(kind + data)
        chunks[kind] = chunks.get(kind, b"") + data
        pos += 12 + n
    width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (width, height, depth, colour) == (100, 100, 8, 2)
    assert len(zlib.decompress(chunks[b"IDAT"])) == 100 * (1 + 3 * 100)
    assert list(chunks) == [b"IHDR", b"IDAT", b"IEND"]
