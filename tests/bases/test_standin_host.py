"""The stand-in engines as host processes (no Docker): log lines, /health timing, API, switches."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import socket
import sys
import time
from typing import Any

import pytest

from tests.bases.conftest import STANDIN_DIR, StandinProc, free_port, wait_for

VLLM = ["vllm", "serve", "org/model-7b", "--host", "127.0.0.1", "--port", "{port}"]
SGLANG = ["sglang", "--model-path", "org/model-7b", "--host", "127.0.0.1", "--port", "{port}"]


def request(sp: StandinProc, method: str, path: str, body: Any = None,
            headers: dict[str, str] | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", sp.port, timeout=10)
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"content-type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def health(sp: StandinProc) -> int | None:
    """/health status, or None while the port refuses connections."""
    try:
        return request(sp, "GET", "/health")[0]
    except (TimeoutError, ConnectionRefusedError, ConnectionResetError):
        return None


def post_json(sp: StandinProc, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, text = request(sp, "POST", path, body)
    assert status == 200, text
    return json.loads(text)


def sse_events(text: str) -> list[str]:
    return [line[len("data: "):] for line in text.split("\n\n") if line.startswith("data: ")]


# ---------------------------------------------------------------------------------------------------
# Unit level: the stand-in's parser and answers (imported without putting `vllm` on sys.path)


@pytest.fixture(scope="module")
def core() -> Any:
    sys.path.insert(0, str(STANDIN_DIR))
    try:
        from bakery_standin import core as module
    finally:
        sys.path.remove(str(STANDIN_DIR))
    return module


def test_vllm_multiline_record_is_joined_by_crlf(capsys: Any) -> None:
    # vLLM's NewLineFormatter joins a record's lines with "\r\n" + prefix: the bytes the worker reads.
    sys.path.insert(0, str(STANDIN_DIR))
    try:
        from bakery_standin.vllm_engine import VllmProfile
    finally:
        sys.path.remove(str(STANDIN_DIR))
    VllmProfile().log("ERROR", "core.py:1584", "EngineCore failed to start.\nTraceback (most recent call last):",
                      "EngineCore")
    out = capsys.readouterr().out
    first, second = out.split("\r\n")
    assert first.startswith("(EngineCore pid=") and first.endswith("[core.py:1584] EngineCore failed to start.")
    assert second == first.replace("EngineCore failed to start.", "Traceback (most recent call last):") + "\n"


def test_tolerant_parser_keeps_unknown_args_and_values(core: Any) -> None:
    flags = [core.Flag(("--port",)), core.Flag(("--trust-remote-code",), 0, used=False),
             core.Flag(("--served-model-name",), "+")]
    parsed = core.parse_tolerant(
        ["--dtype", "half", "model", "--port=9", "--trust-remote-code", "--served-model-name", "a", "b",
         "--flag", "--x=1"], flags)
    assert parsed.positionals == ["model"]
    assert parsed.values == {"port": "9", "trust_remote_code": True, "served_model_name": ["a", "b"]}
    assert parsed.unknown == ["--dtype", "half", "--flag", "--x=1"]
    assert parsed.ignored == ["--trust-remote-code"]


def test_answers_are_deterministic_and_named(core: Any) -> None:
    a = core.reply_tokens("hello", 12)
    assert a == core.reply_tokens("hello", 12)
    assert a != core.reply_tokens("other prompt", 12)
    assert "".join(a).startswith("Stand-in answer:")
    assert core.reply_tokens("hello", 5) == a[:5]
    assert len(core.reply_tokens("x", 200)) == 200


def test_connections_have_tcp_nodelay(core: Any) -> None:
    """Each accepted connection gets TCP_NODELAY, as uvicorn's asyncio sockets do. Without it an
    answer's body (a second send, after the headers) waited for the client's delayed ACK: ~44 ms
    per answer on a keep-alive connection, which the real engines do not have."""

    class Probe(core.Handler):
        def handle(self) -> None:  # only the set-up of the connection, no request
            pass

    with socket.create_server(("127.0.0.1", 0)) as listener, socket.create_connection(listener.getsockname()[:2]):
        conn, address = listener.accept()
        with conn:
            assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
            Probe(conn, address, None)
            assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


@pytest.mark.parametrize("env", [{"STANDIN_LOAD_SECONDS": "soon"}, {"STANDIN_FAIL_LOAD": "maybe"},
                                 {"STANDIN_REPLY_TOKENS": "0"}])
def test_bad_switch_is_a_usage_error(core: Any, env: dict[str, str]) -> None:
    with pytest.raises(core.UsageError):
        core.Options.from_env(env)


# ---------------------------------------------------------------------------------------------------
# vLLM


def test_vllm_port_closed_until_ready_then_health_200(standin: Any) -> None:
    sp = standin(VLLM, {"STANDIN_LOAD_SECONDS": "1.5"})
    sp.wait_line("█  version 0.33.0+standin")
    assert health(sp) is None  # bound, not listening: refused while loading
    sp.wait_line("Application startup complete.")
    assert health(sp) == 200
    text = sp.text
    # vLLM 0.33's logo: one record, each of its lines under the record's prefix (the "\r" of its "\r\n"
    # joins is folded by the text-mode reader; test_vllm_multiline_record_is_joined_by_crlf checks it).
    prefix = f"(APIServer pid={sp.proc.pid}) INFO "
    logo = [line for line in text.splitlines() if "[startup.py:38]" in line]
    assert len(logo) == 6 and all(line.startswith(prefix) for line in logo), logo
    assert logo[2].endswith("█  version 0.33.0+standin") and logo[3].endswith("█  model   org/model-7b"), logo
    order = [text.index(s) for s in ("version 0.33.0+standin", "bakery stand-in for vLLM",
                                     "Starting vLLM server on http://127.0.0.1:", "Application startup complete.")]
    assert order == sorted(order)
    assert f"(APIServer pid={sp.proc.pid}) INFO:     Application startup complete." in text
    sp.wait_line('"GET /health HTTP/1.1" 200 OK')  # uvicorn's access line, written after the response


def test_vllm_module_entrypoint_and_unknown_args(standin: Any) -> None:
    sp = standin(["-m", "vllm.entrypoints.openai.api_server", "--model", "org/m", "--host", "127.0.0.1",
                  "--port", "{port}", "--served-model-name", "served", "--dtype", "half", "--foo-bar", "1",
                  "--trust-remote-code"])
    sp.wait_line("Application startup complete.")
    assert "engine args accepted without effect: ['--dtype', 'half', '--trust-remote-code']" in sp.text
    assert "unknown args tolerated and ignored: ['--foo-bar', '1']" in sp.text
    models = json.loads(request(sp, "GET", "/v1/models")[1])
    assert [m["id"] for m in models["data"]] == ["served"]
    assert models["data"][0]["root"] == "org/m"


def test_vllm_completion_chat_and_streaming(standin: Any) -> None:
    sp = standin(VLLM)
    sp.wait_line("Application startup complete.")
    first = post_json(sp, "/v1/completions", {"model": "org/model-7b", "prompt": "Hello", "max_tokens": 6})
    again = post_json(sp, "/v1/completions", {"prompt": "Hello", "max_tokens": 6})
    assert first["choices"][0]["text"] == again["choices"][0]["text"]
    assert first["choices"][0]["text"].startswith("Stand-in answer:")
    assert first["choices"][0]["finish_reason"] == "length"
    assert first["usage"]["completion_tokens"] == 6
    assert first["system_fingerprint"] == "vllm-0.33.0+standin"

    chat_body = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 500}
    chat = post_json(sp, "/v1/chat/completions", chat_body)
    content = chat["choices"][0]["message"]["content"]
    assert chat["object"] == "chat.completion" and chat["choices"][0]["finish_reason"] == "stop"

    status, text = request(sp, "POST", "/v1/chat/completions",
                           {**chat_body, "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200
    events = sse_events(text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert streamed == content
    assert chunks[-1]["usage"]["completion_tokens"] == 12

    status, text = request(sp, "POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 6, "stream": True})
    events = sse_events(text)
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == first["choices"][0]["text"]


def test_vllm_request_errors(standin: Any) -> None:
    sp = standin([*VLLM, "--api-key", "k1", "--max-model-len", "20"])
    sp.wait_line("Application startup complete.")
    auth = {"authorization": "Bearer k1"}
    assert request(sp, "POST", "/v1/completions", {"prompt": "x"})[0] == 401
    assert request(sp, "POST", "/v1/completions", {"prompt": "x", "model": "nope"}, auth)[0] == 404
    assert request(sp, "POST", "/v1/completions", {"prompt": "x " * 30, "max_tokens": 5}, auth)[0] == 400
    assert request(sp, "POST", "/v1/chat/completions", {"messages": []}, auth)[0] == 400
    assert request(sp, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 0}, auth)[0] == 400
    assert request(sp, "GET", "/nowhere")[0] == 404
    assert request(sp, "GET", "/health")[0] == 200  # health needs no key


def test_vllm_fail_load_prints_real_fatal_lines(standin: Any) -> None:
    sp = standin(VLLM, {"STANDIN_FAIL_LOAD": "1"})
    assert sp.wait_exit() == 1
    text = sp.text
    for needle in ("EngineCore failed to start.", "Traceback (most recent call last):",
                   "RuntimeError: Engine core initialization failed. See root cause above.",
                   "bakery stand-in: STANDIN_FAIL_LOAD"):
        assert needle in text
    assert "Application startup complete." not in text
    assert health(sp) is None


def test_vllm_crash_after_load(standin: Any) -> None:
    sp = standin(VLLM, {"STANDIN_CRASH_AFTER_LOAD": "0.5", "STANDIN_EXIT_DELAY": "2",
                        "STANDIN_FAIL_REASON": "RuntimeError: boom"})
    sp.wait_line("Application startup complete.")
    sp.wait_line("EngineCore encountered a fatal error.")
    assert health(sp) == 503  # the engine died, the API server still answers
    assert request(sp, "POST", "/v1/completions", {"prompt": "x"})[0] == 500
    assert sp.wait_exit() == 1
    assert "RuntimeError: boom" in sp.text and "EngineDeadError" in sp.text


def test_vllm_sigterm_is_a_clean_exit(standin: Any) -> None:
    sp = standin(VLLM)
    sp.wait_line("Application startup complete.")
    sp.proc.terminate()
    assert sp.wait_exit() == 0
    assert f"Finished server process [{sp.proc.pid}]" in sp.text


def test_vllm_port_in_use_fails_at_start(standin: Any) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        sp = standin(VLLM, port=taken.getsockname()[1])
        assert sp.wait_exit() == 1
    assert "OSError: [Errno 98] Address already in use" in sp.text


def test_vllm_executable_version_and_help() -> None:
    import subprocess

    vllm = str(STANDIN_DIR / "bin" / "vllm")
    out = subprocess.run([sys.executable, vllm, "--version"], capture_output=True, text=True, check=True,
                         timeout=30)
    assert out.stdout.strip() == "0.33.0+standin"
    out = subprocess.run([sys.executable, vllm, "serve", "--help"], capture_output=True, text=True, check=True,
                         timeout=30)
    assert "stand-in" in out.stdout
    out = subprocess.run([sys.executable, vllm, "bench"], capture_output=True, text=True, check=False, timeout=30)
    assert out.returncode == 2 and "only implements `vllm serve`" in out.stderr


def test_concurrent_streams_overlap(standin: Any) -> None:
    sp = standin(VLLM, {"STANDIN_TOKEN_DELAY": "0.05"})
    sp.wait_line("Application startup complete.")
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "stream": True}
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _i: request(sp, "POST", "/v1/chat/completions", body), range(8)))
    elapsed = time.monotonic() - started
    assert all(status == 200 and text.rstrip().endswith("data: [DONE]") for status, text in results)
    assert elapsed < 8 * 10 * 0.05 / 2, f"8 streams of 0.5 s took {elapsed:.2f} s: not concurrent"


# ---------------------------------------------------------------------------------------------------
# SGLang


def test_sglang_health_503_while_warming_then_200(standin: Any) -> None:
    sp = standin(SGLANG, {"STANDIN_LOAD_SECONDS": "0.5", "STANDIN_WARMUP_SECONDS": "1.5"})
    sp.wait_line("server_args=ServerArgs(model_path='org/model-7b'")
    assert health(sp) is None  # weights loading: port closed
    sp.wait_line("Uvicorn running on http://127.0.0.1:")
    assert "fired up" not in sp.text
    assert health(sp) == 503
    sp.wait_line("The server is fired up and ready to roll!")
    assert health(sp) == 200
    text = sp.text
    assert text.index("Uvicorn running on") < text.index('"GET /model_info HTTP/1.1" 200 OK') \
        < text.index('"POST /generate HTTP/1.1" 200 OK') < text.index("The server is fired up and ready to roll!")
    assert '"GET /health HTTP/1.1" 503 Service Unavailable' in text
    answer = post_json(sp, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert answer["choices"][0]["message"]["content"].startswith("Stand-in answer:")
    assert answer["system_fingerprint"] == "sglang-0.5.23+standin"


def test_sglang_module_entrypoint_defaults_and_unknown_args(standin: Any) -> None:
    port = free_port()
    sp = standin(["-m", "sglang.launch_server", "--model-path", "m", "--port", str(port), "--tp", "2",
                  "--enable-foo"], {"STANDIN_WARMUP_SECONDS": "0"}, port=port)
    sp.wait_line("The server is fired up and ready to roll!")
    assert "host='127.0.0.1'" in sp.text
    assert "unknown args tolerated and ignored: ['--enable-foo']" in sp.text
    assert json.loads(request(sp, "GET", "/model_info")[1])["model_path"] == "m"
    # the 0.5.23 name of the route, and its deprecated old one, which warns
    assert request(sp, "GET", "/ready")[0] == 200
    assert json.loads(request(sp, "GET", "/get_model_info")[1])["served_model_name"] == "m"
    sp.wait_line("Endpoint '/get_model_info' is deprecated and will be removed in a future version.")


def test_sglang_requires_model_path(standin: Any) -> None:
    sp = standin(["sglang", "--port", "{port}"])
    assert sp.wait_exit() == 2
    assert "the following arguments are required: --model-path" in sp.text


def test_sglang_fail_load_and_warmup(standin: Any) -> None:
    sp = standin(SGLANG, {"STANDIN_FAIL_LOAD": "1"})
    assert sp.wait_exit() == 1
    assert "Scheduler hit an exception: Traceback (most recent call last):" in sp.text
    assert "Received sigquit from a child process" in sp.text
    assert "Uvicorn running" not in sp.text

    sp = standin(SGLANG, {"STANDIN_FAIL_LOAD": "warmup", "STANDIN_WARMUP_SECONDS": "0.2"})
    sp.wait_line("Uvicorn running on")
    assert sp.wait_exit() == 1
    assert "Initialization failed. warmup error: Traceback (most recent call last):" in sp.text
    assert "fired up" not in sp.text


def test_sglang_crash_after_load(standin: Any) -> None:
    sp = standin(SGLANG, {"STANDIN_WARMUP_SECONDS": "0", "STANDIN_CRASH_AFTER_LOAD": "0.3",
                          "STANDIN_EXIT_DELAY": "1.5"})
    sp.wait_line("The server is fired up and ready to roll!")
    sp.wait_line("Scheduler hit an exception")
    assert wait_for(lambda: health(sp) == 503, 2, "/health 503 after the crash")
    assert sp.wait_exit() == 1


# ---------------------------------------------------------------------------------------------------
# The routes beyond completions and chat (bakery_standin/api.py) and the request record


def multipart(fields: list[tuple[str, Any]]) -> tuple[bytes, str]:
    """A multipart/form-data body: a (name, value) item is a text field, (name, (filename, bytes, type)) a file."""
    boundary = "standinTestBoundary7d93"
    out = b""
    for name, value in fields:
        if isinstance(value, tuple):
            filename, data, ctype = value
            head = (f'Content-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
                    f"Content-Type: {ctype}\r\n\r\n")
        else:
            head, data = f'Content-Disposition: form-data; name="{name}"\r\n\r\n', str(value).encode()
        out += f"--{boundary}\r\n".encode() + head.encode() + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def post_form(sp: StandinProc, path: str, fields: list[tuple[str, Any]]) -> tuple[int, str, bytes]:
    """POST multipart form data; (status, content type, body)."""
    body, ctype = multipart(fields)
    conn = http.client.HTTPConnection("127.0.0.1", sp.port, timeout=10)
    try:
        conn.request("POST", path, body=body, headers={"content-type": ctype})
        resp = conn.getresponse()
        return resp.status, resp.getheader("content-type") or "", resp.read()
    finally:
        conn.close()


def post_raw(sp: StandinProc, path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", sp.port, timeout=10)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"content-type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.getheader("content-type") or "", resp.read()
    finally:
        conn.close()


def wav_clip(seconds: float, rate: int = 16000) -> bytes:
    import io
    import wave

    out = io.BytesIO()
    with wave.open(out, "wb") as clip:
        clip.setnchannels(1)
        clip.setsampwidth(2)
        clip.setframerate(rate)
        clip.writeframes(b"\x01\r\n\x00" * int(seconds * rate / 2))  # CR LF inside: parts must survive it
    return out.getvalue()


def records(path: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_multipart_parser_keeps_bytes_exactly_and_repeats_fields(core: Any) -> None:
    data = b"\r\n--not-the-boundary\r\n\x00\xff\r\n"
    body, ctype = multipart([("prompt", "a cat"), ("image", ("a.png", data, "image/png")),
                             ("image", ("b.png", b"x", "image/png")), ("n", 2)])
    form = core.parse_multipart(body, ctype)
    assert form["prompt"] == "a cat" and form["n"] == "2"
    assert [(u.filename, u.content_type, u.data) for u in form["image"]] == [("a.png", "image/png", data),
                                                                            ("b.png", "image/png", b"x")]
    with pytest.raises(core.RequestError):
        core.parse_multipart(body[:-10], ctype)


def test_vllm_json_routes(standin: Any) -> None:
    import base64
    import io
    import struct
    import wave
    import zlib

    sp = standin(VLLM)
    sp.wait_line("Application startup complete.")
    emb = post_json(sp, "/v1/embeddings", {"model": "org/model-7b", "input": ["a", "b"]})
    assert emb["object"] == "list" and [d["index"] for d in emb["data"]] == [0, 1]
    vector = emb["data"][0]["embedding"]
    assert len(vector) == 16 and abs(sum(v * v for v in vector) - 1) < 1e-9
    packed = post_json(sp, "/v1/embeddings", {"input": "a", "encoding_format": "base64", "dimensions": 4})
    assert len(struct.unpack("<4f", base64.b64decode(packed["data"][0]["embedding"]))) == 4

    docs = ["one", "two", "three"]
    ranked = post_json(sp, "/v1/rerank", {"query": "q", "documents": docs, "top_n": 2})
    scores = [r["relevance_score"] for r in ranked["results"]]
    assert len(scores) == 2 and scores == sorted(scores, reverse=True)
    for body in ({"text_1": "q", "text_2": docs}, {"queries": "q", "items": docs}, {"data_1": docs, "data_2": docs}):
        scored = post_json(sp, "/v1/score", body)
        assert [d["index"] for d in scored["data"]] == [0, 1, 2] and scored["data"][0]["object"] == "score"

    batch = post_json(sp, "/v1/chat/completions/batch", {"messages": [[{"role": "user", "content": "a"}],
                                                                      [{"role": "user", "content": "b"}]],
                                                         "max_tokens": 6})
    assert [c["index"] for c in batch["choices"]] == [0, 1]
    assert batch["choices"][0]["message"]["content"].startswith("Stand-in answer:")

    status, ctype, audio = post_raw(sp, "/v1/audio/speech", {"input": "Hello there", "voice": "v"})
    assert (status, ctype) == (200, "audio/wav")
    with wave.open(io.BytesIO(audio)) as clip:
        assert clip.getnframes() > 0
    status, _, _ = post_raw(sp, "/v1/audio/speech", {"input": "hi", "ref_audio": "/root/voice.wav"})
    assert status == 400
    many = post_json(sp, "/v1/audio/speech/batch", {"items": [{"input": "a"}, {"input": ""}]})
    assert (many["total"], many["succeeded"], many["failed"]) == (2, 1, 1)
    assert base64.b64decode(many["results"][0]["audio_data"])[:4] == b"RIFF"
    status, ctype, audio = post_raw(sp, "/v1/audio/generate", {"input": "rain", "audio_length": 2})
    with wave.open(io.BytesIO(audio)) as clip:
        assert (status, ctype, clip.getnframes() / clip.getframerate()) == (200, "audio/wav", 2.0)

    images = post_json(sp, "/v1/images/generations", {"prompt": "a cat", "size": "64x32", "n": 2})
    png = base64.b64decode(images["data"][1]["b64_json"])
    assert len(images["data"]) == 2 and png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (64, 32)
    (idat_len,) = struct.unpack(">I", png[33:37])
    assert png[37:41] == b"IDAT" and len(zlib.decompress(png[41:41 + idat_len])) == 32 * (1 + 3 * 64)
    for path, body in (("/v1/embeddings", {}), ("/v1/rerank", {"query": "q"}), ("/v1/score", {"text_1": "q"}),
                       ("/v1/images/generations", {"prompt": "p", "size": "huge"})):
        assert request(sp, "POST", path, body)[0] == 400, path


def test_vllm_upload_routes_take_multipart_and_record_each_part(standin: Any, tmp_path: Any) -> None:
    import hashlib

    record = tmp_path / "record.jsonl"
    sp = standin(VLLM, env={"STANDIN_RECORD": str(record)})
    sp.wait_line("Application startup complete.")
    clip = wav_clip(1.5)
    status, _, body = post_form(sp, "/v1/audio/transcriptions", [("file", ("speech.wav", clip, "audio/wav")),
                                                                  ("language", "en")])
    answer = json.loads(body)
    assert status == 200 and answer["text"].startswith("Stand-in transcript:")
    assert answer["usage"] == {"type": "duration", "seconds": 2}
    status, ctype, body = post_form(sp, "/v1/audio/translations", [("file", ("s.wav", clip, "audio/wav")),
                                                                    ("response_format", "text")])
    assert (status, ctype) == (200, "text/plain; charset=utf-8") and body.decode() == answer["text"]
    status, _, body = post_form(sp, "/v1/audio/transcriptions", [("file", ("s.wav", clip, "audio/wav")),
                                                                  ("stream", "true")])
    events = sse_events(body.decode())
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1]) == answer["text"]
    assert post_form(sp, "/v1/audio/transcriptions", [("file", ("x.wav", b"not audio", "audio/wav"))])[0] == 400
    assert post_form(sp, "/v1/audio/transcriptions", [("language", "en")])[0] == 400
    assert request(sp, "POST", "/v1/audio/transcriptions", {"file": "base64 in JSON"})[0] == 400

    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32
    status, _, body = post_form(sp, "/v1/images/edits", [("image", ("a.png", png, "image/png")),
                                                         ("image", ("b.png", png, "image/png")),
                                                         ("mask", ("m.png", png, "image/png")),
                                                         ("prompt", "hat"), ("size", "32x32")])
    assert status == 200 and len(json.loads(body)["data"]) == 1
    status, ctype, body = post_form(sp, "/v1/videos/sync", [("prompt", "a cat"), ("num_frames", 33)])
    assert (status, ctype, body[4:8]) == (200, "video/mp4", b"ftyp")

    seen = records(record)
    assert [r["path"] for r in seen] == ["/v1/audio/transcriptions", "/v1/audio/translations",
                                         "/v1/audio/transcriptions", "/v1/audio/transcriptions",
                                         "/v1/audio/transcriptions", "/v1/images/edits", "/v1/videos/sync"]
    assert seen[0]["content_type"] == "multipart/form-data" and seen[0]["form"] == {"language": "en"}
    assert seen[0]["files"] == [{"field": "file", "filename": "speech.wav", "content_type": "audio/wav",
                                 "size": len(clip), "sha256": hashlib.sha256(clip).hexdigest()}]
    assert [(f["field"], f["filename"]) for f in seen[5]["files"]] == [("image", "a.png"), ("image", "b.png"),
                                                                      ("mask", "m.png")]
    assert seen[6]["form"] == {"prompt": "a cat", "num_frames": "33"} and seen[6]["files"] == []


def test_a_json_request_is_recorded_whole(standin: Any, tmp_path: Any) -> None:
    record = tmp_path / "record.jsonl"
    sp = standin(VLLM, env={"STANDIN_RECORD": str(record)})
    sp.wait_line("Application startup complete.")
    post_json(sp, "/v1/embeddings", {"input": "x"})
    assert records(record) == [{"method": "POST", "path": "/v1/embeddings", "content_type": "application/json",
                                "json": {"input": "x"}}]


def test_sglang_serves_its_own_shapes_and_404s_what_it_lacks(standin: Any) -> None:
    sp = standin(SGLANG)
    sp.wait_line("The server is fired up and ready to roll!")
    assert len(post_json(sp, "/v1/embeddings", {"input": "x"})["data"][0]["embedding"]) == 16
    ranked = post_json(sp, "/v1/rerank", {"query": "q", "documents": ["a", "b"]})
    assert isinstance(ranked, list) and {"score", "document", "index"} <= set(ranked[0])
    scored = post_json(sp, "/v1/score", {"query": "q", "items": ["a", "b"], "label_token_ids": [1, 2],
                                         "apply_softmax": True})
    assert len(scored["scores"]) == 2 and abs(sum(scored["scores"][0]) - 1) < 1e-9
    assert request(sp, "POST", "/v1/score", {"text_1": "q", "text_2": ["a"]})[0] == 400  # vLLM's shape
    status, _, body = post_form(sp, "/v1/audio/transcriptions", [("file", ("s.wav", wav_clip(1), "audio/wav"))])
    assert status == 200 and json.loads(body)["text"].startswith("Stand-in transcript:")
    for path in ("/v1/chat/completions/batch", "/v1/audio/speech", "/v1/audio/translations",
                 "/v1/images/generations", "/v1/images/edits", "/v1/videos/sync", "/v1/audio/generate"):
        assert request(sp, "POST", path, {"input": "x"}) == (404, '{"detail": "Not Found"}'), path
