"""Every route through the real SDK (vastai 1.9.1, the lean worker venv) and real processes.

The worker runs as an image runs it: worker/start_server.sh, the engine's workers/<engine>/worker.py,
core.run(). The engine is the project's stand-in (bases/standin) with STANDIN_RECORD, so each test
sees what the engine received: a base64 upload must arrive as the multipart part it should be, and a
refused request must not arrive at all.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import shlex
import wave
from pathlib import Path
from typing import Any

import pytest

from tests.worker.helpers import (
    REPO,
    SDK_READY,
    WORKER_DIR,
    Harness,
    Proc,
    ReportServer,
    SigningKey,
    make_signing_key,
    post_enveloped,
)

ALL_ROUTES = ",".join([
    "/v1/completions", "/v1/chat/completions", "/v1/chat/completions/batch", "/v1/embeddings", "/v1/rerank",
    "/v1/score", "/v1/audio/speech", "/v1/audio/speech/batch", "/v1/audio/generate",
    "/v1/audio/transcriptions", "/v1/audio/translations", "/v1/images/generations", "/v1/images/edits",
    "/v1/videos/sync"])
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\r\n" * 16
# The local llama-cpp base's llama-server (a wrapper over xllamacpp with llama-server's flags) and the
# LLAMA_ARGS an image launch needs for /v1/embeddings: a causal LM's own pooling is none, which
# llama.cpp refuses for OpenAI embeddings (400), so mean pooling is asked for.
LLAMA_SERVER = REPO / "bases" / "llama-cpp" / "llama-server"
EMBEDDING_LLAMA_ARGS = "--embedding --pooling mean"
UPLOAD_LIMIT = 600_000  # above the 480 KB benchmark clip, below the oversized upload below
MIB = 1024 * 1024
BODY_FOR_UPLOADS = 96 * MIB  # 3/2 of OPENAI_MAX_REQUEST_UPLOAD_BYTES (64 MiB): base64 and the envelope


def wav_clip(seconds: float, rate: int = 8000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as clip:
        clip.setnchannels(1)
        clip.setsampwidth(2)
        clip.setframerate(rate)
        clip.writeframes(b"\x10\x00\r\n" * int(seconds * rate / 2))
    return out.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def vllm_worker(harness: Harness) -> tuple[int, Path, Proc]:
    """A worker serving all 14 routes, benchmarking transcriptions, on a recording vLLM stand-in."""
    record = harness.tmp / "engine.jsonl"
    served = harness.worker("vllm", harness.standin("vllm", STANDIN_RECORD=str(record)), VLLM_MODEL="standin-model",
                            OPENAI_ROUTES=ALL_ROUTES, BENCHMARK_ROUTE="/v1/audio/transcriptions",
                            OPENAI_MAX_UPLOAD_BYTES=str(UPLOAD_LIMIT))
    served.worker.wait_for(SDK_READY, timeout=90)
    return served.port, record, served.worker


@pytest.mark.slow
def test_an_upload_route_benchmarks_with_real_speech_and_every_route_answers(
        vllm_worker: tuple[int, Path, Proc]) -> None:
    port, record, worker = vllm_worker
    out = worker.text
    assert "bakery-worker: serving: /v1/completions, /v1/chat/completions, /v1/chat/completions/batch" in out
    assert "bakery-worker: benchmarking: /v1/audio/transcriptions. If this model does not serve it" in out
    # Upload routes served and BAKERY_MAX_BODY_BYTES unset: the body limit carries the upload limit.
    assert (f"bakery-worker: BAKERY_MAX_BODY_BYTES={BODY_FOR_UPLOADS} (follows "
            f"OPENAI_MAX_REQUEST_UPLOAD_BYTES={64 * MIB}") in out
    assert f" max_body={BODY_FOR_UPLOADS}B " in out
    bench = records(record)
    assert len(bench) == 2  # the warm-up, then BENCHMARK_RUNS=1 x BENCHMARK_CONCURRENCY=1
    for entry in bench:
        assert entry["path"] == "/v1/audio/transcriptions" and entry["form"] == {"model": "standin-model"}
        (part,) = entry["files"]
        assert (part["field"], part["filename"], part["content_type"]) == ("file", "benchmark.wav", "audio/wav")
        assert part["size"] == 44 + 30 * 8000 * 2  # the bundled speech tiled to one 30 s window
    assert bench[0]["files"][0]["sha256"] != bench[1]["files"][0]["sha256"]  # a fresh tail each time

    def ok(route: str, payload: dict[str, Any]) -> tuple[bytes, str]:
        status, body, ctype = post_enveloped(port, route, payload)
        assert status == 200, (route, body[:300])
        return body, ctype

    body, _ = ok("/v1/completions", {"prompt": "hi", "max_tokens": 4})
    assert json.loads(body)["choices"][0]["text"].startswith("Stand-in answer:")
    body, ctype = ok("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True})
    assert ctype.startswith("text/event-stream") and body.rstrip().endswith(b"data: [DONE]")
    body, _ = ok("/v1/chat/completions/batch", {"messages": [[{"role": "user", "content": "a"}]] * 3})
    assert [c["index"] for c in json.loads(body)["choices"]] == [0, 1, 2]
    assert len(json.loads(ok("/v1/embeddings", {"input": ["a", "b"]})[0])["data"]) == 2
    assert len(json.loads(ok("/v1/rerank", {"query": "q", "documents": ["a", "b"]})[0])["results"]) == 2
    assert len(json.loads(ok("/v1/score", {"text_1": "q", "text_2": ["a", "b"]})[0])["data"]) == 2
    body, ctype = ok("/v1/audio/speech", {"input": "hello", "ref_audio": "https://8.8.8.8/v.wav"})
    assert ctype == "audio/wav" and body[:4] == b"RIFF"
    body, _ = ok("/v1/audio/speech/batch", {"items": [{"input": "a"}, {"input": "b"}]})
    assert json.loads(body)["succeeded"] == 2
    assert ok("/v1/audio/generate", {"input": "rain", "audio_length": 1})[0][:4] == b"RIFF"
    body, _ = ok("/v1/images/generations", {"prompt": "cat", "size": "32x32"})
    assert base64.b64decode(json.loads(body)["data"][0]["b64_json"])[:4] == b"\x89PNG"

    clip = wav_clip(2.0)
    before = len(records(record))
    body, _ = ok("/v1/audio/transcriptions", {"file": b64(clip), "filename": "../../etc/clip.wav", "language": "en"})
    assert json.loads(body)["text"].startswith("Stand-in transcript:")
    body, ctype = ok("/v1/audio/translations", {"input": {"file": f"data:audio/wav;base64,{b64(clip)}",
                                                          "response_format": "text"}})
    assert ctype.startswith("text/plain") and body.startswith(b"Stand-in transcript:")
    body, ctype = ok("/v1/audio/transcriptions", {"file": b64(clip), "stream": True})
    assert ctype.startswith("text/event-stream") and b"transcribe.chunk" in body
    ok("/v1/images/edits", {"image": [b64(PNG), b64(PNG)], "filename": ["a.png", "b.jpg"], "mask": b64(PNG),
                            "mask_filename": "m.webp", "prompt": "hat", "size": "32x32"})
    body, ctype = ok("/v1/videos/sync", {"prompt": "cat", "num_frames": 9, "input_reference": b64(PNG),
                                         "input_reference_filename": "first.png",
                                         "image_reference": [{"image_url": "https://8.8.8.8/a.png"}]})
    assert ctype == "video/mp4" and body[4:8] == b"ftyp"

    sent = records(record)[before:]
    digest = hashlib.sha256(clip).hexdigest()
    assert sent[0]["files"] == [{"field": "file", "filename": "clip.wav", "content_type": "audio/wav",
                                 "size": len(clip), "sha256": digest}]
    assert sent[0]["form"] == {"language": "en", "model": "standin-model"}
    assert sent[1]["path"] == "/v1/audio/translations" and sent[1]["files"][0]["sha256"] == digest
    assert sent[1]["form"]["response_format"] == "text"
    assert sent[2]["form"]["stream"] == "true"
    assert [(f["field"], f["filename"], f["content_type"]) for f in sent[3]["files"]] == [
        ("image", "a.png", "image/png"), ("image", "b.jpg", "image/jpeg"), ("mask", "m.webp", "image/webp")]
    assert all(f["sha256"] == hashlib.sha256(PNG).hexdigest() for f in sent[3]["files"])
    assert sent[3]["form"] == {"prompt": "hat", "size": "32x32", "model": "standin-model"}
    assert sent[4]["files"] == [{"field": "input_reference", "filename": "first.png", "content_type": "image/png",
                                 "size": len(PNG), "sha256": hashlib.sha256(PNG).hexdigest()}]
    assert json.loads(sent[4]["form"]["image_reference"]) == [{"image_url": "https://8.8.8.8/a.png"}]


@pytest.mark.slow
def test_every_refusal_is_a_422_naming_the_field_and_never_reaches_the_engine(
        vllm_worker: tuple[int, Path, Proc]) -> None:
    port, record, _ = vllm_worker
    before = len(records(record))
    cases = [
        ("/v1/audio/transcriptions", {"file": b64(b"\0" * (UPLOAD_LIMIT + 1))}, "file", "larger than 600000"),
        ("/v1/audio/transcriptions", {"file": "!!not base64!!"}, "file", "not valid base64"),
        ("/v1/audio/transcriptions", {"file": b64(wav_clip(0.1)), "filename": "clip.exe"}, "filename",
         "unsupported file type"),
        ("/v1/audio/transcriptions", {"language": "en"}, "file", "field missing"),
        ("/v1/images/edits", {"url": "/etc/passwd", "prompt": "p"}, "url", "never a path"),
        ("/v1/images/edits", {"image": b64(PNG), "mask": b64(PNG), "mask_filename": "m.wav"}, "mask_filename",
         "unsupported file type"),
        ("/v1/audio/speech", {"input": "hi", "ref_audio": "file:///root/voice.wav"}, "ref_audio", "never a path"),
        ("/v1/audio/speech/batch", {"items": [{"input": "a", "ref_audio": "/root/v.wav"}]}, "ref_audio",
         "never a path"),
        ("/v1/videos/sync", {"prompt": "p", "video_reference": {"video_url": "../clip.mp4"}},
         "video_reference.video_url", "never a path"),
    ]
    # A 20 MiB file is a 26.7 MiB body, over the 16 MiB a text-only worker allows: it reaches the
    # upload check (422 naming the per-file variable), not the body limit (413).
    cases.append(("/v1/audio/transcriptions", {"file": b64(b"\0" * 20 * MIB)}, "file",
                  "larger than 600000 bytes (the limit is OPENAI_MAX_UPLOAD_BYTES)"))
    for route, payload, field, says in cases:
        status, body, _ = post_enveloped(port, route, payload)
        assert status == 422, (route, field, body[:300])
        errors = json.loads(body)["payload"]
        assert list(errors) == [field] and says in errors[field], (route, errors)
    assert len(records(record)) == before  # none of them reached the engine


@pytest.mark.slow
def test_workloads_reach_the_autoscaler_in_benchmark_units(vllm_worker: tuple[int, Path, Proc],
                                                           report_server: ReportServer) -> None:
    """BENCHMARK_MAX_TOKENS=8 here, so one benchmark request is 8 units: a chat without max_tokens
    counts 8 (the worker counted 0 before the route table), a huge budget 8x8, an upload of two 30 s
    windows 2x8."""
    port, _, _ = vllm_worker
    cases = [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, 8.0),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 4000}, 64.0),  # 500x, clamped to 8x
        ("/v1/completions", {"prompt": "hi", "max_tokens": 4}, 4.0),
        ("/v1/audio/transcriptions", {"file": b64(wav_clip(60.0, rate=4000))}, 16.0),
        ("/v1/embeddings", {"input": "x" * 60}, 0.8),
    ]
    for route, payload, expected in cases:
        with report_server._lock:
            report_server.reports.clear()
        status, body, _ = post_enveloped(port, route, payload)
        assert status == 200, body[:300]
        report_server.wait_status(lambda s, want=expected: s.get("cur_perf") == pytest.approx(want), timeout=15)


@pytest.mark.slow
def test_sglang_benchmarks_embeddings_and_answers_404_for_what_it_lacks(harness: Harness) -> None:
    served = harness.worker("sglang", harness.standin("sglang"), OPENAI_ROUTES="/v1/embeddings,/v1/audio/speech",
                            BENCHMARK_ROUTE="/v1/embeddings")
    served.worker.wait_for(SDK_READY, timeout=90)
    port = served.port
    status, body, _ = post_enveloped(port, "/v1/embeddings", {"input": "x"})
    assert status == 200 and len(json.loads(body)["data"][0]["embedding"]) == 16
    assert post_enveloped(port, "/v1/audio/speech", {"input": "x"})[0] == 404  # the engine's own answer
    assert post_enveloped(port, "/v1/completions", {"prompt": "x"})[0] == 404  # not served by the worker


@pytest.mark.slow
def test_a_benchmark_route_left_out_stops_the_worker_with_one_line(harness: Harness) -> None:
    worker = harness.worker("vllm", OPENAI_ROUTES="/v1/embeddings").worker
    assert worker.wait_exit() == 2
    assert ("bakery-worker: error: BENCHMARK_ROUTE=/v1/completions is not served: OPENAI_ROUTES leaves it out. "
            "Add /v1/completions to OPENAI_ROUTES") in worker.text
    assert "Traceback" not in worker.text


@pytest.mark.slow
def test_real_llama_cpp_becomes_ready_on_embeddings_and_serves_them_signed(
        harness: Harness, worker_python: Path, llama_python: Path, smollm2: Path) -> None:
    """The real llama.cpp started as the llama image starts it (the local base's /app/llama-server,
    images/llama.yaml's command, then LLAMA_ARGS split), benchmarked on /v1/embeddings, secured:
    signed requests are served, an unsigned one is 401, and the autoscaler hears the worker is loaded."""
    key: SigningKey = make_signing_key(worker_python)
    reports = harness.report_server(key.pem)  # serves this test's own key: the requests are signed with it
    slot = harness.slot("llama")
    command = [str(llama_python), str(LLAMA_SERVER), "-m", str(smollm2), "--host", "127.0.0.1",
               "--port", str(slot.port), "-t", "1", *shlex.split(EMBEDDING_LLAMA_ARGS)]
    served = harness.worker("llama", harness.engine(command, slot), reports, UNSECURED=None,
                            LLAMA_MODEL="smollm2", OPENAI_ROUTES="/v1/embeddings,/v1/chat/completions",
                            BENCHMARK_ROUTE="/v1/embeddings")
    worker, port = served.worker, served.port
    worker.wait_for(SDK_READY, timeout=180)
    assert "bakery-worker: serving: /v1/embeddings, /v1/chat/completions" in worker.text
    assert "bakery-worker: benchmarking: /v1/embeddings." in worker.text
    status_report = reports.wait_status(lambda s: s.get("loadtime", 0) > 0 and s.get("max_perf", 0) > 0,
                                        timeout=60)
    assert status_report["error_msg"] == ""
    own = f"http://127.0.0.1:{port}"
    signed = {"signature": key.sign(own), "url": own}
    status, body, _ = post_enveloped(port, "/v1/embeddings", {"input": ["hello world", "goodbye"]}, auth=signed)
    assert status == 200, body[:300]
    data = json.loads(body)["data"]
    assert [d["index"] for d in data] == [0, 1]
    assert len(data[0]["embedding"]) == 576 and data[0]["embedding"] != data[1]["embedding"]  # SmolLM2's width
    status, body, _ = post_enveloped(port, "/v1/chat/completions", auth=signed,
                                     payload={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"]
    assert post_enveloped(port, "/v1/embeddings", {"input": "x"}, auth={"url": own})[0] == 401  # unsigned


@pytest.mark.slow
def test_the_demo_client_calls_every_route(vllm_worker: tuple[int, Path, Proc], tmp_path: Path) -> None:
    """client.py (host python, stdlib): streaming chat, interactive chat, tools, one call per route."""
    import subprocess
    import sys

    port, record, _ = vllm_worker
    client = WORKER_DIR / "workers" / "openai" / "client.py"
    clip, picture, out = tmp_path / "clip.wav", tmp_path / "photo.png", tmp_path / "media"
    clip.write_bytes(wav_clip(1.0))
    picture.write_bytes(PNG)

    def run(*args: str, stdin: str = "") -> str:
        result = subprocess.run([sys.executable, str(client), f"http://127.0.0.1:{port}", "--out", str(out), *args],
                                input=stdin, capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, (args, result.stderr)
        return result.stdout

    assert run("--chat-stream").startswith("Stand-in answer:")
    session = run("--interactive", stdin="hello\nclear\nagain\nquit\n")
    assert session.count("model> Stand-in answer:") == 2 and "(history cleared)" in session
    assert run("--tools").startswith("(no tool call) Stand-in answer:")  # the stand-in calls no tools
    assert run("--chat").startswith("Stand-in answer:") and run("--completion").startswith("Stand-in answer:")
    assert run("--chat-batch").count("Stand-in answer:") == 2
    assert run("--embeddings").strip() == "2 embeddings of 16 dimensions"
    assert len(run("--rerank").split(";")) == 3 and len(run("--score").split(",")) == 2
    assert run("--speech", "--voice", "v").startswith("audio/wav: saved")
    assert run("--speech-batch").startswith("2 of 2 items")
    assert run("--audio-generate", "--seconds", "1").startswith("audio/wav: saved")
    assert run("--transcribe", str(clip)).startswith("Stand-in transcript:")
    assert run("--translate", str(clip)).startswith("Stand-in transcript:")
    assert run("--image").startswith("saved") and run("--edit", str(picture)).startswith("saved")
    assert run("--video", "--image-file", str(picture)).startswith("video/mp4: saved")
    assert sorted(p.name for p in out.iterdir()) == ["edited.png", "generated.wav", "image.png", "speech-0.wav",
                                                     "speech-1.wav", "speech.wav", "video.mp4"]
    edits = [r for r in records(record) if r["path"] == "/v1/images/edits"]
    assert edits[-1]["files"][0]["filename"] == "photo.png"
