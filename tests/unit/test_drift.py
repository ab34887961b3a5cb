"""bakery.upkeep.drift against small local source fixtures (tests/unit/fixtures/drift/): every baked load, error
and stage line is found, declared, or the check fails naming the spec, the variable and the line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bakery.spec.engine_spec import IMAGES_DIR, REPO_ROOT, available_engines, load_engine, load_spec_file
from bakery.upkeep import drift

FIXTURES = Path(__file__).parent / "fixtures" / "drift"
# The pinned versions, read from the specs: a version bump (python -m bakery.upkeep.bump) keeps these tests true.
LLAMA_TAG = load_engine("llama").version
VLLM_TAG = load_engine("vllm").version


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bakery.upkeep.drift", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120, check=False, env=env)


def test_every_llama_line_is_found_where_the_source_prints_it() -> None:
    found = {f.line: f.where for f in drift.check(load_engine("llama"), FIXTURES / "llama")}
    assert found == {
        "model loaded": "tools/server/server.cpp:11",
        "INFO exited: llama": "bakery (the entry point, when the program exits)",
        "error loading model": "src/llama.cpp:3",
        "failed to load model": "src/llama.cpp:4",
        "exiting due to model loading error": "tools/server/server.cpp:8",
        "couldn't bind HTTP server socket": "tools/server/server.cpp:4",
        # SRV_INF puts "load_model: " before the text: each declared pattern reads into load_model and
        # names the line of the call (its group `at`), not the function's header.
        "load_model: loading model": "tools/server/server-context.cpp:4",
        "load_model: initializing": "tools/server/server-context.cpp:8",
    }


def test_declared_origins_and_patterns() -> None:
    findings = {f.line: (f.how, f.where) for f in drift.check(load_engine("vllm"), FIXTURES / "vllm")}
    assert findings == {
        "Application startup complete.": ("origin", "uvicorn"),
        "INFO exited: vllm": ("origin", "bakery (the entry point, when the program exits)"),
        # the exception is built over several lines; the declared pattern spans them
        "RuntimeError: Engine": ("pattern", "vllm/v1/engine/utils.py:4"),
        "Traceback (most recent call last):": ("origin", "python"),
        "Starting to load model": ("literal", "vllm/v1/worker/gpu_model_runner.py:4"),
        "Loading weights took": ("literal", "vllm/model_executor/model_loader/default_loader.py:4"),
        "Model loading took": ("literal", "vllm/v1/worker/gpu_model_runner.py:8"),
    }
    assert run("--engine", "sglang", "--source-dir", str(FIXTURES / "sglang")).returncode == 0


def _spec_with_load_line(tmp_path: Path, line: str) -> Path:
    data = yaml.safe_load((IMAGES_DIR / "llama.yaml").read_text())
    for old in data["bake"]["env"]["MODEL_LOAD_LOG_MSG"]:  # a declaration of a line no longer baked is refused
        data.get("upstream", {}).get("lines", {}).pop(old, None)
    data["bake"]["env"]["MODEL_LOAD_LOG_MSG"] = [line]
    images = tmp_path / "images"
    images.mkdir()
    (images / "llama.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return images


def _assert_gone_literally(proc: subprocess.CompletedProcess, spec_file: str, variable: str, line: str, source: str,
                           file: str | None = None) -> None:
    """The check reported `line` missing and failed on it alone, naming the spec, the variable and where it looked."""
    assert f"MISSING   {line!r}  ({variable}, literal)" in proc.stdout, proc.stdout
    where = f"literally in {file}" if file else "literally"
    assert proc.stderr.strip() == (
        f"bakery.upkeep.drift: {spec_file}: {variable}: {line!r} no longer occurs in {source} ({where}); fix the "
        "line, or declare where it comes from in upstream.lines")


def test_a_line_gone_upstream_fails_by_name(tmp_path: Path) -> None:
    # Quoted only by a test of the engine: not printed by it, so it has drifted.
    images = _spec_with_load_line(tmp_path, "model is ready to serve")
    proc = run("--images-dir", str(images), "--engine", "llama", "--source-dir", str(FIXTURES / "llama"))
    assert proc.returncode == 1
    _assert_gone_literally(proc, f"{images}/llama.yaml", "MODEL_LOAD_LOG_MSG", "model is ready to serve",
                           f"ggml-org/llama.cpp@{LLAMA_TAG}")


def _edited(tmp_path: Path, engine: str, file: str, old: str, new: str) -> Path:
    """A copy of the engine's fixture tree with `old` replaced by `new` in `file`, which must hold it."""
    source = tmp_path / engine
    shutil.copytree(FIXTURES / engine, source)
    path = source / file
    text = path.read_text()
    assert old in text, f"the fixture {file} no longer holds {old!r}: the edit would prove nothing"
    path.write_text(text.replace(old, new))
    return source


def _fails(engine: str, source: Path) -> subprocess.CompletedProcess:
    """The check on `source`, which must find a line gone (exit 1)."""
    proc = run("--engine", engine, "--source-dir", str(source))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return proc


def test_a_source_change_is_caught(tmp_path: Path) -> None:
    source = _edited(tmp_path, "llama", "tools/server/server.cpp", "couldn't bind", "could not bind")
    gone = [f.line for f in drift.check(load_engine("llama"), source) if not f.found]
    assert gone == ["couldn't bind HTTP server socket"]


def test_a_pattern_that_no_longer_matches_names_the_pattern(tmp_path: Path) -> None:
    source = _edited(tmp_path, "vllm", "vllm/v1/engine/utils.py", "Engine core initialization failed",
                     "EngineCore failed to start")
    proc = _fails("vllm", source)
    assert "images/vllm.yaml: MODEL_ERROR_LOG_MSGS: 'RuntimeError: Engine' no longer occurs in " \
           f"vllm-project/vllm@{VLLM_TAG} (pattern 'RuntimeError\\\\(\\\\s*\"Engine core initialization failed')" \
           in proc.stderr, proc.stderr


def test_a_declared_file_is_the_only_place_the_line_counts(tmp_path: Path) -> None:
    # llama.yaml declares "model loaded" in tools/server/server.cpp: the server stops printing it, an example
    # app still logs the same words, and the check must not be fooled by the copy.
    source = _edited(tmp_path, "llama", "tools/server/server.cpp", "model loaded", "model is ready")
    example = source / "examples" / "android" / "Engine.kt"
    example.parent.mkdir(parents=True)
    example.write_text('fun onLoad() { log("model loaded") }\n')
    _assert_gone_literally(_fails("llama", source), "images/llama.yaml", "MODEL_LOAD_LOG_MSG", "model loaded",
                           f"ggml-org/llama.cpp@{LLAMA_TAG}", file="tools/server/server.cpp")


def test_a_declared_file_matches_by_the_end_of_its_path(tmp_path: Path) -> None:
    # sglang.yaml names sglang/srt/entrypoints/http_server.py: the git checkout has it under python/, the
    # wheel at the top; a file that merely ends in the same name (my_http_server.py) is not it.
    wheel = tmp_path / "wheel"
    shutil.copytree(FIXTURES / "sglang" / "python", wheel)
    found = {f.line: f.where for f in drift.check(load_engine("sglang"), wheel)}
    assert found["The server is fired up and ready to roll!"] == "sglang/srt/entrypoints/http_server.py:3"
    impostor = tmp_path / "impostor"
    shutil.copytree(wheel, impostor)  # the same tree, the server under another name
    entrypoints = impostor / "sglang" / "srt" / "entrypoints"
    (entrypoints / "http_server.py").rename(entrypoints / "my_http_server.py")
    gone = [f.line for f in drift.check(load_engine("sglang"), impostor) if not f.found]
    assert gone == ["The server is fired up and ready to roll!"]


def test_a_stage_line_gone_upstream_fails_naming_its_variable(tmp_path: Path) -> None:
    # vLLM's loader stops timing its weights: the time-to-ready split would lose weights_loaded on the CPU
    # runner without a word, so the check must fail on it as on a load line.
    source = _edited(tmp_path, "vllm", "vllm/model_executor/model_loader/default_loader.py", "Loading weights took",
                     "Weights loaded in")
    _assert_gone_literally(_fails("vllm", source), "images/vllm.yaml", "BAKERY_WEIGHTS_LOADED_LOG_MSGS",
                           "Loading weights took", f"vllm-project/vllm@{VLLM_TAG}")


def test_a_stage_call_moved_out_of_load_model_is_gone(tmp_path: Path) -> None:
    # SRV_INF would print the new function's name ("srv  update_slots: initializing"), which the baked
    # "load_model: initializing" no longer matches: the pattern must not reach past load_model's closing brace.
    call = '        SRV_INF("initializing, n_slots = %d\\n", params.n_parallel);\n'
    end_and_next = "        return true;\n    }\n\n    void update_slots() {\n"  # load_model's end, the next function
    source = _edited(tmp_path, "llama", "tools/server/server-context.cpp", call + end_and_next, end_and_next + call)
    found = {f.line: (f.variable, f.where) for f in drift.check(load_engine("llama"), source)}
    assert found["load_model: initializing"] == ("BAKERY_WEIGHTS_LOADED_LOG_MSGS", None)
    assert found["load_model: loading model"] == ("BAKERY_LOAD_BEGIN_LOG_MSGS", "tools/server/server-context.cpp:4")
    proc = _fails("llama", source)
    assert "BAKERY_WEIGHTS_LOADED_LOG_MSGS: 'load_model: initializing' no longer occurs in " \
           f"ggml-org/llama.cpp@{LLAMA_TAG} (pattern " in proc.stderr, proc.stderr
    assert proc.stderr.rstrip().endswith(" in tools/server/server-context.cpp); fix the line, or declare where it "
                                         "comes from in upstream.lines"), proc.stderr


def test_a_spec_without_stage_lines_is_checked_without_them(tmp_path: Path) -> None:
    # The stage lines are optional in a spec: one that bakes none is checked on its load and error lines alone.
    data = yaml.safe_load((IMAGES_DIR / "vllm.yaml").read_text())
    for variable in ("BAKERY_LOAD_BEGIN_LOG_MSGS", "BAKERY_WEIGHTS_LOADED_LOG_MSGS"):
        for line in data["bake"]["env"].pop(variable):
            data["upstream"]["lines"].pop(line, None)
    images = tmp_path / "images"
    images.mkdir()
    (images / "vllm.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    findings = drift.check(load_engine("vllm", images), FIXTURES / "vllm")
    assert {f.variable for f in findings} == {"MODEL_LOAD_LOG_MSG", "MODEL_ERROR_LOG_MSGS"}
    assert all(f.found for f in findings)


def test_fetch_clones_the_pinned_tag(tmp_path: Path) -> None:
    # A local repository stands for GitHub: only the tag the spec pins has the lines.
    git = shutil.which("git")
    if git is None:
        pytest.fail("git is needed for bakery.upkeep.drift --fetch")
    origin = tmp_path / "github" / "ggml-org" / "llama.cpp"
    shutil.copytree(FIXTURES / "llama", origin)

    def sh(*cmd: str) -> None:
        subprocess.run([git, "-c", "user.name=t", "-c", "user.email=t@t", *cmd], cwd=origin, check=True,
                       capture_output=True)

    sh("init", "-q")
    sh("add", "-A")
    sh("commit", "-qm", "pinned")
    sh("tag", LLAMA_TAG)
    (origin / "src" / "llama.cpp").write_text("// the loader's messages moved\n")
    sh("commit", "-qam", "later")
    sh("clone", "-q", "--bare", str(origin), str(origin) + ".git")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), drift.GIT_BASE_VAR: str(tmp_path / "github")}
    proc = run("--engine", "llama", "--fetch", "--workdir", str(tmp_path / "work"), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "found     'error loading model'  src/llama.cpp:3 (literal)" in proc.stdout
    wrong = load_spec_file(IMAGES_DIR / "llama.yaml").model_copy(update={"version": "b9999"})
    with pytest.raises(drift.InputError, match=r"cannot clone .*llama\.cpp\.git at tag 'b9999'"):
        drift.fetch(wrong, tmp_path / "work2")


@pytest.mark.parametrize(("args", "message"), [
    (("--engine", "llama", "--source-dir", "/no/such/dir"),
     "bakery.upkeep.drift: --source-dir /no/such/dir: not a directory "
     f"(a checkout of ggml-org/llama.cpp at {LLAMA_TAG})"),
    (("--all", "--source-dir", "/tmp"), "bakery.upkeep.drift: --source-dir is one engine's checkout: choose exactly "
                                        "one --engine"),
    (("--engine", "tgi", "--source-dir", "/tmp"),
     f"bakery.upkeep.drift: unknown engine 'tgi': choose one of {', '.join(available_engines())} (files in images/)"),
])
def test_bad_input_is_one_line(args: tuple[str, ...], message: str) -> None:
    proc = run(*args)
    assert (proc.returncode, proc.stderr.strip()) == (2, message)
