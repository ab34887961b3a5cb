"""A signature the platform made is verified once per key, not at every request.

The platform's signature is deterministic, so each (url, signature) pair the check (policy/signature.py)
accepted is kept with the key object that accepted it (at most MAX_PAIRS); a new key meets none. Refused pairs
are never kept. See docs/serving.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from config import request_path

MAX_PAIRS = 16  # one pair per URL the platform signs for this worker (and per key); a handful at most
MAX_LEARN_REFUSALS = 16  # pairs first_pairs() sees refused under one key before it leaves them to aiohttp.web


def memo(check: Callable[[Any], bool], pubkey: Callable[[], Any], unsecured: bool) -> Callable[[Any], bool]:
    """`check` (the signature's verification) with the accepted pairs remembered (see above); `pubkey()`
    is the key loaded now. The result has `knows(url, signature)`, with `.any()` and `.pairs()`."""
    accepted: dict[tuple[str, str], Any] = {}

    def check_signature(auth_data: Any) -> bool:
        key = pubkey()
        url, signature = auth_data.url, auth_data.signature
        keyable = key is not None and type(url) is str and type(signature) is str and not unsecured
        if keyable and accepted.get((url, signature)) is key:
            return True
        valid = check(auth_data)
        if keyable and valid is True and pubkey() is key:  # not if a key was loaded meanwhile
            if len(accepted) >= MAX_PAIRS:
                del accepted[next(iter(accepted))]
            accepted[(url, signature)] = key
        return valid

    def knows(url: str, signature: str) -> bool:
        """Whether the pair was accepted under the key loaded now: the check would accept it again with
        no other effect than an acceptance's (the wire front serves such a request itself)."""
        key = pubkey()
        return key is not None and accepted.get((url, signature)) is key

    def knows_any() -> bool:
        """Whether any pair is known under the key loaded (none: a fresh worker, or a new key)."""
        key = pubkey()
        return key is not None and any(known is key for known in accepted.values())

    def pairs() -> list[tuple[str, str]]:
        """The pairs accepted under the key loaded now (what front processes serve, front/processes.py)."""
        key = pubkey()
        return [] if key is None else [pair for pair, known in accepted.items() if known is key]

    knows.any = knows_any  # type: ignore[attr-defined]
    knows.pairs = pairs  # type: ignore[attr-defined]
    check_signature.knows = knows  # type: ignore[attr-defined]
    return request_path.layer("signature_memo", check_signature, check)


def first_pairs(pubkey: Callable[[], Any], knows: Callable[[str, str], bool],
                verify: Callable[[dict[str, Any]], bool]) -> Callable[[dict[str, Any]], bool]:
    """For the wire front: whether an envelope's auth object is signed as the memo knows, checking it
    with `verify` (the check as a request meets it) while the memo knows no pair under the key loaded,
    at most MAX_LEARN_REFUSALS refusals per key (see the module docstring)."""
    knows_any: Callable[[], bool] | None = getattr(knows, "any", None)
    refused: list[Any] = [0, None]  # refusals under the key [1]

    def signed(auth: dict[str, Any]) -> bool:
        if knows(auth["url"], auth["signature"]):
            return True
        key = pubkey()
        if knows_any is None or key is None or knows_any():
            return False
        if refused[1] is not key:
            refused[:] = [0, key]
        if refused[0] >= MAX_LEARN_REFUSALS:
            return False
        if verify(auth) is True:
            return knows(auth["url"], auth["signature"])
        refused[0] += 1
        return False

    return signed
