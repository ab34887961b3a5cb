"""The credential catalogue: names and value shapes that are refused, each by a named rule, and the
ordinary names and values that must not be (false positives are failures too)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bakery.errors import InputError
from bakery.spec.engine_spec import IMAGES_DIR, load_spec_file
from bakery.spec.secrets import NAME_RULES, VALUE_RULES, secret_reason, secret_value_reason

# name -> the rule that must refuse it (None: an ordinary name that must pass).
NAMES: dict[str, str | None] = {
    # issue 12's list
    "GH_PAT": "personal-access-token", "GITHUB_PAT": "personal-access-token", "MYSQL_PWD": "password",
    "DB_PWD": "password", "NGROK_AUTHTOKEN": "token", "HF_TOKENS": "token", "API_KEYS": "key",
    "SSH_KEYS": "key", "PRIVKEY": "key", "AUTHORIZATION": "authentication", "DATABASE_URL": "connection-string",
    "AZURE_STORAGE_CONNECTION_STRING": "connection-string", "SENTRY_DSN": "connection-string",
    "SLACK_WEBHOOK_URL": "webhook", "JWT": "authentication",
    # their families
    "HF_TOKEN": "token", "hf_token": "token", "GITHUB_TOKEN": "token", "REFRESH_TOKEN": "token",
    "CF_API_TOKEN": "token", "OPENAI_API_KEY": "key", "APIKEY": "key", "AWS_ACCESS_KEY_ID": "key",
    "SIGNING_KEY": "key", "ANTHROPIC_API_KEYS": "key", "AWS_SECRET_ACCESS_KEY": "key", "CLIENT_SECRET": "secret",
    "CLIENTSECRET": "secret", "WEBHOOK_SECRETS": "secret", "DB_PASSWORD": "password", "REDIS_PASS": "password",
    "ROOTPASSWD": "password", "SSH_PASSPHRASE": "password", "AZURE_DEVOPS_PAT": "personal-access-token",
    "GCP_CREDENTIALS": "credential", "AWS_CREDS": "credential", "BASIC_AUTH": "authentication",
    "PROXY_AUTH": "authentication", "AUTH_HEADER": "authentication", "HTTP_AUTHORIZATION": "authentication",
    "SESSION_SECRET": "secret", "SESSION_ID": "authentication", "JWT_SIGNING": "authentication",
    "COOKIE": "authentication", "BEARER": "authentication", "TLS_PRIVATE": "private-key",
    "REDIS_URL": "connection-string", "MONGODB_URI": "connection-string", "PG_CONN_STR": "connection-string",
    "POSTGRES_DSN": "connection-string", "DISCORD_WEBHOOK": "webhook", "TEAMS_WEBHOOK_URL": "webhook",
    "NPM_AUTH_TOKEN": "token", "AWS_SESSION_TOKEN": "token", "WANDB_API_KEY": "key", "PGPASSWORD": "password",
    "DOCKER_AUTH_CONFIG": "authentication", "HUGGING_FACE_HUB_TOKEN": "token",
    # ordinary configuration (false positives until issue 12)
    "SESSION_TIMEOUT": None, "AUTH_ENABLED": None, "AUTH_MODE": None, "AUTH_URL": None, "SESSION_NAME": None,
    "BENCHMARK_MAX_TOKENS": None, "MAX_NEW_TOKENS": None, "TOKEN_LIMIT": None, "TOKENIZER_PATH": None,
    "MONKEY": None, "KEYBOARD_LAYOUT": None, "PUBLIC_KEY": None, "JWT_PUBKEY": "authentication", "PWD": None,
    "OLDPWD": None, "PATH": None, "PYTHONPATH": None, "AUTHOR": None, "BYPASS_CACHE": None, "PASSTHROUGH": None,
    "COMPASS_DIR": None, "HF_HOME": None, "HF_HUB_ENABLE_HF_TRANSFER": None, "DATABASE_NAME": None,
    "WEBSITE_URL": None, "BACKEND": None, "MODEL_LOG": None, "MODEL_HEALTH_ENDPOINT": None, "LANG": None,
    "SPATIAL_INDEX": None, "PATCH_LEVEL": None,
    # label names the gate finds in `docker history` (tests/image/test_gate.py)
    "title": None, "description": None, "source": None, "version": None, "revision": None, "created": None,
    "backend": None, "engine": None,
}

# value -> the rule that must refuse it (None: must pass). Tokens are made up, of the right shape.
VALUES: dict[str, str | None] = {
    "hf_" + "aBcD" * 9: "huggingface-token",
    "token=hf_" + "Z9" * 15: "huggingface-token",
    "ghp_" + "A1b2" * 9: "github-token",
    "gho_" + "A1b2" * 9: "github-token",
    "github_pat_11ABCDEFG0" + "x" * 40: "github-token",
    "AKIAIOSFODNN7EXAMPLE": "aws-access-key",
    "ASIA" + "Q" * 16: "aws-access-key",
    "sk-" + "proj-" + "a1" * 20: "openai-style-key",
    "sk-ant-api03-" + "b" * 30: "openai-style-key",
    "sk_live_" + "c" * 24: "openai-style-key",
    "xoxb-1234567890-abcdefghij": "slack-token",
    "https://hooks.slack.com/services/T000/B000/XXXX": "slack-token",
    "AIza" + "D" * 35: "google-api-key",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJl": "jwt",
    "-----BEGIN RSA PRIVATE KEY-----": "pem-private-key",
    "-----BEGIN OPENSSH PRIVATE KEY-----": "pem-private-key",
    "-----BEGIN PRIVATE KEY-----": "pem-private-key",
    "https://user:pass@example.com/x": "url-password",
    "postgres://app:s3cret@db:5432/app": "url-password",
    "redis://:pw@cache:6379/0": "url-password",
    "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=abc123==": "connection-string",
    "Server=db;User Id=sa;Password=hunter2": "connection-string",
    "Bearer abcdefghijklmnopqrstuvwxyz": "bearer-token",
    # ordinary values
    "hf_transfer": None, "desk-top": None, "scikit-learn": None, "mask-rcnn-0123456789abcdefghij": None,
    "https://example.com/a": None, "ssh://git@github.com/acme/x": None, "http://127.0.0.1:8080/health": None,
    "user@example.com": None, "-----BEGIN PUBLIC KEY-----": None, "llama.cpp server (llama-server)": None,
    '["model loaded"]': None, "/health": None, "b6550": None, "INFO exited: llama": None,
    "AKIA": None, "eyJ": None, "Bearer": None, "xoxo": None, "task-" + "a" * 30: None,
    "/var/log/portal/llama.log": None, "sha256:" + "a" * 64: None,
}


@pytest.mark.parametrize("name, rule", list(NAMES.items()))
def test_name_catalogue(name: str, rule: str | None) -> None:
    reason = secret_reason(name)
    if rule is None:
        assert reason is None, f"{name} refused for nothing: {reason}"
    else:
        assert reason is not None and reason.startswith(f"rule {rule}: "), f"{name}: {reason}"


@pytest.mark.parametrize("value, rule", list(VALUES.items()))
def test_value_shapes(value: str, rule: str | None) -> None:
    reason = secret_value_reason(value)
    if rule is None:
        assert reason is None, f"{value!r} refused for nothing: {reason}"
    else:
        assert reason is not None and reason.startswith(f"rule {rule}: looks like "), f"{value!r}: {reason}"


def test_table_size_and_every_rule_is_exercised() -> None:
    assert len(NAMES) + len(VALUES) >= 60
    assert {r.id for r in NAME_RULES} <= {rule for rule in NAMES.values() if rule}
    assert {rule_id for rule_id, _, _ in VALUE_RULES} <= {rule for rule in VALUES.values() if rule}
    assert sum(rule is None for rule in NAMES.values()) >= 20 and sum(rule is None for rule in VALUES.values()) >= 15


def spec_with(tmp_path: Path, change) -> Path:
    data = yaml.safe_load((IMAGES_DIR / "llama.yaml").read_text())
    change(data)
    path = tmp_path / "llama.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return path


TOKEN = "hf_" + "aBcD" * 9


@pytest.mark.parametrize("change, where, rule", [
    (lambda d: d["bake"]["env"].update(X_URL="https://u:p@example.com"), "bake.env: X_URL: ", "url-password"),
    (lambda d: d["bake"]["env"].update(X_NOTE=TOKEN), "bake.env: X_NOTE: ", "huggingface-token"),
    (lambda d: d["bake"]["env"]["MODEL_ERROR_LOG_MSGS"].append("ghp_" + "A1b2" * 9),
     "bake.env: MODEL_ERROR_LOG_MSGS: item 5: ", "github-token"),
    (lambda d: d.update(description="mirror of " + TOKEN), "description: ", "huggingface-token"),
    (lambda d: d.update(source="https://ci:hunter2@github.com/x"), "source: ", "url-password"),
    (lambda d: d["engine"]["command"].extend(["--api-key", "sk-" + "a1" * 20]), "engine: command[8]: ",
     "openai-style-key"),
])
def test_baked_values_are_scanned_and_the_refusal_names_key_and_rule(tmp_path: Path, change, where: str,
                                                                      rule: str) -> None:
    with pytest.raises(InputError) as info:
        load_spec_file(spec_with(tmp_path, change))
    message = str(info.value)
    assert "\n" not in message
    assert f"llama.yaml: {where}rule {rule}: looks like" in message, message
    assert "launch template" in message
    assert TOKEN not in message and "hunter2" not in message  # a refusal never repeats the secret


def test_session_timeout_and_auth_enabled_can_be_baked(tmp_path: Path) -> None:
    spec = load_spec_file(spec_with(tmp_path, lambda d: d["bake"]["env"].update(SESSION_TIMEOUT="30",
                                                                                 AUTH_ENABLED="false")))
    assert spec.bake.env["SESSION_TIMEOUT"] == "30" and spec.bake.env["AUTH_ENABLED"] == "false"
