"""CUDA lines in the spec (issue 54): the driver table, each line's floor, and the one-line refusals."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from bakery.spec import cuda
from bakery.spec.engine_spec import IMAGES_DIR, available_engines, load_engine, load_spec_file
from tests.unit.test_spec import error_of  # the one-line refusal reader every spec test uses

# The engines whose spec lists CUDA lines, and those that do not, read from the specs themselves.
WITH_LINES = [name for name in available_engines() if load_engine(name).base.cuda_lines]
WITHOUT_LINES = [name for name in available_engines() if not load_engine(name).base.cuda_lines]


def two_lines(default_last: bool = False) -> list[dict]:
    """Two lines for a spec made here: 12.4 (own base) and 13.1 (default), in either order."""
    lines = [{"cuda": "13.1", "default": True}, {"cuda": "12.4", "image": "example.org/acme/engine:1.0-cu124"}]
    return lines[::-1] if default_last else lines


def spec_file(tmp_path: Path, name: str, change) -> Path:
    data = yaml.safe_load((IMAGES_DIR / f"{name}.yaml").read_text())
    change(data)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize(("version", "floor"), [("13.0", 580), ("13.2", 580), ("12.9", 525), ("12.0", 525),
                                                ("11.8", 450)])
def test_the_floor_comes_from_the_table_by_major(version: str, floor: int) -> None:
    assert cuda.min_driver(version) == floor == cuda.MIN_DRIVER[int(version.split(".")[0])]


@pytest.mark.parametrize("version", ["14.0", "10.2", "12.10", "12", "12.9.1", "v12.9", "12.09", ""])
def test_a_version_outside_the_table_is_refused(version: str) -> None:
    with pytest.raises(ValueError, match="CUDA"):
        cuda.min_driver(version)


def test_some_engine_carries_cuda_lines_and_some_none() -> None:
    assert WITH_LINES and WITHOUT_LINES  # a GPU engine with lines, a CPU one without


@pytest.mark.parametrize("name", WITH_LINES)
def test_each_line_resolves_its_base_and_floor(name: str) -> None:
    spec = load_engine(name)
    variants = spec.base.cuda_variants
    assert [v.default for v in variants].count(True) == 1 and variants[0].default
    assert variants[0].image == spec.base.image  # the default line's base is stated once
    for variant, line in zip(variants, sorted(spec.base.cuda_lines, key=lambda item: not item.default),
                             strict=True):
        assert variant.cuda == line.cuda
        assert variant.min_driver == cuda.min_driver(line.cuda)
        assert variant.image == (line.image or spec.base.image)
        assert spec.version in variant.image  # every line's base is the pinned release's
    assert len({v.image for v in variants}) == len(variants)


@pytest.mark.parametrize("name", WITHOUT_LINES)
def test_an_engine_without_lines_has_no_variant(name: str) -> None:
    spec = load_engine(name)
    assert spec.base.cuda_variants == () and spec.base.cuda_variant(None) is None
    with pytest.raises(ValueError, match="no CUDA lines"):
        spec.base.cuda_variant("12.9")


@pytest.mark.parametrize("default_last", [False, True])
def test_lines_in_either_order_put_the_default_first(tmp_path: Path, default_last: bool) -> None:
    name = WITHOUT_LINES[0]
    spec = load_spec_file(spec_file(tmp_path, name, lambda d: d["base"].update(cuda_lines=two_lines(default_last))))
    assert [(v.cuda, v.min_driver, v.default) for v in spec.base.cuda_variants] == [("13.1", 580, True),
                                                                                   ("12.4", 525, False)]
    assert spec.base.cuda_variant(None).cuda == "13.1"
    assert spec.base.cuda_variant("12.4").image == "example.org/acme/engine:1.0-cu124"
    with pytest.raises(ValueError, match=re.escape("choose one of 13.1, 12.4")):
        spec.base.cuda_variant("12.9")


def _set(lines: list[dict]):
    return lambda d: d["base"].update(cuda_lines=lines)


@pytest.mark.parametrize(("lines", "expected"), [
    ([{"cuda": "14.0", "default": True}],
     "base.cuda_lines.0.cuda: CUDA 14.0 is not in bakery's driver table (bakery/spec/cuda.py:"),
    ([{"cuda": "12.9", "default": True}, {"cuda": "13.0", "default": True}],
     "base.cuda_lines: exactly one line must be default: true (the one base.image is); 2 are (12.9, 13.0)"),
    ([{"cuda": "12.9", "image": "example.org/a/b:1-cu129"}],
     "base.cuda_lines: exactly one line must be default: true (the one base.image is); none is"),
    ([{"cuda": "13.0", "default": True}, {"cuda": "12.9"}],
     "base.cuda_lines.1: image: missing: line 12.9 is not the default, so it needs its own upstream base"),
    ([{"cuda": "13.0", "default": True, "image": "example.org/a/b:1"}],
     "base.cuda_lines.0: image: the default line's base is base.image; remove image from line 13.0"),
    ([{"cuda": "13.0", "default": True}, {"cuda": "12.9", "image": "example.org/a/b"}],
     "base.cuda_lines.1.image: 'example.org/a/b': pin the line's base by its upstream tag"),
    ([{"cuda": "13.0", "default": True}, {"cuda": "13.0", "image": "example.org/a/b:2"}],
     "base.cuda_lines: CUDA 13.0 is listed twice"),
    ([{"cuda": 12.9, "default": True}], "base.cuda_lines.0.cuda: must be a string"),
])
def test_bad_lines_are_one_line_naming_file_and_key(tmp_path: Path, lines: list[dict], expected: str) -> None:
    name = (WITH_LINES or WITHOUT_LINES)[0]
    message = error_of(spec_file(tmp_path, name, _set(lines)))
    assert message.startswith(f"{tmp_path}/{name}.yaml: {expected}"), message


def test_build_py_exits_2_on_a_bad_line(tmp_path: Path) -> None:
    from bakery.cli import main

    name = WITHOUT_LINES[0]
    spec_file(tmp_path, name, _set([{"cuda": "12.9", "default": True}, {"cuda": "13.0", "default": True}]))
    assert main(["--images-dir", str(tmp_path), "--engine", name, "--show"]) == 2


def _show_json(*args: str) -> list[dict]:
    import json
    import subprocess
    import sys

    from bakery.paths import REPO_ROOT

    proc = subprocess.run([sys.executable, "build.py", *args, "--show", "--json"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_show_json_lists_every_line_and_its_floor() -> None:
    shown = {item["engine"]: item for item in _show_json("--all")}
    assert set(shown) == set(available_engines())
    for name, item in shown.items():
        variants = load_engine(name).base.cuda_variants
        assert [(line["cuda"], line["min_driver"], line["base"], line["default"]) for line in item["cuda_lines"]] == \
            [(v.cuda, v.min_driver, v.image, v.default) for v in variants]
        for line in item["cuda_lines"]:
            assert line["driver_source"] == cuda.DRIVER_SOURCE
            assert all(f"-cuda{line['cuda']}" in tag for tag in line["tags"] if "-cuda" in tag)
            assert any(tag.endswith(f":{load_engine(name).version}-cuda{line['cuda']}") for tag in line["tags"])
        default = variants[0] if variants else None
        assert item["cuda"] == (default.cuda if default else None)
        assert item["env"].get(cuda.MIN_DRIVER_VAR) == (str(default.min_driver) if default else None)


def test_show_text_and_json_follow_cuda_and_another_images_dir(tmp_path: Path) -> None:
    name = WITHOUT_LINES[0]
    spec_file(tmp_path, name, lambda d: d["base"].update(cuda_lines=two_lines(default_last=True)))
    item = _show_json("--images-dir", str(tmp_path), "--engine", name, "--cuda", "12.4")[0]
    assert (item["cuda"], item["min_driver"], item["production_base"]) == ("12.4", 525,
                                                                         "example.org/acme/engine:1.0-cu124")
    assert [line["cuda"] for line in item["cuda_lines"]] == ["13.1", "12.4"]  # the default first
    assert item["env"][cuda.VERSION_VAR] == "12.4"
    from bakery.recipe.show import show

    text = show(load_spec_file(tmp_path / f"{name}.yaml"), cuda="12.4")
    assert "production base: example.org/acme/engine:1.0-cu124" in text
    assert "12.4  driver >= 525" in text and "13.1  driver >= 580" in text
    assert "BAKERY_CUDA_MIN_DRIVER=525" in text
