"""Build a rendered image on the local Docker engine, offline, with progress; returns the image id.

The image is built untagged: only the verification gate's pass gives it a release tag (tags.py),
so a failed build or a failed gate can never leave a half-tagged image behind.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bakery.docker_engine import client
from bakery.errors import BuildError, InputError
from bakery.paths import REPO_ROOT, cache_path
from bakery.render import Rendered, write_context
from bakery.wheelhouse import wheelhouse

Progress = Callable[[str], None]
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the classic builder colours RUN's stderr


@dataclass(frozen=True)
class BuildResult:
    """What a build produced: the image id, how many steps ran vs came from cache, and the log."""

    image_id: str
    steps: int
    cached_steps: int
    log: list[str]


def git_revision() -> str:
    """The repo's commit (with -dirty when the tree has changes), for the revision label."""
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO_ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("-dirty" if dirty else "")


def source_date() -> str:
    """The image's `created` label: SOURCE_DATE_EPOCH when set, else the commit's time, else now.

    Tied to the source rather than the clock (the reproducible-builds convention), so rebuilding one
    checkout reuses every layer and yields the same image; Docker's own Created field stays the
    build's time.
    """
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not epoch:
        try:
            epoch = subprocess.run(["git", "log", "-1", "--format=%ct"], cwd=REPO_ROOT, capture_output=True,
                                   text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            epoch = ""
    try:
        when = dt.datetime.fromtimestamp(int(epoch), dt.UTC) if epoch else dt.datetime.now(dt.UTC)
    except (ValueError, OverflowError, OSError):
        raise InputError(f"SOURCE_DATE_EPOCH={epoch!r} is not a Unix time in seconds: unset it or fix it") from None
    return when.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def build_args() -> dict[str, str]:
    """Build-time facts that reach the labels (never secrets: build args show in image history)."""
    return {"BAKERY_REVISION": git_revision(), "BAKERY_CREATED": source_date()}


def context_dir(name: str) -> Path:
    """Where the build context for `name` is laid out."""
    return cache_path("contexts", name)


def build_context(context: Path, progress: Progress, buildargs: dict[str, str] | None = None,
                  tag: str | None = None, labels: dict[str, str] | None = None,
                  dockerfile: str | None = None) -> BuildResult:
    """Build the Dockerfile in `context` as is; raises BuildError with the failing step.

    `labels` are added on top of the Dockerfile's (as `docker build --label`); `dockerfile` is a path
    relative to `context` (default: Dockerfile), as a bake file's target gives them.
    """
    log: list[str] = []
    image_id = ""
    steps = cached = 0
    try:
        stream = client().api.build(path=str(context), buildargs=buildargs or {}, tag=tag, rm=True,
                                    forcerm=True, pull=False, decode=True, labels=labels or None,
                                    dockerfile=dockerfile)
        for chunk in stream:
            if "error" in chunk:
                detail = chunk["error"].strip().splitlines()[-1] if chunk["error"].strip() else "unknown"
                last_step = next((line for line in reversed(log) if line.startswith("Step ")), "")
                # The failing step's own output is what explains the failure: always show it.
                tail = log[next((i for i in range(len(log) - 1, -1, -1) if log[i].startswith("Step ")), 0):]
                sys.stderr.write("".join(f"  | {line}\n" for line in tail[-25:]))
                raise BuildError(f"docker build failed at {last_step or 'the start'}: {detail}")
            text = _ANSI.sub("", chunk.get("stream", ""))
            for raw in text.splitlines():
                line = raw.rstrip()
                if not line:
                    continue
                log.append(line)
                if line.startswith("Step "):
                    steps += 1
                    progress(line)
                elif "Using cache" in line:
                    cached += 1
            aux = chunk.get("aux") or {}
            if "ID" in aux:
                image_id = aux["ID"]
    except BuildError:
        raise
    except Exception as exc:  # noqa: BLE001 - the SDK raises several types for engine-side failures
        raise BuildError(f"docker build failed: {exc}") from None
    if not image_id:
        raise BuildError("docker build ended without an image id")
    return BuildResult(image_id=image_id, steps=steps, cached_steps=cached, log=log)


def build_image(rendered: Rendered, progress: Progress, platform: str = "linux/amd64") -> BuildResult:
    """Lay out the context for `rendered` and build it (untagged)."""
    context = write_context(rendered, context_dir(rendered.spec.name), wheelhouse(platform))
    return build_context(context, progress, build_args())
