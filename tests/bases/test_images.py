"""Each local base is made and carries what it promises (needs Docker: fails under CI=true without it)."""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.bases.conftest import IN_CI, logs, sh, wait_for

MODEL = "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
ENGINE_PORT = 18000

# Inside a container: GET/POST one URL with the image's python3, print "status body" (status 0: refused).
HTTP_PROBE = """
import json, sys, urllib.error, urllib.request
url, body = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
req = urllib.request.Request(url, data=body.encode() if body else None,
                             headers={"content-type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=60) as r:
        print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
except OSError as e:
    print(0, e)
"""


def probe(container: Any, path: str, body: Any = None, python: str = "python3") -> tuple[int, str]:
    args = [python, "-c", HTTP_PROBE, f"http://127.0.0.1:{ENGINE_PORT}{path}"]
    if body is not None:
        args.append(json.dumps(body))
    code, out = container.exec_run(args)
    text = out.decode(errors="replace").strip()
    assert code == 0, text
    status, _, rest = text.partition(" ")
    return int(status), rest


def infra(container: Any) -> Any:
    try:
        import testinfra
    except ImportError:
        if IN_CI:
            pytest.fail("pytest-testinfra is required under CI=true (requirements-dev.txt)", pytrace=False)
        pytest.skip("pytest-testinfra is not installed")
    return testinfra.get_host(f"docker://{container.id}")


def labels(docker_client: Any, ref: str) -> dict[str, str]:
    return docker_client.images.get(ref).labels


# ---------------------------------------------------------------------------------------------------
# debian / debian-nopython


def test_debian_has_python_venv_ss_tini_and_no_docs(docker_client: Any, debian_image: str,
                                                     containers: Any) -> None:
    box = containers(debian_image, ["sleep", "300"])
    code, out = sh(box, "python3 --version && python3 -m venv /tmp/v && /tmp/v/bin/python -c 'import ssl'")
    assert code == 0 and "Python 3.11." in out, out
    for tool in ("ss", "tini", "ps", "bash"):
        assert sh(box, f"command -v {tool}")[0] == 0, f"{tool} missing"
    assert sh(box, "ls /usr/lib/x86_64-linux-gnu/libgomp.so.1")[0] == 0
    assert sh(box, "find /usr/share/doc -type f ! -name copyright | head -1")[1].strip() == ""
    assert sh(box, "ls /usr/share/man /var/lib/apt/lists | grep -v -e '^partial$' -e ':$' -e lock -e '^$'"
              )[1].strip() == ""
    attrs = docker_client.images.get(debian_image).attrs
    assert attrs["Config"]["Cmd"] == ["bash"]
    assert any(e.startswith("PATH=/usr/local/sbin:") for e in attrs["Config"]["Env"])
    assert labels(docker_client, debian_image)["org.bakery.base.name"] == "debian"
    assert attrs["Size"] < 200e6, f"debian base grew to {attrs['Size'] / 1e6:.0f} MB"


def test_debian_supports_testinfra_socket_checks(debian_image: str, containers: Any) -> None:
    box = containers(debian_image, ["python3", "-m", "http.server", "3000", "--bind", "0.0.0.0"])  # noqa: S104
    host = infra(box)
    wait_for(lambda: host.socket("tcp://0.0.0.0:3000").is_listening, 20, "port 3000 listening")
    assert host.package("iproute2").is_installed
    assert host.exists("python3") and host.exists("tini")


def test_nopython_has_no_python_but_has_shell_and_ss(docker_client: Any, nopython_image: str,
                                                      debian_image: str, containers: Any) -> None:
    box = containers(nopython_image, ["sleep", "300"])
    assert sh(box, "command -v python3 || command -v python || command -v python3.11")[0] != 0
    found = sh(box, 'for f in /usr/lib/python3* /usr/bin/python* /usr/local/bin/python*; do '
                    '[ -e "$f" ] && echo "$f"; done; true')[1]
    assert found.strip() == "", f"python left in debian-nopython: {found}"
    assert sh(box, "dpkg -l 'python3*' 'libpython3*' 2>/dev/null | grep -c '^ii' || true")[1].strip() == "0"
    for tool in ("sh", "ss", "tini", "ps"):
        assert sh(box, f"command -v {tool}")[0] == 0, f"{tool} missing"
    small = docker_client.images.get(nopython_image).attrs["Size"]
    full = docker_client.images.get(debian_image).attrs["Size"]
    assert small < full - 20e6, f"nopython {small / 1e6:.0f} MB vs debian {full / 1e6:.0f} MB"
    assert labels(docker_client, nopython_image)["org.bakery.base.parent"] == \
        docker_client.images.get(debian_image).id


def test_second_call_is_cached(docker_client: Any, debian_image: str, vllm_image: str) -> None:
    from bakery.bases.make import ensure_base

    before = {ref: docker_client.images.get(ref).id for ref in (debian_image, vllm_image)}
    messages: list[str] = []
    started = time.monotonic()
    assert ensure_base("vllm-standin", progress=messages.append) == vllm_image
    assert time.monotonic() - started < 10
    assert {ref: docker_client.images.get(ref).id for ref in before} == before
    assert any(m.startswith("vllm-standin: cached") for m in messages), messages


def test_changed_inputs_rebuild_and_unchanged_reuse(docker_client: Any, debian_image: str,
                                                     monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A base whose build context changed is rebuilt; an unchanged one is reused (on a scratch ref)."""
    from bakery.bases import make as bases

    ref = f"bakery-test/sglang-standin:rebuild-{time.time_ns()}"
    context = tmp_path / "standin"
    shutil.copytree(bases.STANDIN_DIR, context, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(bases, "STANDIN_DIR", context)
    monkeypatch.setitem(bases.BASES, "sglang-standin", bases.Base("sglang-standin", ref, "debian", "test"))

    def quiet(_message: str) -> None:
        pass

    try:
        first = docker_client.images.get(bases.ensure_base("sglang-standin", progress=quiet))
        again = docker_client.images.get(bases.ensure_base("sglang-standin", progress=quiet))
        assert again.id == first.id
        init = context / "sglang" / "__init__.py"
        init.write_text(init.read_text() + "\n# changed\n")
        changed = docker_client.images.get(bases.ensure_base("sglang-standin", progress=quiet))
        assert changed.id != first.id
        assert changed.labels["org.bakery.base.inputs"] != first.labels["org.bakery.base.inputs"]
        assert changed.labels["org.bakery.base.parent"] == docker_client.images.get(debian_image).id
    finally:
        with contextlib.suppress(Exception):
            docker_client.images.remove(ref, force=True)


def test_unknown_base_is_an_input_error() -> None:
    from bakery.bases.make import ensure_base
    from bakery.errors import InputError

    with pytest.raises(InputError, match="unknown base 'ubuntu'"):
        ensure_base("ubuntu")


# ---------------------------------------------------------------------------------------------------
# stand-ins


def test_vllm_standin_serves_under_vllm_serve(docker_client: Any, vllm_image: str, containers: Any) -> None:
    assert docker_client.images.get(vllm_image).attrs["Config"]["Entrypoint"] == ["vllm", "serve"]
    box = containers(vllm_image, ["org/model", "--host", "127.0.0.1", "--port", str(ENGINE_PORT),
                                  "--gpu-memory-utilization", "0.9"],
                     environment={"STANDIN_LOAD_SECONDS": "1"})
    wait_for(lambda: "Application startup complete." in logs(box), 30, "vLLM's ready line")
    text = logs(box)
    assert "█  version 0.33.0+standin" in text
    assert f"Starting vLLM server on http://127.0.0.1:{ENGINE_PORT}" in text
    assert "'--gpu-memory-utilization', '0.9'" in text
    assert probe(box, "/health")[0] == 200
    status, body = probe(box, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"].startswith("Stand-in")
    host = infra(box)
    assert host.socket(f"tcp://127.0.0.1:{ENGINE_PORT}").is_listening


def test_vllm_standin_module_path_and_fail_switch(vllm_image: str, containers: Any) -> None:
    cmd = ["-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--host", "127.0.0.1",
           "--port", str(ENGINE_PORT)]
    box = containers(vllm_image, cmd, entrypoint=["python3"],
                     environment={"STANDIN_LOAD_SECONDS": "0.5", "STANDIN_FAIL_LOAD": "1"})
    assert box.wait(timeout=60)["StatusCode"] == 1
    text = logs(box)
    assert "EngineCore failed to start." in text
    assert "RuntimeError: Engine core initialization failed." in text
    assert "Application startup complete." not in text


def test_sglang_standin_503_then_200(docker_client: Any, sglang_image: str, containers: Any) -> None:
    box = containers(sglang_image, ["python3", "-m", "sglang.launch_server", "--model-path", "org/m",
                                    "--host", "0.0.0.0", "--port", str(ENGINE_PORT)],  # noqa: S104
                     environment={"STANDIN_LOAD_SECONDS": "0.5", "STANDIN_WARMUP_SECONDS": "4"})
    wait_for(lambda: "Uvicorn running on http://0.0.0.0:18000" in logs(box), 30, "uvicorn's line")
    assert probe(box, "/health")[0] == 503
    assert "fired up" not in logs(box)
    wait_for(lambda: "The server is fired up and ready to roll!" in logs(box), 30, "SGLang's ready line")
    assert probe(box, "/health")[0] == 200
    host = infra(box)
    assert host.socket(f"tcp://0.0.0.0:{ENGINE_PORT}").is_listening


def test_sglang_standin_fail_switch(sglang_image: str, containers: Any) -> None:
    box = containers(sglang_image, ["python3", "-m", "sglang.launch_server", "--model-path", "m",
                                    "--port", str(ENGINE_PORT)],
                     environment={"STANDIN_LOAD_SECONDS": "0.2", "STANDIN_FAIL_LOAD": "1"})
    assert box.wait(timeout=60)["StatusCode"] == 1
    assert "Scheduler hit an exception: Traceback (most recent call last):" in logs(box)


# ---------------------------------------------------------------------------------------------------
# llama-cpp: a real llama.cpp server with a real model


def test_llama_cpp_serves_real_completions(docker_client: Any, llama_image: str, containers: Any) -> None:
    attrs = docker_client.images.get(llama_image).attrs["Config"]
    assert attrs["Entrypoint"] == ["/app/llama-server"]
    box = containers(llama_image, ["-m", MODEL, "--host", "127.0.0.1", "--port", str(ENGINE_PORT),
                                   "-c", "2048", "-t", "2"], entrypoint=["/app/llama-server"])
    wait_for(lambda: "model loaded" in logs(box), 120, "llama.cpp's `model loaded` line")
    text = logs(box)
    assert f"listening on http://127.0.0.1:{ENGINE_PORT}" in text
    status, body = probe(box, "/health")
    assert (status, json.loads(body)) == (200, {"status": "ok"})
    status, body = probe(box, "/v1/completions",
                         {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0})
    assert status == 200, body
    completion = json.loads(body)
    assert completion["usage"]["completion_tokens"] > 0 and completion["choices"][0]["text"].strip()
    status, body = probe(box, "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "What is 2+2? Answer briefly."}],
                          "max_tokens": 16, "temperature": 0})
    assert status == 200, body
    answer = json.loads(body)["choices"][0]["message"]["content"]
    assert answer.strip() and "Stand-in" not in answer
    host = infra(box)
    assert host.socket(f"tcp://127.0.0.1:{ENGINE_PORT}").is_listening
    assert host.file(MODEL).size > 90 * 2**20


POLL_WHILE_STARTING = """
import subprocess, sys, time, urllib.error, urllib.request
server = subprocess.Popen(sys.argv[1:])
for _ in range(6000):
    try:
        with urllib.request.urlopen("http://127.0.0.1:18000/health", timeout=10) as r:
            print("HEALTH", r.status, r.read().decode(), flush=True)
            break
    except urllib.error.HTTPError as e:
        print("HEALTH", e.code, e.read().decode(), flush=True)
    except OSError:
        pass
    time.sleep(0.01)
server.wait()
"""


def test_llama_cpp_health_503_while_loading(llama_image: str, containers: Any) -> None:
    """llama.cpp binds before loading: /health answers 503 "Loading model", then 200."""
    box = containers(llama_image, ["-c", POLL_WHILE_STARTING, "/app/llama-server", "-m", MODEL,
                                   "--host", "127.0.0.1", "--port", str(ENGINE_PORT), "-t", "1"],
                     entrypoint=["python3"])
    wait_for(lambda: 'HEALTH 200 {"status":"ok"}' in logs(box), 120, "/health 200")
    text = logs(box)
    assert 'HEALTH 503 {"error":{"message":"Loading model"' in text, text[-3000:]
    assert text.index("HEALTH 503") < text.index("HEALTH 200")


def test_llama_cpp_bad_model_fails_with_llama_lines(llama_image: str, containers: Any) -> None:
    box = containers(llama_image, ["-m", "/models/missing.gguf", "--host", "127.0.0.1",
                                   "--port", str(ENGINE_PORT)])
    assert box.wait(timeout=60)["StatusCode"] == 1
    text = logs(box)
    assert "failed to load model" in text and "exiting due to model loading error" in text
    assert "model loaded" not in text
