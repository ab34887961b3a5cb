"""The boot's driver check (issue 54): the version file's parser, the decision, and the entry point's refusal
with driver files of several versions supplied through BAKERY_DRIVER_VERSION_FILE."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bakery.paths import REPO_ROOT
from bakery.recipe.render import baked_env
from bakery.spec.engine_spec import available_engines, load_engine

sys.path.insert(0, str(REPO_ROOT / "worker" / "boot"))
import driver  # the boot's own module (standard library only), by path as the image runs it

PROPRIETARY = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  {v}  Sat Aug 19 01:15:15 UTC 2023\n"
               "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
OPEN = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {v}  Release Build  (dvs-builder@U16)  Mon\n"
# Every CUDA line the specs carry, with its baked variables: the check is held to what images bake.
LINES = [(name, line) for name in available_engines() for line in load_engine(name).base.cuda_variants]


@pytest.mark.parametrize("banner", [PROPRIETARY, OPEN])
@pytest.mark.parametrize("version", ["535.104.05", "580.65.06", "470.256.02", "525.60.13", "1000.1"])
def test_the_banner_gives_the_version(banner: str, version: str) -> None:
    assert driver.parse_version(banner.format(v=version)) == version


@pytest.mark.parametrize("text", ["", "GCC version: 12.2.0\n", "NVRM version: NVIDIA UNIX Kernel Module\n",
                                  "535.104.05\n"])
def test_no_version_is_none(text: str) -> None:
    assert driver.parse_version(text) is None


@pytest.mark.parametrize(("version", "floor", "start"), [("579.99.99", 580, False), ("580.0", 580, True),
                                                          ("524.1.2", 525, False), ("525.60.13", 525, True),
                                                          ("610.1.1", 580, True)])
def test_only_a_driver_below_the_floor_is_refused(version: str, floor: int, start: bool) -> None:
    verdict = driver.decide(version, f"NVIDIA driver {version}", "13.0", floor)
    assert verdict.start is start
    assert "\n" not in verdict.line and version in verdict.line and str(floor) in verdict.line
    assert verdict.line.startswith("bakery: refused:" if not start else "bakery: driver check:")


def test_an_unreadable_host_or_an_image_without_a_line_always_starts(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver.shutil, "which", lambda _name: None)  # no nvidia-smi either, as on a CPU host
    version, found = driver.read_version(tmp_path / "missing")
    assert version is None and "no NVIDIA driver visible" in found
    assert driver.decide(version, found, "13.0", 580).start
    assert "not checked" in driver.decide(version, found, "13.0", 580).line
    assert driver.decide("400.1", "NVIDIA driver 400.1", None, None).start
    garbled = tmp_path / "version"
    garbled.write_text("something else\n")
    assert driver.read_version(garbled) == (None, f"{garbled} states no driver version")


def fake_smi(tmp_path: Path, body: str) -> str:
    """A stand-in for nvidia-smi (no GPU here): a shell script whose body answers the driver query."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{body}\n")
    smi.chmod(0o755)
    return str(smi)


@pytest.mark.parametrize(("version", "start"), [("579.99.99", False), ("580.65.06", True), ("1000.1", True)])
def test_without_the_file_nvidia_smi_is_asked(tmp_path: Path, version: str, start: bool) -> None:
    smi = fake_smi(tmp_path, f'[ "$1" = "--query-gpu=driver_version" ] && echo "{version}"\necho "{version}"')
    read, found = driver.read_version(tmp_path / "missing", smi=smi)
    assert read == version and "nvidia-smi" in found and f"no {tmp_path / 'missing'}" in found
    assert driver.decide(read, found, "13.0", 580).start is start


@pytest.mark.parametrize("body", ["exit 9", "echo 'NVIDIA-SMI has failed'", "echo ''", "sleep 30"])
def test_an_nvidia_smi_that_states_nothing_never_refuses(tmp_path: Path, body: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "SMI_TIMEOUT", 0.5)  # the hung one is cut at the bound
    read, found = driver.read_version(tmp_path / "missing", smi=fake_smi(tmp_path, body))
    assert read is None and "nvidia-smi" in found
    assert driver.decide(read, found, "13.0", 580).start


def _boot(tmp_path: Path, name: str, line, driver_text: str | None, serverless: bool = False):
    """Run the entry point on this host with `line`'s baked variables and a driver file of our own."""
    tmp_path.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BAKERY_", "MODEL_"))}
    env.update(baked_env(load_engine(name), cuda=line.cuda))
    log = tmp_path / "engine.log"
    marker = tmp_path / "engine-started"
    env.update({"MODEL_LOG": str(log), "BAKERY_RUN_DIR": str(tmp_path / "run"),
                "BAKERY_ENGINE_CMD": f'["/bin/sh", "-c", "touch {marker}"]', "BAKERY_ENGINE_ARGS_VAR": "",
                "SERVERLESS": "true" if serverless else "false"})
    path = tmp_path / "version"
    if driver_text is not None:
        path.write_text(driver_text)
    env["BAKERY_DRIVER_VERSION_FILE"] = str(path)
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "worker" / "boot" / "entrypoint.py")], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    return proc, (log.read_text() if log.exists() else ""), marker.exists()


@pytest.mark.parametrize(("name", "line"), LINES, ids=[f"{n}-{line.cuda}" for n, line in LINES])
def test_the_entry_point_refuses_below_the_floor_and_starts_at_it(tmp_path: Path, name: str, line) -> None:
    below = f"{line.min_driver - 1}.99.01"
    proc, log, started = _boot(tmp_path / "below", name, line, PROPRIETARY.format(v=below))
    assert proc.returncode == 3 and not started, proc.stderr
    refusal = [entry for entry in proc.stderr.splitlines() if entry.startswith("bakery: refused:")]
    assert len(refusal) == 1 and below in refusal[0] and str(line.min_driver) in refusal[0] and line.cuda in refusal[0]
    assert refusal[0] in log and f"INFO exited: {name} (exit status 3;" in log  # a baked error line
    assert any(log_line.startswith(f"INFO exited: {name}") for log_line in log.splitlines())
    proc, log, started = _boot(tmp_path / "at", name, line, OPEN.format(v=f"{line.min_driver}.10.02"))
    assert proc.returncode == 0 and started, proc.stderr
    assert f"meets CUDA {line.cuda}'s minimum {line.min_driver}" in proc.stdout
    proc, log, started = _boot(tmp_path / "none", name, line, None)
    assert proc.returncode == 0 and started, proc.stderr
    assert "no NVIDIA driver visible" in proc.stdout and "not checked" in proc.stdout
