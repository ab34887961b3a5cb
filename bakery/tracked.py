"""The files of the checkout that git tracks: what a build context may copy from the repository.

A build context made by copying directories wholesale bakes whatever lies there, so a stray
untracked `worker/.env` would end up in the image. The context copies only what `git ls-files`
lists (committed or staged, as it is in the working tree) plus what the build generates.

Outside a git checkout this refuses rather than guessing: a hand-kept allow-list would drift from
the repository, and a tree without git metadata cannot show which files are the project's.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from bakery.errors import InputError


def tracked_files(root: Path, *tops: str) -> list[str]:
    """Paths (relative to `root`, '/'-separated) that git tracks under each of `tops`, sorted.

    A tracked file deleted in the working tree is left out, as the working tree is what is built.
    """
    try:
        proc = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--", *tops],
                              capture_output=True, check=False)
    except OSError as exc:
        raise InputError(f"cannot run git ({exc}): the build context holds only files git tracks, so bakery "
                         "builds from a git checkout; install git") from None
    if proc.returncode != 0:
        why = (proc.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise InputError(f"{root}: git ls-files failed ({why}): the build context holds only files git tracks, "
                         "so bakery builds from a git checkout (git clone the repository)")
    paths = []
    for raw in proc.stdout.split(b"\0"):
        if not raw:
            continue
        path = raw.decode("utf-8", errors="surrogateescape")  # relative to root (git -C root)
        full = root / path
        if full.is_symlink() or full.is_file():
            paths.append(path)
    return sorted(paths)

