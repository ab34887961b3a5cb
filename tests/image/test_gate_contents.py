"""The gate, on what the image carries and one route beyond the default: its SBOM agrees with the worker's
venv, bakery's own files are safe to run as root, and the spec's non-default route (base.local_route)
serves signed requests. Each test is one named check; build.py reports the names of the ones that fail.

The SBOM and hygiene checks read the shared serverless container (no engine needed: `resolution`); the
route check has its own launch, started with the other side launches so its wait overlaps theirs.
"""

from __future__ import annotations

import json
import stat
from typing import Any

import pytest

from bakery.release.sbom import INSTALLED_PROBE, SBOM_PATH, sbom_mismatches
from bakery.spec import engine_facts
from tests.image.conftest import READY_TIMEOUT, ImageUnderTest, SideLaunches
from tests.image.launch import WORKER_PYTHON, Launched, is_ready_report

# What bakery writes into an image and a running container: the worker's Python, venv, code and SBOM
# (/opt/bakery, COPY'd by templates/base.Dockerfile.j2), its working and state directory
# (/var/lib/bakery, WORKDIR) and the entry point's run directory (/run/bakery). The base's own files
# (e.g. Debian's setuid su and passwd, its sticky /tmp) are the pinned base's, not ours.
BAKERY_PATHS = ("/opt/bakery", "/var/lib/bakery", "/run/bakery")
OWNED_BY_ROOT = "/opt/bakery"
# Walks the given roots with lstat (symlinks are not followed, and their modes mean nothing), printing
# one JSON object per path: mode and owner. Run with the worker's Python, so no find(1) is needed.
WALK_PROBE = """
import json, os, sys
for root in sys.argv[1:]:
    if not os.path.lexists(root):
        continue
    for top, dirs, files in os.walk(root):
        for name in [None, *files, *dirs]:
            path = top if name is None else os.path.join(top, name)
            if name is not None and name in dirs and not os.path.islink(path):
                continue  # a directory is listed once, as its own walk's top
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue  # removed meanwhile (the worker is running)
            print(json.dumps({"path": path, "mode": st.st_mode, "uid": st.st_uid, "gid": st.st_gid}))
"""


def exec_json(launched: Launched, *command: str) -> str:
    """Run `command` in the container; its stdout (the check fails on a non-zero exit)."""
    result = launched.container.exec_run(list(command), demux=True)
    out, err = (part.decode("utf-8", "replace") if part else "" for part in result.output)
    assert result.exit_code == 0, f"{command[0]} exited {result.exit_code}: {err[-2000:]}"
    return out


def walk(launched: Launched, *roots: str) -> list[dict[str, Any]]:
    """Every path under `roots` inside the container, with its lstat mode and owner."""
    out = exec_json(launched, WORKER_PYTHON, "-I", "-c", WALK_PROBE, *roots)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def hygiene_problems(entries: list[dict[str, Any]]) -> list[str]:
    """setuid/setgid files and world-writable paths (symlinks aside; no sticky-directory exception:
    bakery makes no shared scratch directory)."""
    problems = []
    for entry in entries:
        mode = entry["mode"]
        if stat.S_ISLNK(mode):
            continue
        if mode & (stat.S_ISUID | stat.S_ISGID) and not stat.S_ISDIR(mode):
            problems.append(f"{entry['path']}: setuid/setgid ({stat.filemode(mode)})")
        if mode & stat.S_IWOTH:
            problems.append(f"{entry['path']}: world-writable ({stat.filemode(mode)})")
    return problems


def writable_by_others(entries: list[dict[str, Any]]) -> list[str]:
    """Paths a non-root user could change: not owned by root, or group/other-writable (symlinks: owner only)."""
    problems = []
    for entry in entries:
        mode = entry["mode"]
        if entry["uid"] != 0:
            problems.append(f"{entry['path']}: owned by uid {entry['uid']}")
        elif not stat.S_ISLNK(mode) and mode & (stat.S_IWGRP | stat.S_IWOTH):
            problems.append(f"{entry['path']}: group/other-writable ({stat.filemode(mode)})")
    return problems


# ---- what the image carries (the shared container, no engine needed) -----------------------------


@pytest.mark.resolution
def test_sbom_lists_exactly_the_worker_venv(serverless: Launched) -> None:
    sbom_text = serverless.file_text(SBOM_PATH)
    assert sbom_text, f"{SBOM_PATH} is missing (templates/context/make-sbom.sh did not run)"
    sbom = json.loads(sbom_text)
    # -I: the venv's own view, not whatever PYTHONPATH or the working directory would add.
    installed = json.loads(exec_json(serverless, WORKER_PYTHON, "-I", "-c", INSTALLED_PROBE))
    assert installed, "the worker's venv lists no distribution"
    problems = sbom_mismatches(sbom, installed)
    assert problems == [], "the SBOM disagrees with the worker's venv:\n" + "\n".join(problems)


@pytest.mark.resolution
def test_bakery_files_add_no_setuid_or_world_writable(serverless: Launched) -> None:
    entries = walk(serverless, *BAKERY_PATHS)
    assert any(e["path"].startswith(OWNED_BY_ROOT + "/") for e in entries), f"nothing found under {OWNED_BY_ROOT}"
    problems = hygiene_problems(entries)
    assert problems == [], "\n".join(problems)


@pytest.mark.resolution
def test_worker_files_writable_by_root_only(serverless: Launched) -> None:
    # The worker runs as root from /opt/bakery: a file there another user could change is a way in.
    entries = walk(serverless, OWNED_BY_ROOT)
    assert entries, f"nothing found under {OWNED_BY_ROOT}"
    problems = writable_by_others(entries)
    assert problems == [], "a non-root user could change:\n" + "\n".join(problems)


# ---- one non-default route (the spec's base.local_route) ------------------------------------------


@pytest.mark.serve
def test_local_route_served_signed(image: ImageUnderTest, side: SideLaunches) -> None:
    route = engine_facts.facts(image.spec).local_route
    if route is None:
        pytest.skip(f"images/{image.engine}.yaml sets no base.local_route: no non-default route to prove")
    launched = side.get("route")
    # Ready as the platform sees it, with only this route served and benchmarked.
    assert launched.ready(READY_TIMEOUT), \
        f"no ready report serving only {route.route}: {launched.reports()[-3:]}\n{launched.logs()[-3000:]}"
    report = next(r for r in launched.reports() if is_ready_report(r))
    assert float(report["loadtime"]) > 0 and float(report["max_perf"]) > 0, report
    result = json.loads(launched.controlplane_cli("post", "--route", route.route,
                                                  "--payload", json.dumps(route.payload)))
    assert result["status"] == 200, f"signed {route.route} answered {result['status']}: {str(result)[:2000]}"
    body = result["json"]
    assert isinstance(body, dict), f"{route.route} answered no JSON object: {str(result)[:2000]}"
    if route.embedding_dimension is not None:
        vectors = [item.get("embedding") for item in body.get("data") or [] if isinstance(item, dict)]
        assert vectors, f"no embedding in the answer: {str(body)[:2000]}"
        sizes = {len(v) if isinstance(v, list) else None for v in vectors}
        assert sizes == {route.embedding_dimension}, \
            f"vectors of sizes {sizes}, the model's dimension is {route.embedding_dimension}"
        assert all(isinstance(x, (int, float)) for v in vectors for x in v), "an embedding holds a non-number"
