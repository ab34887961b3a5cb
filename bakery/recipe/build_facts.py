"""Facts of this checkout that reach an image: its commit and its source date, read once per run.

They go into the revision and created labels (as build arguments: never secrets, build args show in
an image's history) and the commit into the release tags, so one run gives its labels and its tags
the same commit.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
from dataclasses import dataclass

from bakery.errors import InputError
from bakery.paths import REPO_ROOT
from bakery.spec.dockerfile_values import CREATED_ARG, REVISION_ARG


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


@dataclass(frozen=True)
class BuildFacts:
    """The commit and the created time one run builds with."""

    revision: str
    created: str

    @classmethod
    def of_checkout(cls) -> BuildFacts:
        """This checkout's facts now (InputError for a malformed SOURCE_DATE_EPOCH)."""
        return cls(revision=git_revision(), created=source_date())

    def build_args(self) -> dict[str, str]:
        """The build arguments the Dockerfile's revision and created labels expand."""
        return {REVISION_ARG: self.revision, CREATED_ARG: self.created}
