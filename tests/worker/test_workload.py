"""One workload unit for every route (config/workload.py): one test per rule, no SDK needed.

The unit is one benchmark request, reported as BENCHMARK_MAX_TOKENS (ONE below), clamped to
[0.1, 8] of it. The SDK divides every route's in-flight work by the benchmarked route's throughput
and answers 429 once that exceeds max_queue_time, so the clamp is what keeps one request from
shutting the worker.
"""

from __future__ import annotations

import io
import math
import wave

import pytest

import tests.worker.helpers  # noqa: F401 (puts worker/ on sys.path first)
from config import routes, uploads, workload
from config.workload import References

REFS = References(max_tokens=500, embed_chars=600)
ONE = 500.0
FLOOR, CEILING = 0.1 * ONE, 8 * ONE
CONVO = [{"role": "user", "content": "hi"}]


def calc(route: str, refs: References = REFS):
    return workload.calculator(route, refs)


def wav(seconds: float, rate: int = 16000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as clip:
        clip.setnchannels(1)
        clip.setsampwidth(2)
        clip.setframerate(rate)
        clip.writeframes(b"\x00\x00" * int(seconds * rate))
    return out.getvalue()


# --------------------------------------------------------------------------- completions and chat


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_a_request_without_max_tokens_counts_one_benchmark_request_not_zero(route: str) -> None:
    """Most chat clients send no max_tokens; core.workload() counted those as 0 (an idle worker)."""
    assert calc(route)({"messages": CONVO}) == ONE
    assert calc(route)({"prompt": "hi"}) == ONE


def test_the_completion_budget_is_measured_against_the_benchmarks() -> None:
    assert calc("/v1/completions")({"prompt": "p", "max_tokens": 500}) == ONE
    assert calc("/v1/chat/completions")({"messages": CONVO, "max_tokens": 250}) == ONE / 2
    # vLLM reads max_completion_tokens before max_tokens.
    assert calc("/v1/chat/completions")({"max_completion_tokens": 1000, "max_tokens": 10}) == 2 * ONE


def test_the_unit_scales_with_benchmark_max_tokens() -> None:
    """With BENCHMARK_MAX_TOKENS=8 a request of 8 tokens is one benchmark request, reported as 8."""
    small = References(max_tokens=8)
    assert calc("/v1/completions", small)({"max_tokens": 8}) == 8
    assert calc("/v1/completions", small)({}) == 8


def test_n_choices_multiply_the_budget() -> None:
    assert calc("/v1/completions")({"max_tokens": 100, "n": 3}) == 300


def test_a_huge_budget_is_clamped_to_eight_requests() -> None:
    assert calc("/v1/chat/completions")({"max_tokens": 1_000_000}) == CEILING


def test_a_tiny_budget_still_costs_a_tenth() -> None:
    assert calc("/v1/completions")({"max_tokens": 1}) == FLOOR


@pytest.mark.parametrize("bad", [True, "many", -5, 0, math.nan, math.inf, None, [500]])
def test_an_unusable_budget_counts_as_none_given(bad: object) -> None:
    assert calc("/v1/chat/completions")({"max_tokens": bad}) == ONE


# --------------------------------------------------------------------------- other routes


def test_a_chat_batch_counts_each_conversation() -> None:
    batch = calc("/v1/chat/completions/batch")
    assert batch({"messages": [CONVO] * 4, "max_tokens": 100}) == 400
    assert batch({"messages": [CONVO] * 2}) == 2 * ONE  # no budget: one reference each


@pytest.mark.parametrize("value", ["x" * 600, ["x" * 300] * 2, list(range(150)), [list(range(75))] * 2])
def test_embedding_inputs_of_every_shape_land_on_one_scale(value: object) -> None:
    assert calc("/v1/embeddings")({"input": value}) == ONE


def test_rerank_counts_each_query_document_pair() -> None:
    q, d = "q" * 60, "d" * 250
    assert calc("/v1/rerank")({"query": q, "documents": [d] * 16}) == ONE
    assert calc("/v1/rerank")({"query": q, "documents": [d] * 32}) == 2 * ONE
    image = {"type": "image_url", "image_url": {"url": "u"}}  # a non-text input is one document
    assert calc("/v1/rerank")({"query": [image], "documents": [d] * 16}) == 16 * 500 / 4960 * ONE


@pytest.mark.parametrize("body", [
    {"queries": "q" * 60, "documents": ["d" * 250] * 16},
    {"queries": "q" * 60, "items": ["d" * 250] * 16},
    {"text_1": "q" * 60, "text_2": ["d" * 250] * 16},
    {"data_1": ["q" * 60] * 16, "data_2": ["d" * 250] * 16},  # two lists: pairwise
])
def test_score_reads_each_of_vllms_shapes(body: dict) -> None:
    assert calc("/v1/score")(body) == ONE


def test_speech_counts_text_and_one_request_per_clone_reference() -> None:
    speech, base = calc("/v1/audio/speech"), {"input": "x" * 500}
    assert speech(base) == ONE
    assert speech({**base, "ref_audio": "https://x/a.wav"}) == 2 * ONE
    assert speech({**base, "ref_audio": ["u1", "u2"], "ref_audio_2": "u3"}) == 4 * ONE
    assert speech({**base, "references": [{"audio_path": "u1"}]}) == 2 * ONE


def test_a_speech_batch_counts_the_batch_reference_for_each_item() -> None:
    batch, item = calc("/v1/audio/speech/batch"), {"input": "x" * 500}
    assert batch({"items": [item] * 2}) == 2 * ONE
    assert batch({"items": [item] * 2, "ref_audio": "u"}) == 4 * ONE


def test_audio_generation_is_one_request_whatever_the_length() -> None:
    assert calc("/v1/audio/generate")({"audio_length": 1}) == ONE
    assert calc("/v1/audio/generate")({"audio_length": 47}) == ONE


@pytest.mark.parametrize("route", ["/v1/images/generations", "/v1/images/edits"])
def test_images_count_pixels_and_n(route: str) -> None:
    images = calc(route)
    assert images({"size": "1024x1024", "n": 2}) == 2 * ONE
    assert images({"size": "512x512", "n": 4}) == ONE
    for size in (None, "auto", "nonsense"):
        assert images({"size": size}) == ONE
    assert images({"size": "64x64"}) == FLOOR
    assert images({"size": "8192x8192", "n": 10}) == CEILING


def test_video_counts_pixels_frames_and_outputs() -> None:
    video = calc("/v1/videos/sync")
    assert video({}) == ONE
    assert video({"width": 832, "height": 480, "num_frames": 66}) == 2 * ONE
    assert video({"size": "832x480", "num_frames": 33, "num_outputs_per_prompt": 2}) == 2 * ONE
    assert video({"size": "1664x480", "width": 64, "height": 64}) == 2 * ONE  # size wins
    assert video({"seconds": "2"}) == pytest.approx(48 / 33 * ONE)  # 24 fps by default


def test_transcription_counts_seconds_of_audio_against_one_whisper_window() -> None:
    assert workload.audio_seconds(wav(7.5, rate=48000), "a.wav") == pytest.approx(7.5)
    assert workload.transcription(wav(30), "a.wav") == 1.0
    assert workload.transcription(wav(1), "a.wav") == 0.1  # the floor
    raw = b"\x1aE\xdf\xa3" + b"\x00" * 80_000  # webm: estimated from its byte rate
    assert workload.audio_seconds(raw, "a.webm") == pytest.approx(80_004 / 8000)
    assert workload.audio_seconds(raw, "a.mp3") == pytest.approx(80_004 / 16000)


def test_a_wav_header_cannot_claim_more_audio_than_the_file_holds() -> None:
    clip = bytearray(wav(1))
    clip[40:44] = (2**31).to_bytes(4, "little")  # data chunk size: ~18 hours at 16 kHz
    assert workload.audio_seconds(bytes(clip), "a.wav") == pytest.approx(1.0, abs=0.01)


# --------------------------------------------------------------------------- the whole table


@pytest.mark.parametrize("route", list(routes.ROUTES))
def test_every_benchmark_request_weighs_exactly_one_reference_request(route: str) -> None:
    """Otherwise the measured throughput would mean something different for each BENCHMARK_ROUTE."""
    inputs = routes.BenchmarkInputs(words=["alpha", "beta", "gamma"], max_tokens=500, embed_chars=600)
    body = routes.benchmark_generator(route, inputs)()
    if routes.ROUTES[route].request == "multipart":
        fields, files = uploads.split_upload(route, body, uploads.UploadLimits())
        weight = uploads.upload_multiple(route, fields, files, REFS) * REFS.max_tokens
    else:
        weight = calc(route)(routes.request_parser(route, uploads.UploadLimits())(body))
    assert weight == pytest.approx(ONE, rel=0.01)


GARBAGE = [{}, {"input": None}, {"size": "9" * 4000 + "x" + "9" * 4000}, {"n": "9" * 5000},
           {"n": -5, "size": "-10x-10"}, {"input": 123}, {"ref_audio": [None, 7, ""]},
           {"references": 5}, {"query": 5, "documents": "x"}, {"documents": [None, {}, [[1]]]},
           {"text_1": [], "text_2": []}, {"queries": ["a"] * 3, "items": ["b"] * 2},
           {"messages": "x", "max_tokens": 5}, {"items": [5, {"input": 3}]},
           {"width": float("inf"), "height": 0}, {"num_frames": float("nan")}, {"seconds": "a"}]


@pytest.mark.parametrize("route", [r for r in routes.ROUTES if r in workload.RULES])
def test_malformed_bodies_are_priced_between_the_clamps_without_raising(route: str) -> None:
    """A calculator that raised would make the SDK fall back to its own constant (or 500)."""
    for body in [*GARBAGE, "not an object", None, []]:
        value = calc(route)(body)  # type: ignore[arg-type]
        assert FLOOR <= value <= CEILING, (route, body)


def test_no_single_request_can_trip_the_sdks_queue_limit() -> None:
    """The SDK's estimate: in-flight workload / benchmark throughput, 429 above max_queue_time
    (600 s). At 10 benchmark requests in 25 s (200 units/s), the worst request of any route waits
    8 x 500 / 200 = 20 s."""
    throughput, max_queue_time = 10 * ONE / 25, 600.0
    worst = {
        "/v1/chat/completions": {"max_tokens": 10**9, "n": 128},
        "/v1/audio/speech": {"input": "x" * 100_000, "ref_audio": ["A" * 10_000] * 10},
        "/v1/embeddings": {"input": ["x" * 10_000] * 1_000},
        "/v1/rerank": {"query": "x" * 10_000, "documents": ["x" * 10_000] * 1_000},
        "/v1/images/generations": {"n": 100_000, "size": "8192x8192"},
        "/v1/chat/completions/batch": {"messages": [CONVO] * 256, "max_tokens": 2048},
        "/v1/videos/sync": {"size": "8192x8192", "num_frames": 10**9, "num_outputs_per_prompt": 10},
    }
    for route, body in worst.items():
        assert calc(route)(body) == CEILING, route
    big = wav(3600, rate=8000)  # an hour of audio
    assert workload.transcription(big, "a.wav") * ONE == CEILING
    assert CEILING / throughput == 20.0 < max_queue_time
