"""The verification gate: run the testinfra checks of tests/image/ against one image.

build.py and the test suite run the very same checks: build.py by running pytest on tests/image/
with --bakery-image, the suite by building images itself. A gate that did not run is not a pass.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bakery.paths import GATE_DIR, REPO_ROOT
from bakery.spec.engine_spec import IMAGES_DIR_VAR

# The gate is exactly these checks (the image and its engine; the worker as the platform sees it,
# against the control-plane stand-in); the other files of tests/image/ are tests OF the gate.
GATE_CHECKS = (GATE_DIR / "test_gate.py", GATE_DIR / "test_gate_platform.py", GATE_DIR / "test_gate_contents.py")
# Which checks a base can take: a local base runs everything; a production base (GPU engines) runs
# what needs no engine: the image's configuration and the worker's resolution.
LEVELS = {
    "local": "config or resolution or serve",
    "production": "config or resolution",
    "custom": "config or resolution",
}


@dataclass
class GateResult:
    """Outcome of one gate run: passed only when checks ran and none failed."""

    passed: bool
    ran: int
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    output: str = ""


def run_gate(image_id: str, engine: str, *, variant: str = "local", quiet: bool = False,
             progress: Callable[[str], None] | None = None, extra: list[str] | None = None,
             images_dir: Path | None = None) -> GateResult:
    """Run the gate's checks on `image_id`; returns which checks failed (by name). `images_dir` holds
    the engine's spec when it is not the repository's images/ (the gate reads it from $BAKERY_IMAGES_DIR)."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "gate.xml"
        cmd = [sys.executable, "-m", "pytest", *map(str, GATE_CHECKS), "-p", "no:cacheprovider", "-rN",
               "--bakery-image", image_id, "--bakery-engine", engine, "-m", LEVELS[variant],
               f"--junitxml={junit}", "-o", "junit_family=xunit2", "-q" if quiet else "-v", *(extra or [])]
        start = time.monotonic()
        env = {**os.environ, IMAGES_DIR_VAR: str(images_dir.resolve())} if images_dir else None
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env)
        lines = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if progress and ("::" in line and ("PASSED" in line or "FAILED" in line or "ERROR" in line)):
                progress(line.rstrip().replace(str(GATE_DIR) + "/", ""))
        proc.wait()
        seconds = time.monotonic() - start
        failed, ran = _read_junit(junit)
    passed = proc.returncode == 0 and ran > 0 and not failed
    return GateResult(passed=passed, ran=ran, failed=failed, seconds=seconds, output="".join(lines))


def _read_junit(path: Path) -> tuple[list[str], int]:
    if not path.exists():
        return ["the gate did not run (no report)"], 0
    root = ET.parse(path).getroot()  # noqa: S314 - our own pytest's report
    failed, ran = [], 0
    for case in root.iter("testcase"):
        if case.find("skipped") is not None:
            continue
        ran += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(case.get("name", "?"))
    return failed, ran
