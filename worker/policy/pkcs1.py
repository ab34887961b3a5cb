"""RSASSA-PKCS1-v1_5 with SHA-256 (RFC 8017 8.2.2): a forged signature refused at a tenth of the SDK's cost.

`Verifier.verify` works on pycryptodome's GMP integers from bytes, with no conversion through Python ints. It is
the verification of record (policy/signature.py): tests/worker/test_pkcs1.py holds it to pycryptodome, and
test_signature_memo.py the whole check to the SDK's own. See docs/security.md.
"""

from __future__ import annotations

import hashlib
from typing import Any

# DER of DigestInfo { AlgorithmIdentifier { id-sha256, NULL }, OCTET STRING (32) }, and without the NULL
# parameters, which RFC 8017 also allows for SHA-256 (pycryptodome's verify accepts either).
SHA256_PREFIXES = (bytes.fromhex("3031300d060960864801650304020105000420"),
                   bytes.fromhex("302f300b06096086480165030402010420"))
MIN_PADDING = 8  # RFC 8017 9.2: at least 8 bytes of 0xff


class Verifier:
    """One RSA public key's PKCS#1 v1.5 SHA-256 verification; `key` is a pycryptodome RsaKey."""

    def __init__(self, key: Any) -> None:
        from Crypto.Math.Numbers import Integer  # pycryptodome: the worker venv's (this module imports without it)

        self.key = key
        self.size = key.size_in_bytes()
        self._integer = Integer
        self._n = Integer(key.n)
        self._e = Integer(key.e)
        self._encodings: dict[bytes, tuple[bytes, ...]] = {}

    def encodings(self, message: bytes) -> tuple[bytes, ...]:
        """EMSA-PKCS1-v1_5(message) at this key's size, with and without NULL parameters (the last
        few messages are kept: the platform signs one URL per worker)."""
        found = self._encodings.get(message)
        if found is None:
            digest = hashlib.sha256(message).digest()
            found = tuple(b"\x00\x01" + b"\xff" * padding + b"\x00" + prefix + digest for prefix in SHA256_PREFIXES
                          if (padding := self.size - len(prefix) - len(digest) - 3) >= MIN_PADDING)
            if len(self._encodings) >= 8:
                del self._encodings[next(iter(self._encodings))]
            self._encodings[message] = found
        return found

    def verify(self, message: bytes, signature: bytes) -> bool:
        """Whether `signature` is this key's PKCS#1 v1.5 SHA-256 signature of `message`."""
        if len(signature) != self.size:
            return False
        value = self._integer.from_bytes(signature)
        if value >= self._n:
            return False
        return pow(value, self._e, self._n).to_bytes(self.size) in self.encodings(message)
