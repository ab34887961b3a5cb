"""Where bakery's files are: the repository's directories and the host cache, each defined once.

Every module takes these from here (the repository root is this file's parent's parent; the cache
is `$BAKERY_CACHE`, default `~/.cache/bakery`), so moving one is a one-line change.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
IMAGES_DIR = REPO_ROOT / "images"  # engine specs
TEMPLATES_DIR = REPO_ROOT / "templates"  # Jinja2 Dockerfile templates and their build-context files
RENDERED_DIR = REPO_ROOT / "rendered"  # the committed, generated Dockerfiles
BASES_DIR = REPO_ROOT / "bases"  # what the local bases are made from
WORKER_DIR = REPO_ROOT / "worker"  # the worker copied into every image
WORKER_REQUIREMENTS = WORKER_DIR / "requirements.txt"  # its hash lock (worker/lock.py writes it)
GATE_DIR = REPO_ROOT / "tests" / "image"  # the verification gate

CACHE_VAR = "BAKERY_CACHE"
# The cache's sub-directories, by what they hold; cache_path() refuses any other name (a typo would
# otherwise start a second, silent cache).
CACHE_KINDS = frozenset({
    "locks",  # file locks serialising parallel preparations
    "wheels", "wheelhouse", "venvs", "models",  # the worker's and llama.cpp's Python inputs
    "rootfs", "debootstrap-debs", "build",  # local bases: Debian trees, packages, build contexts
    "contexts",  # engine image build contexts
    "bench",  # benchmark inputs
})


def cache_dir() -> Path:
    """The cache root (`$BAKERY_CACHE`, default `~/.cache/bakery`), created if needed."""
    root = Path(os.environ.get(CACHE_VAR) or Path.home() / ".cache" / "bakery")
    root.mkdir(parents=True, exist_ok=True)
    return root


def cache_path(kind: str, *parts: str) -> Path:
    """A path under the cache: `cache_dir()/<kind>/<parts...>` (not created); `kind` is one of CACHE_KINDS."""
    if kind not in CACHE_KINDS:
        raise ValueError(f"unknown cache directory {kind!r}: one of {', '.join(sorted(CACHE_KINDS))}")
    return cache_dir().joinpath(kind, *parts)
