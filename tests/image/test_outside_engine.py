"""Proof that an engine is data: a fifth engine, `echo`, that this repository does not know — its spec
and template written into a temporary directory, its own model variable and log grammar — is built
with build.py (--images-dir, --templates-dir) and passes the gate, touching no file of the repository.

`echo` runs on the vLLM stand-in base through a wrapper its own template adds, which rewrites the
stand-in's lines into echo's grammar (`echo: ready to serve`, `echo: fatal ...`), and it has no worker
adapter: the generic worker serves it with the values its image bakes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bakery.build.verify import run_gate
from bakery.spec.engine_spec import REPO_ROOT
from tests.image.launch import launch, serverless_env

SPEC = {
    "name": "echo",
    "description": "echo, an engine kept outside bakery",
    "version": "1.0.0",
    "source": "https://github.com/example/echo",
    "base": {"image": "example/echo:1.0.0", "local": "vllm-standin", "local_model": "standin/tiny-chat",
             "local_fail_load": {"env": {"STANDIN_FAIL_LOAD": "1"}},
             "local_long_answer": {"env": {"STANDIN_TOKEN_DELAY": "0.1", "STANDIN_REPLY_TOKENS": "30"}, "tokens": 30}},
    "engine": {"command": ["/usr/local/bin/echo-server", "${ECHO_MODEL}"], "model_var": "ECHO_MODEL",
               "args_var": "ECHO_ARGS"},
    "bake": {"env": {"BACKEND": "echo", "MODEL_LOG": "/var/log/portal/echo.log",
                     "MODEL_LOAD_LOG_MSG": ["echo: ready to serve"],
                     "MODEL_ERROR_LOG_MSGS": ["INFO exited: echo", "echo: fatal"],
                     "MODEL_INFO_LOG_MSGS": ['"message":"Download'], "MODEL_HEALTH_ENDPOINT": "/health"},
             "expose": [3000]},
}
# The engine is the stand-in run through sed: exec keeps the stand-in as the program (its exit status
# and SIGTERM), the process substitution rewrites its lines.
WRAPPER = [
    "#!/bin/bash",
    "export PYTHONUNBUFFERED=1",
    'exec vllm serve "$1" --host 127.0.0.1 --port 18000 "${@:2}" > >(exec sed -u'
    ' -e "s/Application startup complete\\./echo: ready to serve/"'
    ' -e "s/EngineCore failed to start\\./echo: fatal: the engine core did not start/") 2>&1',
]
TEMPLATE = ('{% extends "base.Dockerfile.j2" %}\n{% block engine %}\n'
            "# echo: the stand-in speaking echo's log grammar\n"
            "RUN printf '%s\\n' " + " ".join(f"'{line}'" for line in WRAPPER)
            + " > /usr/local/bin/echo-server && chmod 755 /usr/local/bin/echo-server\n{% endblock %}\n")


def _repo_state() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO_ROOT,
                          capture_output=True, text=True, check=True).stdout


@pytest.mark.serve
def test_a_fifth_engine_from_outside_the_repository_passes_the_gate(tmp_path: Path, docker_client) -> None:
    before = _repo_state()
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "echo.yaml").write_text(yaml.safe_dump(SPEC, sort_keys=False))
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "echo.Dockerfile.j2").write_text(TEMPLATE)
    build = subprocess.run([sys.executable, str(REPO_ROOT / "build.py"), "--images-dir", str(tmp_path / "images"),
                            "--templates-dir", str(tmp_path / "templates"), "--engine", "echo", "--local",
                            "--no-verify", "--json", "--quiet"], cwd=REPO_ROOT, capture_output=True, text=True,
                           timeout=1800, check=False)
    assert build.returncode == 0, build.stderr[-3000:]
    image_id = json.loads(build.stdout)["engines"][0]["image_id"]

    gate = run_gate(image_id, "echo", variant="local", quiet=True, images_dir=tmp_path / "images")
    assert gate.passed, f"failed: {gate.failed}\n{gate.output[-4000:]}"
    assert gate.ran >= 10, gate.output[-2000:]

    from bakery.spec.engine_spec import load_spec_file

    spec = load_spec_file(tmp_path / "images" / "echo.yaml")
    launched = launch(docker_client, image_id, serverless_env(spec), "echo-banner")
    try:
        deadline = time.monotonic() + 60
        while "Using worker backend: echo" not in launched.logs() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "Using worker backend: echo" in launched.logs(), launched.logs()[-2000:]
    finally:
        launched.container.remove(force=True)
    assert _repo_state() == before, "building an outside engine changed the repository"
