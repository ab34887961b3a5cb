"""The verification gate: run the testinfra checks of tests/image/ against one image.

build.py and the test suite run the very same checks: build.py by running pytest on tests/image/
with --bakery-image, the suite by building images itself. A gate that did not run is not a pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bakery.paths import GATE_DIR, REPO_ROOT
from bakery.spec.engine_spec import IMAGES_DIR_VAR

# The gate is exactly these checks (the image and its engine; the worker as the platform sees it,
# against the control-plane stand-in); the other files of tests/image/ are tests OF the gate.
GATE_CHECKS = (GATE_DIR / "test_gate.py", GATE_DIR / "test_gate_platform.py", GATE_DIR / "test_gate_contents.py",
               GATE_DIR / "test_gate_model.py")
# Which checks a base can take: a local base runs everything; a production base (GPU engines) runs
# what needs no engine: the image's configuration and the worker's resolution. A custom base (a
# team's own, --base-image) runs everything too; its serve checks need the model it serves
# (--base-model) and are reported as not run without one (tests/image/conftest.py skips them).
LEVELS = {
    "local": "config or resolution or serve",
    "production": "config or resolution",
    "custom": "config or resolution or serve",
}
# How the gate's pytest learns which kind of base it checks and the model a custom base serves
# (read by tests/image/launch.py and conftest.py).
GATE_BASE_VAR = "BAKERY_GATE_BASE"
GATE_MODEL_VAR = "BAKERY_GATE_MODEL"
# Where the gate keeps each launch's time to ready by stage (tests/image/stages.py STAGES_FILE_VAR).
GATE_STAGES_VAR = "BAKERY_GATE_STAGES"
# The digest of the model the build baked (build.py --model), so the gate's model checks fail on an image
# that does not carry it (read by tests/image/test_gate_model.py).
GATE_BAKED_DIGEST_VAR = "BAKERY_GATE_BAKED_DIGEST"
# The path of the model the image under test bakes: set by the gate's own conftest from the image's labels
# (tests/image/launch.py), never inherited from whoever runs the gate.
GATE_BAKED_MODEL_VAR = "BAKERY_GATE_BAKED_MODEL"


@dataclass
class GateResult:
    """Outcome of one gate run: passed only when checks ran and none failed."""

    passed: bool
    ran: int
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    output: str = ""
    not_run: list[str] = field(default_factory=list)  # checks that apply to the image but could not run here
    not_run_reasons: dict[str, int] = field(default_factory=dict)  # why (each skip reason, with its count)
    time_to_ready: list[dict[str, Any]] = field(default_factory=list)  # each ready launch's stages (stages.py)


def run_gate(image_id: str, engine: str, *, variant: str = "local", quiet: bool = False,
             progress: Callable[[str], None] | None = None, extra: list[str] | None = None,
             images_dir: Path | None = None, model: str | None = None,
             baked_digest: str | None = None) -> GateResult:
    """Run the gate's checks on `image_id`; returns which checks failed (by name) and which were not
    run. `images_dir` holds the engine's spec when it is not the repository's images/ (the gate reads it
    from $BAKERY_IMAGES_DIR); `model` is the model a custom base serves (build.py --base-model);
    `baked_digest` the digest label of the model the build baked (build.py --model)."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "gate.xml"
        cmd = [sys.executable, "-m", "pytest", *map(str, GATE_CHECKS), "-p", "no:cacheprovider", "-rN",
               "--bakery-image", image_id, "--bakery-engine", engine, "-m", LEVELS[variant],
               f"--junitxml={junit}", "-o", "junit_family=xunit2", "-q" if quiet else "-v", *(extra or [])]
        start = time.monotonic()
        stages_file = Path(tmp) / "stages.jsonl"
        env = {**os.environ, GATE_BASE_VAR: variant, GATE_STAGES_VAR: str(stages_file)}
        env.pop(GATE_MODEL_VAR, None)
        env.pop(GATE_BAKED_DIGEST_VAR, None)
        env.pop(GATE_BAKED_MODEL_VAR, None)
        if baked_digest:
            env[GATE_BAKED_DIGEST_VAR] = baked_digest
        if images_dir:
            env[IMAGES_DIR_VAR] = str(images_dir.resolve())
        if model:
            env[GATE_MODEL_VAR] = model
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
        report = _read_junit(junit)
        time_to_ready = _read_stages(stages_file)
    passed = proc.returncode == 0 and report.ran > 0 and not report.failed
    return GateResult(passed=passed, ran=report.ran, failed=report.failed, seconds=seconds, output="".join(lines),
                      not_run=report.skipped, not_run_reasons=report.skip_reasons, time_to_ready=time_to_ready)


def describe_split(split: dict[str, Any]) -> str:
    """One line of a launch's time to ready: the total, each stage's seconds, bakery's part, what was not seen."""
    parts = ", ".join(f"{stage['to']} +{stage['seconds']:.2f}" for stage in split.get("stages", []))
    missing = f"; not seen: {', '.join(split['missing'])}" if split.get("missing") else ""
    return (f"time to ready [{split.get('launch')}]: {split.get('total', 0):.2f} s ({split.get('from')} -> "
            f"{split.get('to')}: {parts}; bakery's part {split.get('bakery_seconds', 0):.2f} s){missing}")


def _read_stages(path: Path) -> list[dict[str, Any]]:
    """The launches' time-to-ready splits the gate wrote (none when it wrote none), serverless first."""
    if not path.exists():
        return []
    splits = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return sorted(splits, key=lambda split: ("-serverless-" not in str(split.get("launch")), split.get("launch")))


@dataclass
class _Report:
    ran: int = 0
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    skip_reasons: dict[str, int] = field(default_factory=dict)


def _read_junit(path: Path) -> _Report:
    if not path.exists():
        return _Report(failed=["the gate did not run (no report)"])
    root = ET.parse(path).getroot()  # noqa: S314 - our own pytest's report
    report = _Report()
    for case in root.iter("testcase"):
        skipped = case.find("skipped")
        if skipped is not None:
            report.skipped.append(case.get("name", "?"))
            reason = skipped.get("message", "").removeprefix("not run: ")
            report.skip_reasons[reason] = report.skip_reasons.get(reason, 0) + 1
            continue
        report.ran += 1
        if case.find("failure") is not None or case.find("error") is not None:
            report.failed.append(case.get("name", "?"))
    return report
