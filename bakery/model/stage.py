"""Put a baked model into a build context: `model/<name>/...` and `model/<name>.sha256`, which the
Dockerfile copies in one step (`COPY model/ /models/baked/`).

A file is hard-linked when the context is on its file system (no byte is copied), else copied in
CHUNK-sized pieces and hashed on the way, so a file that changed since the manifest was made is caught
here rather than baked under a digest it no longer has. No file is ever read whole.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from bakery.errors import BuildError
from bakery.model.manifest import CHUNK, BakedModel

CONTEXT_DIR = "model"  # the directory of the build context the Dockerfile's COPY reads
# Errors of os.link that mean "copy instead": another file system, a file system without hard links,
# a file the kernel's protected_hardlinks keeps from being linked by this user.
_NO_LINK = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES})


@dataclass(frozen=True)
class Staged:
    """How the files reached the context: how many were linked and how many copied."""

    linked: int
    copied: int


def copy_streamed(source: Path, target: Path) -> str:
    """Copy `source` to `target` CHUNK bytes at a time; returns the sha256 of what was copied."""
    digest = hashlib.sha256()
    with source.open("rb") as src, target.open("wb") as dst:
        while chunk := src.read(CHUNK):
            digest.update(chunk)
            dst.write(chunk)
    shutil.copystat(source, target)  # the mode and times, as a hard link would show them
    return digest.hexdigest()


def stage_model(model: BakedModel, context: Path) -> Staged:
    """Lay `model` out under `context`/model/; BuildError when a copied file no longer has its manifest's sha256."""
    root = context / CONTEXT_DIR
    directory = root / model.name
    directory.mkdir(parents=True)
    linked = copied = 0
    for item in model.source.files:
        target = directory / item.relative
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(item.source, target)
            linked += 1
            continue
        except OSError as exc:
            if exc.errno not in _NO_LINK:
                raise BuildError(f"--model {model.source.given}: cannot link {item.relative} into the build "
                                 f"context: {exc.strerror}") from None
        got = copy_streamed(item.source, target)
        copied += 1
        if got != model.hashes[item.relative]:
            raise BuildError(f"--model {model.source.given}: {item.relative} changed while it was being baked "
                             "(its sha256 is no longer the manifest's); build again once it is settled")
    (root / model.manifest_name).write_text(model.manifest, encoding="utf-8")
    return Staged(linked=linked, copied=copied)
