"""policy/signature_memo.py on the real SDK: a pair the SDK's check accepted under a key is
accepted again without the RSA step, a forged one is refused by pkcs1.py without the SDK's check,
and nothing else changes (tests/worker/signature_memo_probe.py
builds the Worker as core.run() does and counts the SDK's own RSA verifications)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from control import sdk_seam
from policy import signature_memo
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


class _Backend:
    """What first_pairs reads of the SDK's Backend: the key loaded (sdk_seam hook "pubkey")."""

    def __init__(self, key: object) -> None:
        setattr(self, sdk_seam.hook("pubkey").attr, key)


def _first_pairs(key: object, known: set[tuple[str, str]]) -> tuple[Any, list[str], _Backend]:
    backend = _Backend(key)
    checked: list[str] = []

    def knows(url: str, signature: str) -> bool:
        return (url, signature) in known

    knows.any = lambda: bool(known)  # type: ignore[attr-defined]

    def verify(auth: dict[str, Any]) -> bool:
        checked.append(auth["signature"])
        if auth["signature"] == "good":
            known.add((auth["url"], auth["signature"]))
            return True
        return False

    return signature_memo.first_pairs(backend, knows, verify), checked, backend


def test_first_pairs_checks_while_none_is_known_then_leaves_unknown_ones_to_aiohttp() -> None:
    signed, checked, _ = _first_pairs(object(), set())
    assert signed({"url": "u", "signature": "bad"}) is False
    assert signed({"url": "u", "signature": "good"}) is True  # checked here, now known
    assert signed({"url": "u", "signature": "good"}) is True  # known: not checked again
    assert signed({"url": "u", "signature": "other"}) is False  # a pair is known: aiohttp.web's to check
    assert checked == ["bad", "good"]


def test_first_pairs_refusals_are_bounded_per_key() -> None:
    signed, checked, backend = _first_pairs(object(), set())
    for i in range(signature_memo.MAX_LEARN_REFUSALS + 5):
        assert signed({"url": "u", "signature": f"bad{i}"}) is False
    assert len(checked) == signature_memo.MAX_LEARN_REFUSALS
    setattr(backend, sdk_seam.hook("pubkey").attr, object())  # a new key: a new budget
    assert signed({"url": "u", "signature": "good"}) is True
    assert checked[-1] == "good"


def test_first_pairs_checks_nothing_without_a_key() -> None:
    signed, checked, _ = _first_pairs(None, set())
    assert signed({"url": "u", "signature": "good"}) is False and checked == []
