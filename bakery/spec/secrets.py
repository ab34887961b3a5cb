"""Recognise credentials, which must never be baked into an image: by a variable's name, and by a
value's shape.

Secrets belong to the launch template at run time: anything baked is readable by everyone who can
pull the image (`docker inspect`, `docker history`). Each rule has an id and a reason, and every
refusal names both. Values are never echoed back in messages (the value may be the secret).

Names are matched per `_`-separated component, upper-cased, so that `SESSION_TIMEOUT`,
`AUTH_ENABLED`, `BENCHMARK_MAX_TOKENS` or `TOKENIZER_PATH` (configuration) are not mistaken for
`SESSION_SECRET`, `BASIC_AUTH`, `HF_TOKENS` or `GH_PAT` (credentials).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

# A TOKEN(S) component next to one of these counts tokens (BENCHMARK_MAX_TOKENS, TOKEN_LIMIT).
_COUNT_BEFORE = frozenset({"MAX", "MIN", "NUM", "TOTAL", "NEW", "PROMPT", "OUTPUT", "INPUT", "CONTEXT", "GEN"})
_COUNT_AFTER = frozenset({"LIMIT", "LIMITS", "COUNT", "COUNTS", "LEN", "LENGTH", "BUDGET", "PER"})
# After AUTH, these components make configuration of authentication rather than its material.
_AUTH_CONFIG_AFTER = frozenset({"ENABLED", "ENABLE", "DISABLED", "DISABLE", "MODE", "TYPE", "METHOD", "PROVIDER",
                                "URL", "URI", "ENDPOINT", "REQUIRED", "TIMEOUT", "SCHEME", "DOMAIN", "REALM"})
# A SESSION_* name is credential material only with one of these after it (SESSION_TIMEOUT is not).
_SESSION_MATERIAL = frozenset({"ID", "KEY", "SECRET", "TOKEN", "COOKIE", "SIGNING"})
# Services whose URL/URI conventionally carries its user and password.
_CONNECTION_SERVICES = frozenset({"DATABASE", "DB", "POSTGRES", "POSTGRESQL", "PG", "MYSQL", "MARIADB", "MONGO",
                                  "MONGODB", "REDIS", "AMQP", "RABBITMQ", "BROKER", "SQLALCHEMY", "CLICKHOUSE"})
_PUBLIC_KEY = re.compile(r"(^|_)PUB(LIC)?_?KEYS?($|_)")


@dataclass(frozen=True)
class Rule:
    """One credential rule: an id for messages, the reason, and its test."""

    id: str
    why: str
    matches: Callable[[str, list[str]], bool]


def _token(name: str, parts: list[str]) -> bool:
    for i, part in enumerate(parts):
        if not re.fullmatch(r"[A-Z0-9]*TOKENS?", part):
            continue
        before = parts[i - 1] if i else ""
        after = parts[i + 1] if i + 1 < len(parts) else ""
        if part in ("TOKEN", "TOKENS") and (before in _COUNT_BEFORE or after in _COUNT_AFTER):
            continue  # a number of tokens, not a token
        return True
    return False


def _key(name: str, parts: list[str]) -> bool:
    if _PUBLIC_KEY.search(name):
        return False  # a public key is meant to be public
    return any(re.fullmatch(r"(API|ACCESS|AUTH|SSH|PRIV|PRIVATE|SECRET|SIGNING|MASTER|ENC|LICENSE)?KEYS?", part)
               for part in parts) or bool(re.search(r"(^|_)API_?KEYS?($|_)", name))


def _password(name: str, parts: list[str]) -> bool:
    if re.search(r"PASSWORD|PASSWD|PASSPHRASE|PASSCODE", name):
        return True
    # PWD alone (and OLDPWD) is the shell's working directory, not a password.
    return len(parts) > 1 and any(part in ("PASS", "PWD", "PW") for part in parts)


def _auth(name: str, parts: list[str]) -> bool:
    if "AUTHORIZATION" in name or any(part in ("BEARER", "COOKIE", "COOKIES", "JWT") for part in parts):
        return True
    for i, part in enumerate(parts):
        if part == "AUTH":
            after = parts[i + 1] if i + 1 < len(parts) else ""
            if after not in _AUTH_CONFIG_AFTER:
                return True  # BASIC_AUTH, PROXY_AUTH, AUTH_HEADER, ...
        if part == "SESSION" and i + 1 < len(parts) and parts[i + 1] in _SESSION_MATERIAL:
            return True
    return False


def _connection(name: str, parts: list[str]) -> bool:
    if "DSN" in parts or re.search(r"CONN(ECTION)?_?STR(ING)?", name):
        return True
    return any(part in _CONNECTION_SERVICES and i + 1 < len(parts) and parts[i + 1] in ("URL", "URI")
               for i, part in enumerate(parts))


NAME_RULES: tuple[Rule, ...] = (
    Rule("token", "access tokens (HF_TOKEN, HF_TOKENS, GITHUB_TOKEN, NGROK_AUTHTOKEN, ...)", _token),
    Rule("key", "API, access and private keys (OPENAI_API_KEY, API_KEYS, SSH_KEYS, PRIVKEY, ...)", _key),
    Rule("secret", "secrets (AWS_SECRET_ACCESS_KEY, CLIENT_SECRET, ...)",
         lambda name, parts: any(part.startswith("SECRET") or part.endswith("SECRET") for part in parts)),
    Rule("password", "passwords (DB_PASSWORD, MYSQL_PWD, DB_PWD, ...)", _password),
    Rule("personal-access-token", "personal access tokens (GH_PAT, GITHUB_PAT, ...)",
         lambda name, parts: "PAT" in parts),
    Rule("credential", "credential files and blobs (GCP_CREDENTIALS, AWS_CREDS, ...)",
         lambda name, parts: "CREDENTIAL" in name or any(part in ("CREDS", "CRED") for part in parts)),
    Rule("authentication", "authentication material (AUTHORIZATION, BASIC_AUTH, JWT, SESSION_SECRET, cookies)", _auth),
    Rule("private-key", "private keys (PRIVATE_KEY, TLS_PRIVATE, ...)", lambda name, parts: "PRIVATE" in name),
    Rule("connection-string", "connection strings carry a user and password (DATABASE_URL, SENTRY_DSN, "
         "AZURE_STORAGE_CONNECTION_STRING, ...)", _connection),
    Rule("webhook", "a webhook URL is itself the credential (SLACK_WEBHOOK_URL, ...)",
         lambda name, parts: any("WEBHOOK" in part for part in parts)),
)


def secret_name_rule(name: str) -> Rule | None:
    """The first rule by which `name` names a credential, or None."""
    upper = name.upper()
    parts = [part for part in upper.split("_") if part]
    return next((rule for rule in NAME_RULES if rule.matches(upper, parts)), None)


def secret_reason(name: str) -> str | None:
    """Return why `name` looks like a credential (`rule id: reason`), or None when it does not."""
    rule = secret_name_rule(name)
    return f"rule {rule.id}: {rule.why}" if rule else None


# ---- values ------------------------------------------------------------------------------------

# (rule id, what it is, shape). Shapes are anchored on a non-word boundary so that ordinary words
# ("desk-top", "mask-rcnn", "hf_transfer") are not read as tokens.
VALUE_RULES: tuple[tuple[str, str, re.Pattern[str]], ...] = tuple(
    (rule_id, why, re.compile(pattern)) for rule_id, why, pattern in (
        ("huggingface-token", "a Hugging Face token (hf_...)", r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{20,}"),
        ("github-token", "a GitHub token (ghp_, gho_, ghu_, ghs_, ghr_, github_pat_...)",
         r"(?<![A-Za-z0-9])(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"),
        ("aws-access-key", "an AWS access key id (AKIA..., ASIA...)",
         r"(?<![A-Z0-9])(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16}(?![A-Z0-9])"),
        ("openai-style-key", "an OpenAI-style secret key (sk-..., sk-proj-..., sk_live_...)",
         r"(?<![A-Za-z0-9])(?:sk-[A-Za-z0-9_-]{20,}|[sr]k_live_[A-Za-z0-9]{16,})"),
        ("slack-token", "a Slack token or webhook (xoxb-, xoxp-, hooks.slack.com/services/...)",
         r"(?<![A-Za-z0-9])xox[abposre]-[A-Za-z0-9-]{10,}|hooks\.slack\.com/services/\S+"),
        ("google-api-key", "a Google API key (AIza...)", r"(?<![A-Za-z0-9])AIza[0-9A-Za-z_-]{35}"),
        ("jwt", "a JSON Web Token (eyJ....eyJ....)",
         r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"),
        ("pem-private-key", "a PEM private key (-----BEGIN ... PRIVATE KEY-----)",
         r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"),
        ("url-password", "a URL with a password in it (scheme://user:password@host)",
         r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:[^/\s@]+@"),
        ("connection-string", "a connection string with an account key or password (AccountKey=, Password=)",
         r"(?i)(?:^|;)\s*(?:AccountKey|SharedAccessKey|SharedAccessSignature|Password|Pwd)=[^;\s]+"),
        ("bearer-token", "an Authorization header value (Bearer ... / Basic ...)",
         r"(?i)\b(?:Bearer|Basic)\s+[A-Za-z0-9._~+/-]{16,}=*"),
    )
)


def secret_value_reason(value: str) -> str | None:
    """Return `rule id: what it looks like` when `value` has a credential's shape, else None."""
    for rule_id, why, pattern in VALUE_RULES:
        if pattern.search(value):
            return f"rule {rule_id}: looks like {why}"
    return None
