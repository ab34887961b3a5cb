"""Recognise environment names that hold credentials, which must never be baked into an image.

Secrets belong to the launch template at run time: anything baked is readable by everyone who can
pull the image (`docker inspect`, `docker history`).
"""

from __future__ import annotations

import re

# Each pattern with the reason it is a credential; matched against the upper-cased name.
SECRET_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"(^|_)TOKEN($|_)", "access tokens (HF_TOKEN, GITHUB_TOKEN, MASTER_TOKEN, ...)"),
    (r"(^|_)(API_?)?KEY($|_)", "API and access keys (OPENAI_API_KEY, AWS_ACCESS_KEY_ID, ...)"),
    (r"(^|_)SECRET", "secrets (AWS_SECRET_ACCESS_KEY, CLIENT_SECRET, ...)"),
    (r"PASSWORD|PASSWD|(^|_)PASS($|_)|PASSPHRASE", "passwords"),
    (r"CREDENTIAL", "credential files and blobs"),
    (r"(^|_)(AUTH|BEARER|COOKIE|SESSION)($|_)", "authentication material"),
    (r"PRIVATE", "private keys"),
)

_COMPILED = tuple((re.compile(pattern), why) for pattern, why in SECRET_NAME_PATTERNS)


def secret_reason(name: str) -> str | None:
    """Return why `name` looks like a credential, or None when it does not."""
    upper = name.upper()
    for pattern, why in _COMPILED:
        if pattern.search(upper):
            return why
    return None
