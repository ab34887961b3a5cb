"""Where `build.py --model PATH` reads a model from, and what it must be to be baked.

A model is a file or a directory on this machine; a Hugging Face cache snapshot
(`models--org--name/snapshots/<rev>/`, whose files are symlinks into `../../blobs/`) is one too, since
those symlinks stay inside the model's cache directory. Refused, with one line naming the path and the
fix (InputError, exit 2): a path that does not exist, a symlink that leaves the model (or points
nowhere), a file that is not a regular file, a file that looks like a credential
(bakery.model.credentials), and a model the engine cannot serve (its spec's `engine.model_format`).
Nothing here reads a file whole: a format is told by its first bytes.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from bakery.errors import InputError
from bakery.model import credentials
from bakery.spec.engine_spec import EngineSpec

# The first bytes of a GGUF file (ggml's gguf.h GGUF_MAGIC).
GGUF_MAGIC = b"GGUF"
# A split GGUF model (llama.cpp's gguf-split): the engine is given the first part and finds the others.
_GGUF_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
# A safetensors file starts with its header's length (u64, little-endian), then the JSON header.
_SAFETENSORS_HEADER_MAX = 100 * 1024 * 1024
NAME_MAX = 40  # characters of the model's name in tags and paths


@dataclass(frozen=True)
class ModelFile:
    """One file of a model: its path inside the model, the file its bytes are read from, its size."""

    relative: str  # '/'-separated, inside the model
    source: Path  # the real file (symlinks resolved)
    size: int


@dataclass(frozen=True)
class ModelSource:
    """A model found and checked: what it is called, its format, its files, and which one the engine loads."""

    given: Path
    name: str  # tag- and path-safe (lower-case letters, digits, '.', '_', '-')
    format: str  # gguf | safetensors
    files: tuple[ModelFile, ...]
    entry: str  # the file the engine is given, inside the model ('' for the model directory itself)

    @property
    def size(self) -> int:
        """The bytes of every file."""
        return sum(item.size for item in self.files)


def _refuse(path: Path, why: str) -> InputError:
    return InputError(f"--model {path}: {why}")


def hf_repo_dir(path: Path) -> Path | None:
    """The `models--org--name` directory of a Hugging Face cache path (a snapshot or a file in one), else None."""
    parts = path.parts
    for index in range(len(parts) - 2, 0, -1):
        if parts[index] == "snapshots" and parts[index - 1].startswith("models--"):
            return Path(*parts[:index])
    return None


def model_name(path: Path) -> str:
    """The model's short name, as tags and the image's paths carry it: the repository's name for a Hugging
    Face cache path, else the file's (without .gguf) or directory's name; lower-case, [a-z0-9._-]."""
    repo = hf_repo_dir(path)
    raw = repo.name.split("--")[-1] if repo is not None else (path.name[:-5] if path.name.endswith(".gguf")
                                                               else path.name)
    name = re.sub(r"[^a-z0-9._-]+", "-", raw.lower()).strip(".-_")[:NAME_MAX].strip(".-_")
    return name or "model"


def _inside(target: Path, root: Path) -> bool:
    return target == root or root in target.parents


def _check_name(given: Path, relative: str) -> None:
    # sha256sum's manifest holds one name a line, and escapes a name with a backslash or a newline: such a
    # name could not be checked in the image as written.
    if any(ch in relative for ch in "\\\n\r") or not relative.isprintable():
        raise _refuse(given, f"{relative!r}: a file name with a control character or a backslash cannot be "
                             "listed in the manifest; rename it")


def _collect(given: Path, root: Path) -> list[ModelFile]:
    """Every regular file under the model `given` (a file or a directory), symlinks followed only inside `root`."""
    found: list[ModelFile] = []
    pending: list[tuple[Path, str]] = [(given, "")]
    seen_dirs: set[Path] = set()
    while pending:
        path, relative = pending.pop()
        real = Path(os.path.realpath(path))
        if path.is_symlink() or path != given:
            if not os.path.exists(real):
                raise _refuse(given, f"{relative or path.name}: a symlink that points nowhere ({os.readlink(path)})")
            if not _inside(real, root):
                raise _refuse(given, f"{relative or path.name}: a symlink that leaves the model (to {real}); "
                                     "copy the file into the model or bake the directory it lives in")
        mode = os.stat(real).st_mode
        if stat.S_ISDIR(mode):
            if real in seen_dirs:
                raise _refuse(given, f"{relative or '.'}: a symlink loop (reaches {real} twice)")
            seen_dirs.add(real)
            for child in sorted(os.listdir(path)):
                pending.append((path / child, f"{relative}/{child}" if relative else child))
        elif stat.S_ISREG(mode):
            name = relative or path.name
            _check_name(given, name)
            found.append(ModelFile(relative=name, source=real, size=os.stat(real).st_size))
        else:
            raise _refuse(given, f"{relative or path.name}: not a regular file or directory; remove it")
    return sorted(found, key=lambda item: item.relative)


def _check_credentials(given: Path, files: list[ModelFile]) -> None:
    for item in files:
        why = credentials.name_reason(item.relative.rsplit("/", 1)[-1]) or credentials.content_reason(
            item.source, item.size)
        if why:
            raise _refuse(given, f"{item.relative}: looks like a credential ({why}); a baked file is readable by "
                                 "everyone who can pull the image: remove it from the model")


def _head(path: Path, count: int) -> bytes:
    with path.open("rb") as handle:
        return handle.read(count)


def _gguf_entry(given: Path, files: list[ModelFile]) -> str:
    ggufs = [item for item in files if item.relative.endswith(".gguf")]
    firsts = [item for item in ggufs if (m := _GGUF_SPLIT.search(item.relative)) and int(m.group(1)) == 1]
    if len(ggufs) == 1:
        entry = ggufs[0]
    elif len(firsts) == 1 and all(_GGUF_SPLIT.search(item.relative) for item in ggufs):
        entry = firsts[0]
    else:
        raise _refuse(given, f"{len(ggufs)} .gguf files where the engine loads one (or one split set): give the "
                             ".gguf file itself")
    if _head(entry.source, 4) != GGUF_MAGIC:
        raise _refuse(given, f"{entry.relative}: not a GGUF file (it does not start with {GGUF_MAGIC!r})")
    return entry.relative


def _safetensors_entry(given: Path, files: list[ModelFile]) -> str:
    if not given.is_dir():
        raise _refuse(given, "a single file, where the engine serves a model directory (config.json and "
                             "*.safetensors files): give the directory")
    names = {item.relative for item in files}
    weights = [item for item in files if item.relative.endswith(".safetensors")]
    if "config.json" not in names or not weights:
        raise _refuse(given, "no config.json and *.safetensors files at its top, where the engine serves such a "
                             "directory")
    for item in weights:
        head = _head(item.source, 9)
        length = int.from_bytes(head[:8], "little") if len(head) == 9 else 0
        if not 0 < length <= _SAFETENSORS_HEADER_MAX or head[8:9] != b"{":
            raise _refuse(given, f"{item.relative}: not a safetensors file (no JSON header after its length)")
    return ""


def detect_format(given: Path, files: list[ModelFile]) -> str:
    """The format the model's files are in: gguf (a .gguf file, or a directory holding .gguf files),
    safetensors (a directory holding *.safetensors files), else InputError."""
    if any(item.relative.endswith(".gguf") for item in files):
        return "gguf"
    if any(item.relative.endswith(".safetensors") for item in files):
        return "safetensors"
    raise _refuse(given, "neither a GGUF model (.gguf) nor a safetensors model (config.json + *.safetensors)")


def find_model(path: Path, spec: EngineSpec) -> ModelSource:
    """Find and check the model at `path` for `spec`'s engine; InputError (one line) for anything that cannot
    be baked as given."""
    given = Path(os.path.abspath(path))
    if not os.path.lexists(given):
        raise _refuse(path, "no such file or directory; give a model file or directory (a Hugging Face cache "
                            "snapshot, models--org--name/snapshots/<rev>/, works too)")
    wanted = spec.engine.model_format
    if wanted is None:
        raise InputError(f"{spec.spec_path}: engine.model_format is not set, so --model cannot be checked against "
                         "what the engine serves: set it (gguf or safetensors)")
    repo = hf_repo_dir(given)
    # A Hugging Face snapshot's files live in the repository's blobs/; anything else is its own root.
    root = Path(os.path.realpath(repo)) if repo is not None else Path(os.path.realpath(given))
    files = _collect(given, root)
    if not files:
        raise _refuse(path, "holds no files")
    found = detect_format(given, files)
    if found != wanted:
        raise _refuse(path, f"a {found} model, but {spec.name} serves {wanted} ({spec.spec_path}: "
                            f"engine.model_format); give a {wanted} model")
    entry = _gguf_entry(given, files) if found == "gguf" else _safetensors_entry(given, files)
    _check_credentials(given, files)
    return ModelSource(given=given, name=model_name(given), format=found, files=tuple(files), entry=entry)
