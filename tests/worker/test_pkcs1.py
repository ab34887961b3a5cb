"""policy/pkcs1.py gives pycryptodome's verdict on every signature (tests/worker/pkcs1_probe.py
compares the two in the worker venv): it may refuse a forged signature without the SDK's check only
because it refuses exactly what that check refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.worker.helpers import HERE, probe_facts


@pytest.fixture(scope="module")
def report(worker_python: Path) -> dict[str, Any]:
    return probe_facts(worker_python, str(HERE / "pkcs1_probe.py"), timeout=300)


def test_every_verdict_is_pycryptodomes(report: dict[str, Any]) -> None:
    assert report["differ"] == []


def test_every_kind_of_signature_was_tried(report: dict[str, Any]) -> None:
    """3 key sizes (seeded: the same keys every run) x 3 messages of each kind, one signature plus n per
    key, so a kind that stopped being generated is noticed."""
    kinds = {"valid", "bit flipped", "another key's", "another message's", "random", "edge value",
             "one byte short", "one byte long", "empty", "no NULL parameters", "padding byte not 0xff",
             "block type 2", "no zero separator", "digest of another message", "SHA-1 DigestInfo",
             "the valid encoding, raw-signed", "valid plus n"}
    assert set(report["cases"]) == kinds
    assert report["cases"]["valid"] == 9 and report["cases"]["bit flipped"] >= 9 * 60
    assert all(count >= 9 for kind, count in report["cases"].items() if kind != "valid plus n"), report["cases"]
    assert report["cases"]["valid plus n"] == 3  # one per key
