"""A signature the platform made is checked once per key, not at every request.

The platform's signature is deterministic, so each (url, signature) pair the SDK's check accepted is kept with
the key object that accepted it (at most MAX_PAIRS); a new key meets none. Refused pairs are never kept; an
unknown pair goes to pkcs1.py first, and only the SDK's check ever accepts. See docs/serving.md.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Callable
from typing import Any

from config import request_path
from control import sdk_seam
from policy import guards, pkcs1

log = logging.getLogger("bakery.guards")

MAX_PAIRS = 16  # one pair per URL the platform signs for this worker (and per key); a handful at most
MAX_LEARN_REFUSALS = 16  # pairs first_pairs() sees refused under one key before it leaves them to aiohttp.web


def memo(check: Callable[[Any], bool], backend: Any) -> Callable[[Any], bool]:
    """`check` (the SDK's signature check on `backend`) with the accepted pairs remembered (see above)."""
    accepted: dict[tuple[str, str], Any] = {}
    current: list[pkcs1.Verifier | None] = [None]  # the verifier of the key now loaded
    refused = [0]

    def does_not_verify(key: Any, url: str, signature: str) -> bool:
        """True when pkcs1.py finds the signature invalid; False when it verifies or cannot be judged
        here (not an RSA key, not canonical base64): then the SDK's check judges it."""
        verifier = current[0]
        if verifier is None or verifier.key is not key:
            try:
                verifier = current[0] = pkcs1.Verifier(key)
            except (AttributeError, TypeError, ValueError):
                return False
        try:
            raw = base64.b64decode(signature, validate=True)
        except (binascii.Error, ValueError):
            return False
        # The SDK's signed message: json.dumps({"url": url}, indent=4, sort_keys=True), UTF-8.
        return not verifier.verify(json.dumps({"url": url}, indent=4, sort_keys=True).encode(), raw)

    def check_signature(auth_data: Any) -> bool:
        key = sdk_seam.get(backend, "pubkey")
        url, signature = auth_data.url, auth_data.signature
        keyable = key is not None and type(url) is str and type(signature) is str and not backend.unsecured
        if keyable and accepted.get((url, signature)) is key:
            sdk_seam.note_accepted_reqnum(backend, auth_data.reqnum)
            return True
        if keyable and does_not_verify(key, url, signature):
            refused[0] += 1
            if guards.now_and_then(refused[0]):
                log.warning("refused %d request(s) whose signature does not verify under the platform's key",
                            refused[0])
            return False
        valid = check(auth_data)
        if keyable and valid is True:
            remember(url, signature, key)
        return valid

    def remember(url: str, signature: str, key: Any) -> None:
        if sdk_seam.get(backend, "pubkey") is key:  # not if the check itself replaced the key
            if len(accepted) >= MAX_PAIRS:
                del accepted[next(iter(accepted))]
            accepted[(url, signature)] = key

    def knows(url: str, signature: str) -> bool:
        """Whether the pair was accepted under the key loaded now: the check would accept it again with
        no other effect than an acceptance's (the wire front serves such a request itself)."""
        key = sdk_seam.get(backend, "pubkey")
        return key is not None and accepted.get((url, signature)) is key

    def knows_any() -> bool:
        """Whether any pair is known under the key loaded (none: a fresh worker, or a new key)."""
        key = sdk_seam.get(backend, "pubkey")
        return key is not None and any(known is key for known in accepted.values())

    def pairs() -> list[tuple[str, str]]:
        """The pairs accepted under the key loaded now (what front processes serve, front/processes.py)."""
        key = sdk_seam.get(backend, "pubkey")
        return [] if key is None else [pair for pair, known in accepted.items() if known is key]

    knows.any = knows_any  # type: ignore[attr-defined]
    knows.pairs = pairs  # type: ignore[attr-defined]
    check_signature.knows = knows  # type: ignore[attr-defined]
    return request_path.layer("signature_memo", check_signature, check)


def first_pairs(backend: Any, knows: Callable[[str, str], bool],
                verify: Callable[[dict[str, Any]], bool]) -> Callable[[dict[str, Any]], bool]:
    """For the wire front: whether an envelope's auth object is signed as the memo knows, checking it
    with `verify` (the check as a request meets it) while the memo knows no pair under the key loaded,
    at most MAX_LEARN_REFUSALS refusals per key (see the module docstring)."""
    knows_any: Callable[[], bool] | None = getattr(knows, "any", None)
    refused: list[Any] = [0, None]  # refusals under the key [1]

    def signed(auth: dict[str, Any]) -> bool:
        if knows(auth["url"], auth["signature"]):
            return True
        key = sdk_seam.get(backend, "pubkey")
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


def install(backend: Any) -> Callable[[str, str], bool]:
    """Make the memo the innermost layer of `backend`'s signature check (before any guard wraps it);
    returns its `knows(url, signature)`. Raises sdk_seam.GuardError when a hook it needs is gone."""
    for key in ("pubkey", "unsecured", "reqnum"):
        sdk_seam.find(backend, key, "signature_memo")
    made = memo(sdk_seam.find(backend, "check_signature", "signature_memo"), backend)
    sdk_seam.put(backend, "check_signature", made)
    return made.knows  # type: ignore[attr-defined, no-any-return]
