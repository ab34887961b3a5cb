"""policy/signature.py and signature_memo.py on the real SDK: bakery verifies the platform's signature
itself and says what the SDK's own check says on every case tried; a pair it accepted under a key is
accepted again without the RSA step; nothing else changes (tests/worker/signature_memo_probe.py builds the
Worker as core.run() does and counts bakery's RSA verifications)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from policy import signature, signature_memo
from tests.worker.helpers import HERE, probe_facts


@pytest.fixture(scope="module")
def facts(worker_python: Path) -> dict[str, Any]:
    return probe_facts(worker_python, str(HERE / "signature_memo_probe.py"))


def test_the_sdks_own_callers_get_bakerys_check(facts: dict[str, Any]) -> None:
    assert facts["sdk_calls_bakerys"] is True


def test_a_valid_signature_is_verified_once_then_remembered(facts: dict[str, Any]) -> None:
    assert facts["first"] == {"valid": True, "rsa": 1}
    assert facts["again"] == [{"valid": True, "rsa": 0}] * 3


@pytest.mark.parametrize("case", ["flipped", "other_key"])
def test_a_forged_signature_is_refused_every_time_and_never_remembered(facts: dict[str, Any], case: str) -> None:
    assert all(f == {"valid": False, "rsa": 1} for f in facts[case]), facts[case]


def test_bakerys_verification_says_what_the_sdks_check_says(facts: dict[str, Any]) -> None:
    differential = facts["differential"]
    assert all(ours == sdk for ours, sdk in differential.values()), differential
    assert all(ours == sdk for ours, sdk in facts["differential_url"]), facts["differential_url"]
    # The cases are worth what they cover: both verdicts appear, each where it must.
    assert differential["valid"] == [True, True] and differential["newlines"] == [True, True]
    assert all(differential[name] == [False, False] for name in ("flipped", "other_key", "unpadded", "short",
                                                                 "undecodable", "empty", "number", "one_byte_more"))
    assert [pair[0] for pair in facts["differential_url"]] == [True, True, False, False]  # a number, None: no str
    assert facts["no_key"] == [False, False] and facts["unsecured"] == [True, True]


def test_the_url_check_still_comes_first(facts: dict[str, Any]) -> None:
    """A signature for another worker's URL is refused by own_url before any RSA step."""
    assert facts["other_url"] == {"valid": False, "rsa": 0}


def test_a_new_key_meets_no_remembered_pair(facts: dict[str, Any]) -> None:
    assert [(f["valid"], f["rsa"]) for f in facts["after_rotation_old_signature"]] == [(False, 1), (False, 1)]
    assert [(f["valid"], f["rsa"]) for f in facts["after_rotation_new_signature"]] == [(True, 1), (True, 0)]
    assert [(f["valid"], f["rsa"]) for f in facts["same_key_new_object"]] == [(True, 1), (True, 0)]


def test_the_memo_is_bounded_oldest_out(facts: dict[str, Any]) -> None:
    assert facts["bounded_fill"] == [[True, 1]] * (signature_memo.MAX_PAIRS + 1)
    assert facts["bounded_last_again"] == [True, 0]
    assert facts["bounded_first_again"] == [True, 1]  # pushed out by the 17th: verified again


def test_the_guards_make_the_sdks_auth_data_as_the_sdk_does(facts: dict[str, Any]) -> None:
    assert facts["auth_data_same"] == [True, True, True, True]
    ours, sdks, dataclass_fields = facts["auth_fields"]
    assert ours == sdks == dataclass_fields
    made, sdk = facts["auth_data_missing"]
    assert made == sdk and sdk is not None and sdk[0] == "JsonDataException", facts["auth_data_missing"]


def _first_pairs(key: object, known: set[tuple[str, str]]) -> tuple[Any, list[str], signature.Trust]:
    trust = signature.Trust(unsecured=False)
    trust.set_pubkey(key)
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

    return signature_memo.first_pairs(trust.pubkey, knows, verify), checked, trust


def test_first_pairs_checks_while_none_is_known_then_leaves_unknown_ones_to_aiohttp() -> None:
    signed, checked, _ = _first_pairs(object(), set())
    assert signed({"url": "u", "signature": "bad"}) is False
    assert signed({"url": "u", "signature": "good"}) is True  # checked here, now known
    assert signed({"url": "u", "signature": "good"}) is True  # known: not checked again
    assert signed({"url": "u", "signature": "other"}) is False  # a pair is known: aiohttp.web's to check
    assert checked == ["bad", "good"]


def test_first_pairs_refusals_are_bounded_per_key() -> None:
    signed, checked, trust = _first_pairs(object(), set())
    for i in range(signature_memo.MAX_LEARN_REFUSALS + 5):
        assert signed({"url": "u", "signature": f"bad{i}"}) is False
    assert len(checked) == signature_memo.MAX_LEARN_REFUSALS
    trust.set_pubkey(object())  # a new key: a new budget
    assert signed({"url": "u", "signature": "good"}) is True
    assert checked[-1] == "good"


def test_first_pairs_checks_nothing_without_a_key() -> None:
    signed, checked, _ = _first_pairs(None, set())
    assert signed({"url": "u", "signature": "good"}) is False and checked == []
