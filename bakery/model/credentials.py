"""Files in a model that look like credentials, which must never be baked (a model directory copied from
a workstation may hold a `.env`, a Hugging Face `token` or a key).

By name, with the rules of bakery.spec.secrets read over the file's name, plus the names credential
files conventionally have; by content, with secrets' value rules over each small non-weight file
(streamed, so no file is read whole).
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from bakery.spec.secrets import VALUE_RULES, secret_reason

# Names credential files conventionally have, that the variable-name rules would not see as such.
CREDENTIAL_FILES = (".env", ".env.*", ".netrc", ".git-credentials", ".npmrc", ".pypirc", ".dockercfg",
                    "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks")
# Tokenizer files every Hugging Face model has, which the name rules would read as holding tokens.
TOKENIZER_FILES = frozenset({"special_tokens_map.json", "added_tokens.json"})
# Weights are not text and are large: their content is not scanned (a credential there could not be read
# back as one by anyone but the engine).
WEIGHT_SUFFIXES = frozenset({".gguf", ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".onnx", ".msgpack", ".h5"})
SCAN_LIMIT = 64 * 1024 * 1024  # bytes: a non-weight file larger than this is not scanned
CHUNK = 1024 * 1024
# How much of the previous chunk is kept so a credential split by a chunk boundary is still seen.
_OVERLAP = 4096
# A run of token characters is cut to its first _RUN_KEEP: every value rule matches within far fewer, and
# an uncut megabyte-long run (a base64 blob, a padding line) makes the rules' regexes quadratic.
_RUN_KEEP = 256
_RUN = re.compile(rf"[A-Za-z0-9+./_~=-]{{{_RUN_KEEP + 1},}}")


def name_reason(name: str) -> str | None:
    """Why a file called `name` looks like a credential (a rule id and reason), or None."""
    lower = name.lower()
    if lower in TOKENIZER_FILES:
        return None
    for pattern in CREDENTIAL_FILES:
        if fnmatch.fnmatchcase(lower, pattern):
            return f"rule credential-file: a credential file's name ({pattern})"
    stem = lower.split(".", 1)[0] if not lower.startswith(".") else lower
    return secret_reason(re.sub(r"[^A-Za-z0-9]+", "_", stem).strip("_"))


def content_reason(path: Path, size: int) -> str | None:
    """Why the content of the file at `path` looks like it holds a credential, or None; weights and
    files over SCAN_LIMIT are not read."""
    if path.suffix.lower() in WEIGHT_SUFFIXES or size > SCAN_LIMIT:
        return None
    tail = ""
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            text = _RUN.sub(lambda run: run.group(0)[:_RUN_KEEP] + " ", tail + chunk.decode("latin-1"))
            for rule_id, why, pattern in VALUE_RULES:
                if pattern.search(text):
                    return f"rule {rule_id}: looks like {why}"
            tail = text[-_OVERLAP:]
    return None
