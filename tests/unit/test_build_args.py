"""Build facts for the labels: stable for one checkout, so rebuilding it reuses every layer."""

from __future__ import annotations

import subprocess

import pytest

from bakery.build.builder import build_args
from bakery.errors import InputError
from bakery.recipe.build_facts import source_date
from bakery.spec.engine_spec import REPO_ROOT


def test_created_is_the_commit_time_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    iso = subprocess.run(["git", "log", "-1", "--format=%cd", "--date=format-local:%Y-%m-%dT%H:%M:%SZ"],
                         cwd=REPO_ROOT, capture_output=True, text=True, check=True,
                         env={"TZ": "UTC", "PATH": "/usr/bin:/bin"}).stdout.strip()
    assert source_date() == iso
    assert build_args()["BAKERY_CREATED"] == iso
    assert build_args() == build_args()  # two builds of one checkout get the same facts


def test_source_date_epoch_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767323045")
    assert source_date() == "2026-01-02T03:04:05Z"


@pytest.mark.parametrize("bad", ["yesterday", "1.5", "99999999999999999999"])
def test_a_bad_source_date_epoch_is_a_one_line_input_error(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", bad)
    with pytest.raises(InputError, match=r"^SOURCE_DATE_EPOCH='.*' is not a Unix time in seconds"):
        source_date()
