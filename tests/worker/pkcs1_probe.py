"""Run inside the worker venv (PYTHONPATH=worker/): policy/pkcs1.py against pycryptodome's pkcs1_15.

    <venv>/bin/python pkcs1_probe.py

For keys of several sizes and a few messages, signatures of many kinds (valid; every single-bit flip of
the first and last bytes and a spread of others; another key's; another message's; random bytes; the
values 0, 1, n-1, n, n+1 and all-ones; a valid signature plus n; one byte short and long; the
DigestInfo without NULL parameters; broken paddings, raw-signed with the private key), both verdicts.
Prints one JSON object: the number of cases of each kind, and every case where they differ.
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any


def main() -> int:
    from Crypto.Hash import SHA256
    from Crypto.PublicKey import RSA
    from Crypto.Signature import pkcs1_15

    from policy import pkcs1

    rng = random.Random(20261203)  # noqa: S311 - reproducible test cases, not secrets
    cases: dict[str, int] = {}
    differ: list[dict[str, Any]] = []
    messages = [json.dumps({"url": url}, indent=4, sort_keys=True).encode()
                for url in ("http://203.0.113.7:41234", "http://127.0.0.1:3000", "https://h\u00e9.example:1/x?y")]

    def compare(kind: str, key: Any, verifier: pkcs1.Verifier, message: bytes, signature: bytes) -> None:
        cases[kind] = cases.get(kind, 0) + 1
        try:
            pkcs1_15.new(key).verify(SHA256.new(message), signature)
            theirs = True
        except (ValueError, TypeError):
            theirs = False
        ours = verifier.verify(message, signature)
        if ours != theirs:
            differ.append({"kind": kind, "bits": key.size_in_bits(), "ours": ours, "pycryptodome": theirs,
                           "signature": signature.hex()})

    def raw_sign(private: Any, em: bytes) -> bytes:
        size = private.size_in_bytes()
        return pow(int.from_bytes(em, "big"), private.d, private.n).to_bytes(size, "big")

    for bits in (1024, 2048, 3072):
        private = RSA.generate(bits, randfunc=rng.randbytes)  # seeded: the same keys at every run
        other = RSA.generate(bits, randfunc=rng.randbytes)
        public = private.publickey()
        verifier = pkcs1.Verifier(public)
        size = public.size_in_bytes()
        for message in messages:
            good = pkcs1_15.new(private).sign(SHA256.new(message))
            compare("valid", public, verifier, message, good)
            positions = sorted({*range(8), *range(len(good) * 8 - 8, len(good) * 8),
                                *rng.sample(range(len(good) * 8), 48)})
            for bit in positions:
                flipped = bytearray(good)
                flipped[bit // 8] ^= 1 << (bit % 8)
                compare("bit flipped", public, verifier, message, bytes(flipped))
            compare("another key's", public, verifier, message, pkcs1_15.new(other).sign(SHA256.new(message)))
            for else_message in messages:
                if else_message != message:
                    compare("another message's", public, verifier, message,
                            pkcs1_15.new(private).sign(SHA256.new(else_message)))
            for _ in range(20):
                compare("random", public, verifier, message, rng.randbytes(size))
            n = public.n
            for value in (0, 1, n - 1, n, n + 1, (1 << (size * 8)) - 1):
                compare("edge value", public, verifier, message, value.to_bytes(size, "big"))
            compare("one byte short", public, verifier, message, good[1:])
            compare("one byte long", public, verifier, message, b"\x00" + good)
            compare("empty", public, verifier, message, b"")
            digest = SHA256.new(message).digest()
            no_null = pkcs1.SHA256_PREFIXES[1] + digest
            compare("no NULL parameters", public, verifier, message,
                    raw_sign(private, b"\x00\x01" + b"\xff" * (size - len(no_null) - 3) + b"\x00" + no_null))
            with_null = pkcs1.SHA256_PREFIXES[0] + digest
            broken = {
                "padding byte not 0xff": b"\x00\x01" + b"\xff" * (size - len(with_null) - 4) + b"\xfe\x00" + with_null,
                "block type 2": b"\x00\x02" + b"\xff" * (size - len(with_null) - 3) + b"\x00" + with_null,
                "no zero separator": b"\x00\x01" + b"\xff" * (size - len(with_null) - 2) + with_null,
                "digest of another message": b"\x00\x01" + b"\xff" * (size - len(with_null) - 3) + b"\x00"
                + pkcs1.SHA256_PREFIXES[0] + SHA256.new(b"other").digest(),
                "SHA-1 DigestInfo": b"\x00\x01" + b"\xff" * (size - 35 - 3) + b"\x00"
                + bytes.fromhex("3021300906052b0e03021a05000414") + bytes(20),
            }
            for kind, em in broken.items():
                compare(kind, public, verifier, message, raw_sign(private, em))
            compare("the valid encoding, raw-signed", public, verifier, message,
                    raw_sign(private, b"\x00\x01" + b"\xff" * (size - len(with_null) - 3) + b"\x00" + with_null))
        # A valid signature plus n: the same value modulo n, out of range, so refused. It must still fit
        # the key's size: the first message (of a few hundred) whose signature leaves room for n.
        for i in range(400):
            other_message = messages[0] + b" " * i
            above = int.from_bytes(pkcs1_15.new(private).sign(SHA256.new(other_message)), "big") + public.n
            if above < 1 << (size * 8):
                compare("valid plus n", public, verifier, other_message, above.to_bytes(size, "big"))
                break
    print(json.dumps({"cases": cases, "differ": differ}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
