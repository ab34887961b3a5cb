"""workers/openai/signature_memo.py on the real SDK: a pair the SDK's check accepted under a key is
accepted again without the RSA step, a forged one is refused by pkcs1.py without the SDK's check,
and nothing else changes (tests/worker/signature_memo_probe.py
builds the Worker as core.run() does and counts the SDK's own RSA verifications)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from workers.openai import signature_memo

from tests.worker.helpers import HERE, probe_facts


@pytest.fixture(scope="module")
def facts(worker_python: Path) -> dict[str, Any]:
    return probe_facts(worker_python, str(HERE / "signature_memo_probe.py"))


def test_a_valid_signature_is_verified_once_then_remembered(facts: dict[str, Any]) -> None:
    assert facts["first"] == {"valid": True, "rsa": 1, "reqnum": 10}
    assert [f["valid"] for f in facts["again"]] == [True, True, True]
    assert [f["rsa"] for f in facts["again"]] == [0, 0, 0]


def test_a_remembered_signature_keeps_the_sdks_reqnum(facts: dict[str, Any]) -> None:
    """The SDK's check keeps the highest reqnum it accepted: so does a remembered pair."""
    assert [f["reqnum"] for f in facts["again"]] == [50, 50, 50]


@pytest.mark.parametrize("case", ["flipped", "other_key"])
def test_a_forged_signature_is_refused_every_time_without_the_sdks_rsa_step(facts: dict[str, Any], case: str) -> None:
    """pkcs1.py refuses it (~55 us, where the SDK's check takes ~0.48 ms); nothing is remembered."""
    assert all(f == {"valid": False, "rsa": 0, "reqnum": 50} for f in facts[case]), facts[case]


def test_what_pkcs1_cannot_judge_goes_to_the_sdks_check(facts: dict[str, Any]) -> None:
    assert facts["undecodable"] == [False, 1]


def test_the_url_check_still_comes_first(facts: dict[str, Any]) -> None:
    """A signature for another worker's URL is refused by own_url before any RSA step."""
    assert facts["other_url"] == {"valid": False, "rsa": 0, "reqnum": 50}


def test_a_new_key_meets_no_remembered_pair(facts: dict[str, Any]) -> None:
    assert [(f["valid"], f["rsa"]) for f in facts["after_rotation_old_signature"]] == [(False, 0), (False, 0)]
    assert [(f["valid"], f["rsa"]) for f in facts["after_rotation_new_signature"]] == [(True, 1), (True, 0)]
    assert [(f["valid"], f["rsa"]) for f in facts["same_key_new_object"]] == [(True, 1), (True, 0)]


def test_the_memo_is_bounded_oldest_out(facts: dict[str, Any]) -> None:
    assert facts["bounded_fill"] == [[True, 1]] * (signature_memo.MAX_PAIRS + 1)
    assert facts["bounded_last_again"] == [True, 0]
    assert facts["bounded_first_again"] == [True, 1]  # pushed out by the 17th: verified again


def test_the_guards_make_the_sdks_auth_data_as_the_sdk_does(facts: dict[str, Any]) -> None:
    assert facts["auth_data_same"] == [True, True, True, True]
    made, sdk = facts["auth_data_missing"]
    assert made == sdk and sdk is not None and sdk[0] == "JsonDataException", facts["auth_data_missing"]


def test_unsecured_calls_the_sdks_check_as_it_is(facts: dict[str, Any]) -> None:
    assert [f["valid"] for f in facts["unsecured"]] == [True, True]
