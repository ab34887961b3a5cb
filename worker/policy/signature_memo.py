"""A signature the platform made is checked once per key, not at every request (issue 24).

The platform signs `{"url": <this worker's URL>}` alone, with PKCS#1 v1.5, which is deterministic: every
request it sends this worker carries the same signature until its key changes. The SDK checks each one
with pycryptodome: ~0.48 ms of CPU on this machine for a 2048-bit key (most of it converting the
integers to and from GMP), and a signed request was checked twice (bakery's envelope guard, before the
payload is parsed, then the SDK's handler): about 1 ms of every signed request's CPU, more than the rest
of the request.

This layer is the innermost of the SDK's signature check (installed before the guards wrap it). It
remembers the (url, signature) pairs the check accepted, each with the key object that accepted it; the
same pair under the same key is accepted again without the RSA step, as the check would: its verdict is
a function of the key, the url and the signature alone. A new key (key_rotation installs a new object)
meets no pair. Only accepted pairs are kept, at most MAX_PAIRS (the oldest goes first), so a forger can
neither fill it nor skip a check: a refused signature is checked in full every time. On a hit the SDK's
one side effect of an accepted signature is kept: its Backend.reqnum becomes the highest reqnum seen.
With UNSECURED=true the SDK's check is called as it is (it accepts everything anyway).

A pair it does not know is first verified by pkcs1.py, ~55 us where the SDK's check takes ~0.48 ms: a
signature that does not verify is refused there, without the SDK's check (and without the SDK's ERROR
line per forged request, which printed the signature: refusals are logged at the 1st, 10th, 100th ...).
One that verifies goes to the SDK's check, which decides. So a forged signature costs a tenth of what it
did, and only the SDK's check ever accepts one.

`first_pairs` lets the wire front check a pair itself while no pair is known under the key loaded: a
fresh worker's first burst (the platform routes it as soon as the worker reports loaded), or the first
after a new key. Before, the wire front handed each such request to aiohttp.web's path until one of
them had been checked there, so a fresh worker served the start of its first burst at aiohttp.web's
cost, each request with the SDK's full check (first token +35 to +41 ms at 256 streams through the
SGLang image, against +14 to +33 in the rounds after). The check is the one a request meets (every
guard's layer, own_url first). Its refusals are bounded (MAX_LEARN_REFUSALS per key; a refused request
goes on to aiohttp.web's path, which refuses it again and answers), and once a pair is known an
unknown one goes to aiohttp.web's path as before: a forger pays the check twice a bounded number of
times per key.

Imports the standard library and pkcs1.py (pycryptodome); the SDK's points go through sdk_seam.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Callable
from typing import Any

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
        """The pairs accepted under the key loaded now (what front processes serve, fronts.py)."""
        key = sdk_seam.get(backend, "pubkey")
        return [] if key is None else [pair for pair, known in accepted.items() if known is key]

    knows.any = knows_any  # type: ignore[attr-defined]
    knows.pairs = pairs  # type: ignore[attr-defined]
    check_signature.knows = knows  # type: ignore[attr-defined]
    return check_signature


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
