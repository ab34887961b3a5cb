"""The platform's request signature, made with the worker venv's own crypto library (pycryptodome).

The autoscaler signs only the worker URL of a request: RSA PKCS#1 v1.5 over SHA-256 of
`json.dumps({"url": url}, indent=4, sort_keys=True)`, base64-encoded (docs/sdk.md "The signed path"; the SDK's
check in vastai/serverless/server/lib/backend.py recomputes exactly this message).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from Crypto.Hash import SHA256
from Crypto.PublicKey import RSA
from Crypto.Signature import pkcs1_15

KEY_BITS = 2048  # what a real control plane would use; generation takes about a second


def signed_message(url: str) -> bytes:
    """The exact bytes the platform signs for a request to the worker at `url`."""
    return json.dumps({"url": url}, indent=4, sort_keys=True).encode()


def sign(key: RSA.RsaKey, url: str) -> str:
    """The base64 signature the platform puts into auth_data.signature for `url`."""
    return base64.b64encode(pkcs1_15.new(key).sign(SHA256.new(signed_message(url)))).decode()


def verify(public_key: RSA.RsaKey, url: str, signature: str) -> bool:
    """Whether `signature` is a valid signature of `url` under `public_key` (as the SDK checks it)."""
    try:
        pkcs1_15.new(public_key).verify(SHA256.new(signed_message(url)), base64.b64decode(signature))
    except (ValueError, TypeError):
        return False
    return True


def flip_bit(signature: str, bit: int = 0) -> str:
    """`signature` with one bit of its decoded bytes flipped, re-encoded (a forged near-miss)."""
    raw = bytearray(base64.b64decode(signature))
    raw[bit // 8 % len(raw)] ^= 1 << (bit % 8)
    return base64.b64encode(bytes(raw)).decode()


def load_or_create(path: Path) -> RSA.RsaKey:
    """The private key stored at `path` (PEM), generated and stored (mode 0600) when absent."""
    if path.exists():
        return RSA.import_key(path.read_bytes())
    key = RSA.generate(KEY_BITS)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(key.export_key())
    tmp.chmod(0o600)
    tmp.replace(path)  # atomic: a concurrent reader sees no key or the whole key
    return key


def public_pem(key: RSA.RsaKey) -> str:
    """The public half as the PEM text /pubkey/ serves (what the SDK hands to RSA.import_key)."""
    return key.publickey().export_key().decode()
