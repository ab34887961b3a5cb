"""One `docker build` on the local engine (the classic builder) and the one reader of its output stream.

Both the engine images (bakery.build.builder) and the local bases (bakery.bases) build through `build()`,
so a step, a cached step, a failure and the image id are read from the engine's stream in one place.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors

from bakery.docker import engine as docker_engine
from bakery.errors import BuildError

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the classic builder colours RUN's stderr
_SHOWN = 25  # lines of the failing step's output printed with the error


@dataclass(frozen=True)
class BuildResult:
    """What a build produced: the image id, how many steps ran vs came from cache, and the log."""

    image_id: str
    steps: int
    cached_steps: int
    log: list[str]


def read_build_stream(chunks: Iterable[dict[str, Any]], on_step: Callable[[str], None], what: str) -> BuildResult:
    """Read the engine's decoded build stream: count steps (each `Step n/m` line goes to `on_step`) and
    cached steps, keep the log, take the image id from the `aux` record.

    An `error` record is a BuildError naming the failing step; that step's own output, which is what
    explains the failure, is printed to stderr first. An image id of "" means the stream named none.
    """
    log: list[str] = []
    image_id = ""
    steps = cached = 0
    for chunk in chunks:
        if "error" in chunk:
            error = str((chunk.get("errorDetail") or {}).get("message") or chunk["error"]).strip()
            detail = error.splitlines()[-1] if error else "unknown"
            start = next((i for i in range(len(log) - 1, -1, -1) if log[i].startswith("Step ")), None)
            failing = log[start] if start is not None else "the start"
            sys.stderr.write("".join(f"  | {line}\n" for line in log[start or 0:][-_SHOWN:]))
            raise BuildError(f"docker build{what} failed at {failing}: {detail}")
        for raw in _ANSI.sub("", str(chunk.get("stream", ""))).splitlines():
            line = raw.rstrip()
            if not line:
                continue
            log.append(line)
            if line.startswith("Step "):
                steps += 1
                on_step(line)
            elif "Using cache" in line:
                cached += 1
        aux = chunk.get("aux") or {}
        if "ID" in aux:
            image_id = aux["ID"]
    return BuildResult(image_id=image_id, steps=steps, cached_steps=cached, log=log)


def build(context: Path, on_step: Callable[[str], None], *, buildargs: dict[str, str] | None = None,
          tag: str | None = None, labels: dict[str, str] | None = None, dockerfile: str | None = None,
          nocache: bool = False, name: str | None = None, timeout: int = docker_engine.TIMEOUT) -> BuildResult:
    """Build the Dockerfile in `context` as is (offline: never pulls); raises BuildError with the failing step.

    `labels` are added on top of the Dockerfile's (as `docker build --label`); `dockerfile` is a path
    relative to `context` (default: Dockerfile); `name` is what messages call the image (e.g. a base's
    ref). When the stream names no image id, the one `tag` now points at is it.
    """
    what = f" of {name}" if name else ""
    try:
        stream = docker_engine.client(timeout).api.build(
            path=str(context), dockerfile=dockerfile, tag=tag, buildargs=buildargs or {}, labels=labels or None,
            rm=True, forcerm=True, pull=False, nocache=nocache, decode=True)
        result = read_build_stream(stream, on_step, what)
    except BuildError:
        raise
    except docker.errors.APIError as exc:
        raise BuildError(f"docker build{what} failed: {exc.explanation or exc}") from None
    except Exception as exc:  # noqa: BLE001 - the SDK raises several types for engine-side failures
        raise BuildError(f"docker build{what} failed: {exc}") from None
    if not result.image_id and tag:
        result = BuildResult(docker_engine.image_id(tag) or "", result.steps, result.cached_steps, result.log)
    if not result.image_id:
        raise BuildError(f"docker build{what} ended without an image id")
    return result
