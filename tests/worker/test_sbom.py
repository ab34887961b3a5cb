"""templates/context/make-sbom.sh, run on the host as the worker-build stage runs it: the SBOM that the
real generator (cyclonedx-bom, installed offline from the hash-pinned wheelhouse) writes for the lean
worker venv lists exactly the distributions that venv holds, and the bundled Python when there is one.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from bakery.host.wheelhouse import SBOM_REQUIREMENTS, wheelhouse
from bakery.release.sbom import INSTALLED_PROBE, sbom_mismatches
from bakery.spec.engine_spec import REPO_ROOT

SCRIPT = REPO_ROOT / "templates" / "context" / "make-sbom.sh"


def run_script(root: Path) -> dict:
    arch = {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}[platform.machine()]
    env = {**os.environ, "BAKERY_WHEELS": str(wheelhouse(arch)), "BAKERY_SBOM_REQUIREMENTS": str(SBOM_REQUIREMENTS)}
    proc = subprocess.run(["/bin/sh", str(SCRIPT), str(root)], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((root / "sbom.cdx.json").read_text())


def installed(python: Path) -> dict[str, str]:
    out = subprocess.run([str(python), "-I", "-c", INSTALLED_PROBE], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_the_sbom_lists_exactly_the_worker_venv(worker_venv: Path, tmp_path: Path) -> None:
    root = tmp_path / "opt-bakery"
    root.mkdir()
    (root / "venv").symlink_to(worker_venv)
    sbom = run_script(root)
    have = installed(root / "venv" / "bin" / "python")
    assert len(have) >= 15 and "vastai" in have
    assert sbom_mismatches(sbom, have) == []
    assert not any(c["name"] == "cpython" for c in sbom["components"]), "no bundled Python here"
    # Nothing of the generator leaked into the SBOM (it runs from its own throwaway venv).
    assert not any("cyclonedx" in c["name"] for c in sbom["components"])
    # The check fires on a venv that differs from the SBOM.
    assert sbom_mismatches(sbom, {**have, "extra-dist": "1.0"}) == ["installed but not in the SBOM: extra-dist==1.0"]


def test_a_bundled_python_is_a_component(worker_venv: Path, tmp_path: Path) -> None:
    root = tmp_path / "opt-bakery"
    (root / "python" / "bin").mkdir(parents=True)
    (root / "venv").symlink_to(worker_venv)
    (root / "python" / "bin" / "python3").symlink_to(sys.executable)
    sbom = run_script(root)
    bundled = [c for c in sbom["components"] if c["name"] == "cpython"]
    assert bundled == [{"type": "application", "bom-ref": f"bundled-cpython@{platform.python_version()}",
                        "name": "cpython", "version": platform.python_version(),
                        "purl": f"pkg:generic/cpython@{platform.python_version()}",
                        "description": "the Python bundled at /opt/bakery/python"}]
    assert sbom_mismatches(sbom, installed(root / "venv" / "bin" / "python")) == []
