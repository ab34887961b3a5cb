"""The platform's signature on a request, verified by bakery: the innermost layer of the signature check.

The platform signs json.dumps({"url": url}, indent=4, sort_keys=True) with RSASSA-PKCS1-v1_5 and SHA-256 (the
check vastai 1.9.1 makes); pkcs1.py verifies it, held to pycryptodome by tests/worker/test_pkcs1.py. The
guards' layers wrap this one (config/request_path.py); nothing of the SDK is called. See docs/security.md.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Callable
from typing import Any

from config import request_path
from policy import pkcs1
from policy.rules import now_and_then

log = logging.getLogger("bakery.guards")


class Trust:
    """What the signature check trusts: the platform's public key loaded now (None before the first fetch;
    policy/guards.py pubkey_retry fetches it and follows its rotation), or nothing at all when UNSECURED."""

    def __init__(self, unsecured: bool) -> None:
        self.unsecured = unsecured
        self._key: Any = None

    def pubkey(self) -> Any:
        """The key loaded now."""
        return self._key

    def set_pubkey(self, key: Any) -> None:
        """Load `key` (the first fetch, a rotation)."""
        self._key = key


def message(url: Any) -> bytes:
    """The bytes the platform signs for a request to `url`."""
    return json.dumps({"url": url}, indent=4, sort_keys=True).encode()


def verify(platform: Trust) -> Callable[[Any], bool]:
    """The check of an AuthData-like object (url, signature): True when UNSECURED, False without a key,
    else whether its signature verifies under the key loaded now (refusals logged now and then)."""
    current: list[pkcs1.Verifier | None] = [None]
    refused = [0]

    def check_signature(auth_data: Any) -> bool:
        if platform.unsecured:
            return True
        key = platform.pubkey()
        if key is None:
            return False
        verifier = current[0]
        if verifier is None or verifier.key is not key:
            verifier = current[0] = pkcs1.Verifier(key)
        try:
            raw = base64.b64decode(auth_data.signature)  # as the platform's check decodes it (not strict)
        except (binascii.Error, TypeError, ValueError):
            raw = b""
        valid = verifier.verify(message(auth_data.url), raw)
        if not valid:
            refused[0] += 1
            if now_and_then(refused[0]):
                log.warning("refused %d request(s) whose signature does not verify under the platform's key",
                            refused[0])
        return valid

    return request_path.layer("verify", check_signature, None)
