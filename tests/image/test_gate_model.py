"""The gate, on a model baked into the image (build.py --model): the engine serves exactly that model.

The image's model labels agree with the manifest it carries (`/models/baked/<name>.sha256`, whose sha256 is
the digest label), its files pass `sha256sum -c --strict` and are all the model directory holds, and the
serverless launch, made WITHOUT the model variable (so the baked default runs, as a template that sets none
runs it), serves the baked path at the engine's `/v1/models`. On an image that bakes no model these checks
are reported as not run, with the reason. Each test is one named check; build.py names the ones that fail.
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from bakery.build.verify import GATE_BAKED_DIGEST_VAR
from bakery.model.manifest import BAKED_DIR, DIGEST_LABEL, NAME_LABEL, PATH_LABEL, SIZE_LABEL
from bakery.spec import engine_facts
from tests.image.conftest import READY_TIMEOUT, ImageUnderTest
from tests.image.launch import WORKER_PYTHON, Launched, serverless_env
from tests.image.test_gate import config_env

NOT_BAKED = "not run: the image bakes no model (build.py --model)"
MODEL_LABELS = (NAME_LABEL, DIGEST_LABEL, SIZE_LABEL, PATH_LABEL)
# Lists every regular file under a directory (relative, '/'-separated) with its size, with the worker's
# Python, so no find(1) or stat(1) is needed in the base.
FILES_PROBE = """
import json, os, sys
root = sys.argv[1]
out = {}
for top, dirs, files in os.walk(root):
    for name in files:
        path = os.path.join(top, name)
        out[os.path.relpath(path, root)] = os.lstat(path).st_size
print(json.dumps(out))
"""
# The engine's own list of served models, asked on loopback inside the container.
MODELS_PROBE = ("import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:18000/v1/models', "
                "timeout=30).read().decode())")


@pytest.fixture(scope="module")
def model_labels(image_attrs: dict) -> dict[str, str]:
    """The image's model labels; the checks are reported as not run on an image that bakes no model,
    unless build.py baked one (then the labels' absence is a failure, not a skip)."""
    labels = image_attrs["Config"].get("Labels") or {}
    expected = os.environ.get(GATE_BAKED_DIGEST_VAR)
    if not any(labels.get(name) for name in MODEL_LABELS) and not expected:
        pytest.skip(NOT_BAKED)
    missing = [name for name in MODEL_LABELS if not labels.get(name)]
    assert not missing, f"model labels missing or empty: {missing}"
    if expected:
        assert labels[DIGEST_LABEL] == expected, f"{DIGEST_LABEL} is {labels[DIGEST_LABEL]}, the build baked {expected}"
    return {name: labels[name] for name in MODEL_LABELS}


def _run(launched: Launched, *command: str) -> tuple[int, str, str]:
    result = launched.container.exec_run(list(command), demux=True)
    out, err = (part.decode("utf-8", "replace") if part else "" for part in result.output)
    return result.exit_code, out, err


def _manifest(launched: Launched, labels: dict[str, str]) -> str:
    path = f"{BAKED_DIR}/{labels[NAME_LABEL]}.sha256"
    code, out, err = _run(launched, WORKER_PYTHON, "-I", "-c", f"import sys; sys.stdout.write(open({path!r}).read())")
    assert code == 0, f"no manifest {path} in the image: {err.strip()[-500:]}"
    return out


@pytest.mark.resolution
def test_model_labels_match_manifest(image: ImageUnderTest, image_attrs: dict, model_labels: dict[str, str],
                                     serverless: Launched) -> None:
    manifest = _manifest(serverless, model_labels)
    digest = f"sha256:{hashlib.sha256(manifest.encode('utf-8')).hexdigest()}"
    assert digest == model_labels[DIGEST_LABEL], f"the manifest's sha256 is {digest}, the label says " \
                                                 f"{model_labels[DIGEST_LABEL]}"
    name = model_labels[NAME_LABEL]
    listed = [line.split("  ", 1)[1] for line in manifest.splitlines() if line]
    assert listed and all(item.startswith(f"{name}/") for item in listed), f"manifest names outside {name}/: {listed}"
    code, out, err = _run(serverless, WORKER_PYTHON, "-I", "-c", FILES_PROBE, f"{BAKED_DIR}/{name}")
    assert code == 0, err[-500:]
    sizes = json.loads(out)
    assert str(sum(sizes.values())) == model_labels[SIZE_LABEL], \
        f"the model's files hold {sum(sizes.values())} bytes, {SIZE_LABEL} says {model_labels[SIZE_LABEL]}"
    path = model_labels[PATH_LABEL]
    assert path.removeprefix(f"{BAKED_DIR}/") in {name, *listed}, f"{PATH_LABEL} {path} is not the baked model"
    model_var = image.spec.engine.model_var
    baked_default = config_env(image_attrs).get(model_var)
    assert baked_default == path, f"the image's {model_var} is {baked_default!r}, not the baked {path}"


@pytest.mark.resolution
def test_model_files_pass_sha256sum(model_labels: dict[str, str], serverless: Launched) -> None:
    name = model_labels[NAME_LABEL]
    code, out, err = _run(serverless, "/bin/sh", "-c",
                          f"cd {BAKED_DIR} && sha256sum -c --strict {name}.sha256")
    assert code == 0, f"sha256sum -c --strict {name}.sha256 exited {code}: {(out + err).strip()[-1500:]}"
    code, out, err = _run(serverless, WORKER_PYTHON, "-I", "-c", FILES_PROBE, f"{BAKED_DIR}/{name}")
    assert code == 0, err[-500:]
    listed = {line.split("  ", 1)[1].removeprefix(f"{name}/") for line in _manifest(serverless, model_labels)
              .splitlines() if line}
    unlisted = sorted(set(json.loads(out)) - listed)
    assert not unlisted, f"files in {BAKED_DIR}/{name} the manifest does not list: {unlisted}"


@pytest.mark.serve
def test_engine_serves_the_baked_model(image: ImageUnderTest, model_labels: dict[str, str],
                                       serverless: Launched) -> None:
    model_var = engine_facts.facts(image.spec).model_var
    assert model_var not in serverless_env(image.spec), f"the launch set {model_var}: the baked default did not run"
    assert serverless.ready(READY_TIMEOUT), f"the worker never reported ready:\n{serverless.logs()[-2000:]}"
    code, out, err = _run(serverless, WORKER_PYTHON, "-I", "-c", MODELS_PROBE)
    assert code == 0, f"GET /v1/models on the engine failed: {err.strip()[-1000:]}"
    served = [item.get("id") for item in json.loads(out).get("data", [])]
    assert served == [model_labels[PATH_LABEL]], f"the engine serves {served}, not the baked " \
                                                 f"{model_labels[PATH_LABEL]}"
