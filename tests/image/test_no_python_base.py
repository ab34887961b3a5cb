"""A base without Python (as llama.cpp's official server image) still gets a working worker: the
image brings a relocatable Python and, lacking ss/netstat, a bundled ss."""

from __future__ import annotations

import io
import json

import pytest

from bakery.bases import make as bases
from bakery.build.builder import build_image
from bakery.recipe.render import RenderOptions, render
from bakery.spec.engine_spec import load_engine

BARE_TAG = "bakery-test/bare:latest"
# Like llama.cpp's official server image: no Python, and neither ss nor netstat.
BARE_DOCKERFILE = f"""FROM {bases.BASES["debian-nopython"].ref}
RUN rm -f /bin/ss /usr/bin/ss /sbin/ss /usr/sbin/ss /bin/netstat /usr/bin/netstat
"""


@pytest.fixture(scope="module")
def nopython_image(docker_client):
    bases.ensure_base("debian")
    bases.ensure_base("debian-nopython")
    docker_client.images.build(fileobj=io.BytesIO(BARE_DOCKERFILE.encode()), tag=BARE_TAG, rm=True)
    for tool in ("python3", "python", "ss", "netstat"):
        found = docker_client.containers.run(BARE_TAG, ["sh", "-c", f"command -v {tool} || true"], remove=True)
        assert found.strip() == b"", f"the bare base has {tool}: {found!r}"
    image_id = build_image(render(load_engine("llama"), RenderOptions(base_image=BARE_TAG)), lambda _m: None).image_id
    yield image_id
    docker_client.images.remove(image_id, force=True)
    docker_client.images.remove(BARE_TAG, force=True)


def run_python(client, image_id: str, code: str) -> str:
    return client.containers.run(image_id, ["-c", code], entrypoint="/opt/bakery/venv/bin/python",
                                 remove=True).decode()


def test_bundled_python_runs_the_worker_imports(docker_client, nopython_image: str) -> None:
    code = ("import json, os, sys; sys.path.insert(0, '/opt/bakery/worker'); "
            "import workers.llama.worker as w, app.sdk_config as sdk_config; sdk_config.import_sdk(); "
            "import vastai; print(json.dumps({'exe': os.path.realpath(sys.executable), "
            "'version': list(sys.version_info[:2]), 'engine': w.DEFAULTS.engine}))")
    seen = json.loads(run_python(docker_client, nopython_image, code))
    assert seen["exe"].startswith("/opt/bakery/python/"), seen
    assert seen["version"] >= [3, 10]
    assert seen["engine"] == "llama"


def test_bundled_ss_is_on_path(docker_client, nopython_image: str) -> None:
    out = docker_client.containers.run(nopython_image, ["-c", "command -v ss && ss -ltn"], entrypoint="/bin/sh",
                                       remove=True).decode()
    assert out.startswith("/opt/bakery/tools/bin/ss"), out
    assert "State" in out and "Local Address" in out


def test_start_server_resolves_backend_on_bundled_python(docker_client, nopython_image: str) -> None:
    # No platform variables: the worker must start on the bundled Python and stop with one clear line
    # per missing variable (not a KeyError traceback from deep inside the SDK).
    container = docker_client.containers.run(nopython_image, ["/opt/bakery/worker/start_server.sh"],
                                             entrypoint="/bin/sh", detach=True)
    try:
        result = container.wait(timeout=60)
        logs = container.logs().decode()
    finally:
        container.remove(force=True)
    assert result["StatusCode"] == 2, logs
    assert "CONTAINER_ID is not set" in logs and "Traceback" not in logs, logs
