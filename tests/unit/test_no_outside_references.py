"""Every fact the code cites lives in the repository: no tracked file points at the shared REFERENCE.md
that a clone does not have (its parts moved into docs/engines.md and docs/sdk.md)."""

from __future__ import annotations

import subprocess

from bakery.paths import REPO_ROOT

# Files still citing it, each with its replacement; the list only shrinks.
PENDING: dict[str, str] = {}


def test_no_tracked_file_cites_the_shared_reference() -> None:
    this = "tests/unit/test_no_outside_references.py"
    proc = subprocess.run(["git", "grep", "-l", "REFERENCE\\.md", "--", ".", f":!{this}"], cwd=REPO_ROOT,
                          capture_output=True, text=True, check=False)
    citing = set(proc.stdout.split())
    assert citing - set(PENDING) == set(), f"cite docs/ instead of REFERENCE.md in: {sorted(citing - set(PENDING))}"
    assert set(PENDING) <= citing, f"no longer citing it, drop from PENDING: {sorted(set(PENDING) - citing)}"
