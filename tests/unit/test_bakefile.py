"""The bake file (bakery/release/bakefile.py): every engine's targets, contexts, tags, labels, args, platforms.

No Docker here: the wheelhouse is a stand-in directory. tests/image/test_bakefile.py builds a target
exactly as the file defines it and runs the gate on the result.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from bakery import __version__
from bakery.bases.make import BASES
from bakery.errors import InputError
from bakery.recipe.build_facts import BuildFacts
from bakery.recipe.plan import BuildOptions, every_line, host_platform
from bakery.recipe.render import DEFAULT_RUNTIME_IMAGE
from bakery.recipe.tags import is_release_tag
from bakery.release.bakefile import (
    BASE_DIGEST_LABEL,
    ci_override,
    engine_of,
    load_bake_file,
    local_images,
    main,
    registry_bases,
    target_name,
    write_bake_file,
)
from bakery.spec.engine_spec import available_engines, load_engine
from tests.host_tools import require_buildx

ARGS = {"BAKERY_REVISION": "abc1234def5678900000000000000000000000000", "BAKERY_CREATED": "2026-01-02T03:04:05Z"}
FACTS = BuildFacts(revision=ARGS["BAKERY_REVISION"], created=ARGS["BAKERY_CREATED"])


def plans(specs, **options):
    """Every target's plan, as build.py --bake-file makes them: one per CUDA line of each spec."""
    return [plan for spec in specs for plan in every_line(spec, BuildOptions(**options), FACTS)]


def lines_of(spec) -> tuple:
    """The CUDA lines of a spec, or (None,) for an engine without: one bake target each per platform."""
    return spec.base.cuda_variants or (None,)


@pytest.fixture
def fake_wheelhouse(tmp_path: Path):
    made: dict[str, Path] = {}

    def wheelhouse(platform: str) -> Path:
        directory = tmp_path / "wheels" / platform.replace("/", "-")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"fake-1.0-py3-none-{platform.replace('/', '_')}.whl").write_text("wheel")
        made[platform] = directory
        return directory

    wheelhouse.made = made  # type: ignore[attr-defined]
    return wheelhouse


def write(tmp_path: Path, wheelhouse, *, local: bool, repository: str = "ghcr.io/acme") -> tuple[Path, dict]:
    specs = [load_engine(name) for name in available_engines()]
    path = write_bake_file(plans(specs, local=local, repository=repository), tmp_path / "out" / "docker-bake.json",
                           wheelhouse=wheelhouse, quiet=True)
    return path, load_bake_file(path)


def test_production_file_has_a_target_per_engine_and_platform(tmp_path: Path, fake_wheelhouse) -> None:
    path, bake = write(tmp_path, fake_wheelhouse, local=False)
    # One target per engine, CUDA line and platform; the default line (and a lineless engine) `<engine>-<arch>`.
    expected = {}
    for name in available_engines():
        for line in lines_of(load_engine(name)):
            for p in load_engine(name).base.platforms:
                part = "" if line is None or line.default else f"-cu{line.cuda.replace('.', '')}"
                expected[f"{name}{part}-{p.split('/')[1]}"] = (name, p, line)
    assert set(bake["target"]) == set(expected)
    assert any(line is not None and not line.default for _n, _p, line in expected.values())
    assert bake["group"]["default"] == {"targets": sorted(available_engines())}
    for name, (engine, platform, line) in expected.items():
        assert name in bake["group"][engine]["targets"]
        target = bake["target"][name]
        spec = load_engine(engine)
        assert target["context"] == f"contexts/{name}" and target["dockerfile"] == "Dockerfile"
        assert target["platforms"] == [platform]
        # SOURCE_DATE_EPOCH is the `created` label's time, so BuildKit stamps the config with it too.
        assert target["args"] == {**ARGS, "SOURCE_DATE_EPOCH": "1767323045"}
        assert target["labels"] == {"ai.bakery.variant": "production", "ai.bakery.target": name,
                                    "ai.bakery.bakery-version": __version__,
                                    **({"ai.bakery.cuda.version": line.cuda} if line else {})}
        arch = platform.split("/")[1]
        suffix = f"-cuda{line.cuda}" if line is not None and not line.default else ""
        assert target["tags"] == [f"ghcr.io/acme/{engine}:candidate-{spec.version}-bakery{__version__}-gabc1234"
                                  f"{suffix}-{arch}"]
        assert not any(is_release_tag(t) for t in target["tags"]), "a bake-built image is a candidate, not a release"
        context = path.parent / target["context"]
        dockerfile = (context / "Dockerfile").read_text()
        assert f"FROM {line.image if line else spec.base.image}\n" in dockerfile
        if line is not None:  # the line's floor is baked and labelled, from the driver table
            assert f"BAKERY_CUDA_MIN_DRIVER='{line.min_driver}'" in dockerfile
            assert f"ai.bakery.cuda.min_driver='{line.min_driver}'" in dockerfile
        assert f"FROM {DEFAULT_RUNTIME_IMAGE} AS worker-python" in dockerfile
        for part in ("worker/app/core.py", "context/make-venv.sh", "worker/requirements.txt"):
            assert (context / part).is_file(), part
        wheels = sorted(p.name for p in (context / "wheels").iterdir())
        assert wheels == [f"fake-1.0-py3-none-{platform.replace('/', '_')}.whl"], "only its platform's wheels"


def test_local_file_builds_on_the_local_bases_for_this_machine(tmp_path: Path, fake_wheelhouse) -> None:
    path, bake = write(tmp_path, fake_wheelhouse, local=True, repository="bakery")
    machine = host_platform()
    assert set(bake["target"]) == {target_name(load_engine(name), machine, line) for name in available_engines()
                                   for line in lines_of(load_engine(name))}
    for name, target in bake["target"].items():
        spec = load_engine(engine_of(name, target["labels"].get("ai.bakery.cuda.version")))
        assert target["platforms"] == [machine]
        assert target["labels"]["ai.bakery.variant"] == "local"
        cuda = target["labels"].get("ai.bakery.cuda.version")
        line = spec.base.cuda_variant(cuda)
        suffix = f"-cuda{cuda}" if line is not None and not line.default else ""
        assert target["tags"][0].endswith(f"-gabc1234{suffix}-local-{machine.split('/')[1]}")
        base = BASES[spec.base.local].ref
        assert f"FROM {base}\n" in (path.parent / target["context"] / "Dockerfile").read_text()
        assert local_images(path.parent, target) == [DEFAULT_RUNTIME_IMAGE, base]


def test_paths_are_relative_so_the_directory_travels(tmp_path: Path, fake_wheelhouse) -> None:
    path, bake = write(tmp_path, fake_wheelhouse, local=False)
    moved = tmp_path / "elsewhere"
    shutil.move(str(path.parent), moved)
    for target in bake["target"].values():
        assert not Path(target["context"]).is_absolute()
        assert (moved / target["context"] / target["dockerfile"]).is_file()


def test_the_file_is_plain_json_bake_accepts(tmp_path: Path, fake_wheelhouse) -> None:
    path, _ = write(tmp_path, fake_wheelhouse, local=False)
    data = json.loads(path.read_text())
    assert set(data) == {"group", "target"}
    allowed = {"context", "dockerfile", "args", "tags", "labels", "platforms"}
    for target in data["target"].values():
        assert set(target) <= allowed
        assert all(isinstance(v, str) for v in target["args"].values())
        assert all(isinstance(v, str) for v in target["labels"].values())
    # buildx must accept the file as written (scripts/setup-host installs it; missing fails under CI=true)
    proc = subprocess.run([*require_buildx(), "bake", "-f", path.name, "--print"], cwd=path.parent,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_rewriting_replaces_each_context(tmp_path: Path, fake_wheelhouse) -> None:
    path, _ = write(tmp_path, fake_wheelhouse, local=False)
    stale = path.parent / "contexts" / "vllm-amd64" / "stale.txt"
    stale.write_text("old")
    write(tmp_path, fake_wheelhouse, local=False)
    assert not stale.exists()


def test_bad_input_is_refused(tmp_path: Path, fake_wheelhouse) -> None:
    specs = [load_engine("vllm")]
    with pytest.raises(InputError, match="JSON"):
        write_bake_file(plans(specs), tmp_path / "docker-bake.hcl", wheelhouse=fake_wheelhouse)
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(InputError, match="directory"):
        write_bake_file(plans(specs), tmp_path / "dir.json", wheelhouse=fake_wheelhouse)
    with pytest.raises(InputError, match="--repository"):
        write_bake_file(plans(specs, repository="Acme"), tmp_path / "b.json", wheelhouse=fake_wheelhouse)
    nolocal = specs[0].model_copy(update={"base": specs[0].base.model_copy(update={"local": None})})
    with pytest.raises(InputError, match=r"base\.local"):
        plans([nolocal], local=True)
    with pytest.raises(InputError, match="--base-image does not go with --bake-file"):
        write_bake_file(plans(specs, base_image="example/base:1"), tmp_path / "c.json", wheelhouse=fake_wheelhouse)


def test_ci_override_maps_local_images_and_cache(tmp_path: Path, fake_wheelhouse) -> None:
    path, bake = write(tmp_path, fake_wheelhouse, local=True, repository="bakery")
    name = next(iter(bake["target"]))
    override = ci_override(bake, path.parent, [name], registry="localhost:5000", cache="gha", scope="pr")
    entry = override["target"][name]
    assert entry["contexts"] == {ref: f"docker-image://localhost:5000/{ref}"
                                 for ref in local_images(path.parent, bake["target"][name])}
    assert entry["cache-from"] == [f"type=gha,scope=pr-{name}"]
    assert entry["cache-to"] == [f"type=gha,scope=pr-{name},mode=max,ignore-error=true"]
    registry = ci_override(bake, path.parent, [name], registry=None, cache="ghcr.io/acme/cache")[
        "target"][name]
    assert "contexts" not in registry
    assert registry["cache-from"] == [f"type=registry,ref=ghcr.io/acme/cache:{name}"]
    with pytest.raises(InputError, match="no target"):
        ci_override(bake, path.parent, ["nope-amd64"], registry=None, cache=None)


def test_pin_bases_pins_every_registry_base_and_labels_the_image_with_its_digest(tmp_path: Path,
                                                                                fake_wheelhouse) -> None:
    path, bake = write(tmp_path, fake_wheelhouse, local=False)
    base = load_engine("vllm").base.image
    assert registry_bases(path.parent, bake["target"]["vllm-amd64"]) == ([base], base)
    asked: list[str] = []

    def resolve(ref: str) -> str:
        asked.append(ref)
        return "sha256:" + "7" * 64

    entry = ci_override(bake, path.parent, ["vllm-amd64"], registry="localhost:5000", cache=None,
                        pin_bases=resolve)["target"]["vllm-amd64"]
    assert asked == [base], "each registry base is resolved once; local images are not"
    assert entry["contexts"][base] == f"docker-image://{base}@sha256:{'7' * 64}"
    assert entry["labels"] == {BASE_DIGEST_LABEL: "sha256:" + "7" * 64}
    assert all(v.startswith("docker-image://localhost:5000/") for k, v in entry["contexts"].items() if k != base)


def test_a_base_the_spec_pins_by_digest_keeps_its_digest(tmp_path: Path, fake_wheelhouse) -> None:
    path, bake = write(tmp_path, fake_wheelhouse, local=False)
    base = load_engine("vllm").base.image
    pinned = f"{base}@sha256:{'8' * 64}"
    dockerfile = path.parent / bake["target"]["vllm-amd64"]["context"] / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace(f"FROM {base}", f"FROM {pinned}"))
    override = ci_override(bake, path.parent, ["vllm-amd64"], registry=None, cache=None,
                           pin_bases=lambda ref: pytest.fail(f"{ref} was resolved though it is pinned"))
    entry = override["target"]["vllm-amd64"]
    assert "contexts" not in entry
    assert entry["labels"] == {BASE_DIGEST_LABEL: "sha256:" + "8" * 64}


def test_local_builds_have_no_registry_base_to_pin(tmp_path: Path, fake_wheelhouse) -> None:
    path, bake = write(tmp_path, fake_wheelhouse, local=True, repository="bakery")
    name = next(iter(bake["target"]))
    assert registry_bases(path.parent, bake["target"][name]) == ([], None)
    entry = ci_override(bake, path.parent, [name], registry=None, cache=None,
                        pin_bases=lambda ref: pytest.fail(f"{ref} resolved"))["target"][name]
    assert "labels" not in entry and "contexts" not in entry


def test_ci_command_writes_the_override(tmp_path: Path, fake_wheelhouse) -> None:
    path, _ = write(tmp_path, fake_wheelhouse, local=False)
    out = tmp_path / "ci.json"
    assert main(["ci", "--bake-file", str(path), "--target", "vllm-amd64", "--cache", "gha", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["target"]["vllm-amd64"]["cache-to"][0].startswith("type=gha,")
    assert main(["ci", "--bake-file", str(tmp_path / "missing.json"), "--target", "x", "--out", str(out)]) == 2


def test_build_py_bake_file_option(tmp_path: Path, fake_wheelhouse, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    import bakery.host.wheelhouse
    from bakery.cli import main as build_py

    monkeypatch.setattr(bakery.host.wheelhouse, "wheelhouse", fake_wheelhouse)
    path = tmp_path / "out" / "docker-bake.json"
    assert build_py(["--engine", "vllm", "--engine", "llama", "--bake-file", str(path),
                     "--repository", "ghcr.io/acme"]) == 0
    bake = load_bake_file(path)
    assert bake["group"]["default"] == {"targets": ["llama", "vllm"]}
    vllm_lines = [line.cuda for line in load_engine("vllm").base.cuda_variants if not line.default]
    assert vllm_lines, "vllm carries a CUDA line besides the default"
    others = {f"vllm-cu{c.replace('.', '')}-{a}" for c in vllm_lines for a in ("amd64", "arm64")}
    assert set(bake["target"]) == {"llama-amd64", "llama-arm64", "vllm-amd64", "vllm-arm64", *others}
    path_one = tmp_path / "one" / "docker-bake.json"
    assert build_py(["--engine", "vllm", "--cuda", vllm_lines[0], "--bake-file", str(path_one)]) == 0
    assert set(load_bake_file(path_one)["target"]) == {f"vllm-cu{vllm_lines[0].replace('.', '')}-{a}"
                                                       for a in ("amd64", "arm64")}
    assert "docker buildx bake" in capsys.readouterr().err
    assert build_py(["--engine", "vllm", "--bake-file", str(tmp_path / "b.hcl")]) == 2
