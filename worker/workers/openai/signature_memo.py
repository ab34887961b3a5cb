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

Imports only the standard library; the SDK's points go through sdk_seam.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from workers.openai import sdk_seam

MAX_PAIRS = 16  # one pair per URL the platform signs for this worker (and per key); a handful at most


def memo(check: Callable[[Any], bool], backend: Any) -> Callable[[Any], bool]:
    """`check` (the SDK's signature check on `backend`) with the accepted pairs remembered (see above)."""
    accepted: dict[tuple[str, str], Any] = {}

    def check_signature(auth_data: Any) -> bool:
        key = sdk_seam.get(backend, "pubkey")
        url, signature = auth_data.url, auth_data.signature
        keyable = key is not None and type(url) is str and type(signature) is str and not backend.unsecured
        if keyable and accepted.get((url, signature)) is key:
            sdk_seam.note_accepted_reqnum(backend, auth_data.reqnum)
            return True
        valid = check(auth_data)
        if keyable and valid is True and sdk_seam.get(backend, "pubkey") is key:
            if len(accepted) >= MAX_PAIRS:
                del accepted[next(iter(accepted))]
            accepted[(url, signature)] = key
        return valid

    return check_signature


def install(backend: Any) -> None:
    """Make the memo the innermost layer of `backend`'s signature check (before any guard wraps it);
    raises sdk_seam.GuardError when a hook it needs is gone."""
    for key in ("pubkey", "unsecured", "reqnum"):
        sdk_seam.find(backend, key, "signature_memo")
    sdk_seam.wrap(backend, "check_signature", "signature_memo", lambda check: memo(check, backend))
