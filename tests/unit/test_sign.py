"""bakery.release.sign without a registry: the cosign calls it makes, and what it refuses to sign."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bakery.release.ci as release
from bakery.release.sign import attest_command, sign_command

IMAGE = "sha256:" + "a" * 64
DIGEST = "sha256:" + "b" * 64
REF = "127.0.0.1:5000/acme/vllm:v1-local"


def test_keyless_and_key_pair_calls_differ_only_by_their_flags() -> None:
    assert sign_command("ghcr.io/acme/vllm@" + DIGEST) == ["cosign", "sign", "--yes", "ghcr.io/acme/vllm@" + DIGEST]
    assert sign_command(f"127.0.0.1:5000/acme/vllm@{DIGEST}", key="k.key", offline=True) == [
        "cosign", "sign", "--yes", "--key", "k.key", "--tlog-upload=false", "--allow-insecure-registry",
        "--allow-http-registry", f"127.0.0.1:5000/acme/vllm@{DIGEST}"]
    assert attest_command("r@" + DIGEST, "s.json") == ["cosign", "attest", "--yes", "--type", "cyclonedx",
                                                       "--predicate", "s.json", "r@" + DIGEST]


def summary(tmp_path: Path, **item: object) -> Path:
    path = tmp_path / "summary.json"
    base = {"engine": "vllm", "image_id": IMAGE, "verified": True, "pushed": [f"{REF}@{DIGEST}"], "tags": [REF]}
    path.write_text(json.dumps({"ok": True, "engines": [{**base, **item}]}))
    return path


def sign_cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, list[str]]:
    code = release.main(["sign", *args])
    return code, [line for line in capsys.readouterr().err.splitlines() if line.startswith("bakery.release:")]


def test_nothing_unverified_or_unpushed_is_signed(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, errors = sign_cli(capsys, "--summary", str(summary(tmp_path, verified=False)))
    assert code == 2 and errors == [f"bakery.release: {tmp_path / 'summary.json'}: build.py pushed no verified "
                                    "image: nothing to sign"]
    code, errors = sign_cli(capsys, "--summary", str(summary(tmp_path, pushed=[f"{REF}@sha256:short"])))
    assert code == 2 and "is not ref@sha256:<digest>" in errors[0]


def test_a_missing_key_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, errors = sign_cli(capsys, "--summary", str(summary(tmp_path)), "--key", str(tmp_path / "none.key"))
    assert code == 2 and errors == [f"bakery.release: --key {tmp_path / 'none.key'}: no such file (a cosign "
                                    "private key: cosign generate-key-pair)"]


def test_the_registry_is_checked_before_cosign_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture) -> None:
    ran: list[list[str]] = []
    monkeypatch.setattr("bakery.release.sign.run_cosign", ran.append)
    other = {"config": {"digest": "sha256:" + "c" * 64}}
    monkeypatch.setitem(release.INSPECT, "imagetools", lambda ref: other)
    code, errors = sign_cli(capsys, "--summary", str(summary(tmp_path)))
    assert code == 1 and errors == [f"bakery.release: 127.0.0.1:5000/acme/vllm@{DIGEST} holds config "
                                    f"sha256:{'c' * 64}, not the verified image {IMAGE}: refusing to publish it"]
    assert ran == []
    monkeypatch.setitem(release.INSPECT, "imagetools", lambda ref: {"config": {"digest": IMAGE}})
    assert sign_cli(capsys, "--summary", str(summary(tmp_path)))[0] == 0
    assert ran == [sign_command(f"127.0.0.1:5000/acme/vllm@{DIGEST}")]
