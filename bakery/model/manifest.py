"""The manifest of a baked model: every file's sha256, in `sha256sum` format, and the digest of it.

The image carries the manifest as `/models/baked/<name>.sha256` (names relative to /models/baked, so
`cd /models/baked && sha256sum -c --strict <name>.sha256` checks the files), and its labels carry the
manifest's own sha256 as the model's digest. Files are hashed streamed, 1 MiB at a time.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from bakery.model.source import ModelSource

CHUNK = 1024 * 1024  # bytes read at a time when hashing or copying
BAKED_DIR = "/models/baked"  # where the image holds baked models
# The labels a baked image carries (docs/tags.md).
NAME_LABEL = "ai.bakery.model.name"
DIGEST_LABEL = "ai.bakery.model.digest"
SIZE_LABEL = "ai.bakery.model.size"
PATH_LABEL = "ai.bakery.model.path"


def file_sha256(path: Path) -> str:
    """The sha256 of the file at `path`, read CHUNK bytes at a time (never whole)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_text(name: str, hashes: dict[str, str]) -> str:
    """The `sha256sum` lines of a model's files (`relative path -> sha256`), named `<name>/<relative>`, sorted."""
    return "".join(f"{hashes[relative]}  {name}/{relative}\n" for relative in sorted(hashes))


@dataclass(frozen=True)
class BakedModel:
    """A model as an image bakes it: its source, each file's sha256, the manifest and where it lives."""

    source: ModelSource
    hashes: dict[str, str]  # relative path -> sha256
    manifest: str

    @property
    def name(self) -> str:
        """The model's short name (tags, paths)."""
        return self.source.name

    @property
    def digest(self) -> str:
        """sha256 of the manifest: one value for every file's content and name."""
        return hashlib.sha256(self.manifest.encode("utf-8")).hexdigest()

    @property
    def size(self) -> int:
        """The bytes of the model's files."""
        return self.source.size

    @property
    def manifest_name(self) -> str:
        """The manifest's file name, beside the model's directory in BAKED_DIR."""
        return f"{self.name}.sha256"

    @property
    def image_path(self) -> str:
        """What the engine's model variable defaults to: the file it loads, or the model's directory."""
        base = f"{BAKED_DIR}/{self.name}"
        return f"{base}/{self.source.entry}" if self.source.entry else base

    @property
    def tag_variant(self) -> str:
        """What every tag of a baked image carries: `model-<name>-<first 12 of the digest>`."""
        return f"model-{self.name}-{self.digest[:12]}"

    def labels(self) -> dict[str, str]:
        """The image's model labels."""
        return {NAME_LABEL: self.name, DIGEST_LABEL: f"sha256:{self.digest}", SIZE_LABEL: str(self.size),
                PATH_LABEL: self.image_path}


def bake(source: ModelSource) -> BakedModel:
    """Hash every file of a checked model (streamed) and make its manifest."""
    hashes = {item.relative: file_sha256(item.source) for item in source.files}
    return BakedModel(source=source, hashes=hashes, manifest=manifest_text(source.name, hashes))
