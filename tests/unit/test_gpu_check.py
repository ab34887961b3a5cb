"""scripts/gpu-check's argument handling and its reading of the driver (no Docker, no GPU needed)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

import pytest

from bakery.paths import REPO_ROOT

_LOADER = importlib.machinery.SourceFileLoader("gpu_check", str(REPO_ROOT / "scripts" / "gpu-check"))
_SPEC = importlib.util.spec_from_loader("gpu_check", _LOADER)
assert _SPEC is not None
gpu_check = importlib.util.module_from_spec(_SPEC)
_LOADER.exec_module(gpu_check)


@pytest.mark.parametrize(("argv", "names"), [
    (["--timeout", "0"], "--timeout"),
    (["--answer-timeout", "-1"], "--answer-timeout"),
    (["--pull-timeout", "0"], "--pull-timeout"),
    (["--model-dir", "/nonexistent/model"], "--model-dir"),
    (["--cuda", "11.0"], "--cuda 11.0"),
    (["--repository", "Not A Repo"], "--repository"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], names: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"gpu-check: {names}") and "\n" not in err and "Traceback" not in err


def test_the_default_image_is_the_lines_build_py_tag() -> None:
    args = gpu_check.parse_args([])
    assert gpu_check.default_image(args).endswith("-cuda13.0")
    assert gpu_check.default_image(gpu_check.parse_args(["--cuda", "12.9", "--repository", "ghcr.io/acme"])) \
        .startswith("ghcr.io/acme/vllm:")


def test_the_host_driver_is_read_as_the_entry_point_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    banner = tmp_path / "version"
    banner.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (x)\n")
    monkeypatch.setattr(gpu_check, "PROC_VERSION", banner)
    monkeypatch.setattr(gpu_check.shutil, "which", lambda _name: None)
    assert gpu_check.host_driver()[0] == "580.65.06"
    monkeypatch.setattr(gpu_check, "PROC_VERSION", tmp_path / "absent")
    assert gpu_check.host_driver()[0] is None


@pytest.mark.parametrize(("line", "host", "no_gpu", "ok"), [
    ("bakery: driver check: NVIDIA driver 580.65.06 (/proc/driver/nvidia/version) meets CUDA 13.0's minimum 580",
     "580.65.06", False, True),
    ("bakery: driver check: NVIDIA driver 575.1 (/proc/driver/nvidia/version) meets CUDA 12.9's minimum 525",
     "580.65.06", False, False),  # the container read another driver than the host has
    ("bakery: driver check: no /proc/driver/nvidia/version (no NVIDIA driver visible ...); CUDA 13.0 needs ...",
     "580.65.06", False, False),  # --gpus all gave the container no driver
    ("bakery: driver check: no /proc/driver/nvidia/version (no NVIDIA driver visible ...)", None, True, True),
    ("bakery: refused: NVIDIA driver 535.1 is below 580, ...", "535.1", False, False),
    (None, "580.65.06", False, False),
])
def test_the_driver_line(line: str | None, host: str | None, no_gpu: bool, ok: bool) -> None:
    assert gpu_check.check_driver_line(line, host, no_gpu)[0] is ok
