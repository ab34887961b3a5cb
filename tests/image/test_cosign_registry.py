"""cosign signs exactly the digest build.py --push verified, on a real registry, with a key pair made here.

For real: build.py --push (the real pipeline and gate, vLLM stand-in) publishes to Debian's
docker-registry on loopback (tests/image/real_registry.py); `python -m bakery.release sign --summary
S --key K --offline --sbom F` signs the verified digest and attests the image's SBOM with Debian's
cosign 2.5 (scripts/setup-host), a key pair made by `cosign generate-key-pair` in a temporary folder.
cosign itself then checks the result: `cosign verify --key` passes on that digest and fails on a
digest nobody verified, on a tag moved after signing and against another key's public key;
`cosign verify-attestation --type cyclonedx` returns exactly the SBOM `bakery.release sbom` wrote.
Offline: no Rekor, no Fulcio (`--tlog-upload=false` to sign, `--insecure-ignore-tlog` to verify).
A missing cosign fails under CI=true.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import bakery.build.builder
import bakery.build.pipeline as pipeline
import bakery.release.ci as release
import tests.image.real_registry as real
from bakery.cli import main as build_py
from tests.host_tools import require_tool

ENGINE = "sglang"
PASSWORD = "bakery-test-only"  # noqa: S105 (protects throwaway keys in a temporary folder)


def cosign(*args: str) -> subprocess.CompletedProcess:
    """cosign against the loopback registry (plain HTTP), offline (no transparency log)."""
    return subprocess.run([require_tool("cosign"), *args, "--allow-insecure-registry", "--allow-http-registry"],
                          capture_output=True, text=True, timeout=120, check=False)


def verify(public_key: Path, ref: str) -> subprocess.CompletedProcess:
    return cosign("verify", "--key", str(public_key), "--insecure-ignore-tlog=true", ref)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Two cosign key pairs: `release` (the signer) and `other` (a key that signed nothing here)."""
    folder = tmp_path_factory.mktemp("cosign-keys")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COSIGN_PASSWORD", PASSWORD)
        mp.setenv("TUF_ROOT", str(folder / "tuf"))  # cosign's trust-root cache stays in the folder
        for name in ("release", "other"):
            proc = subprocess.run([require_tool("cosign"), "generate-key-pair", "--output-key-prefix", name],
                                  cwd=folder, capture_output=True, text=True, check=False)
            assert proc.returncode == 0, proc.stderr
        yield {name: folder / name for name in ("release", "other")}


@pytest.fixture(scope="module")
def signed(keys: dict[str, Path], docker_client, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """build.py --push to a real registry, then `bakery.release sbom` and `bakery.release sign --key`."""
    work = tmp_path_factory.mktemp("cosign")
    with real.running_registry(work / "registry") as registry, pytest.MonkeyPatch.context() as mp:
        mp.setattr(bakery.build.builder, "context_dir", real.own_context_dir())
        mp.setattr(pipeline, "run_gate", real.gate_once)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = build_py(["--engine", ENGINE, "--local", "--quiet", "--json", "--push",
                             "--repository", f"{registry.host}/acme"])
        assert code == 0, err.getvalue()[-3000:]
        summary = work / "summary.json"
        summary.write_text(out.getvalue())
        item = json.loads(out.getvalue())["engines"][0]
        real.keep(docker_client, item["image_id"])
        ref, _, digest = item["pushed"][0].rpartition("@")
        sbom = work / "sbom.cdx.json"
        assert release.main(["sbom", "--image", item["image_id"], "--out", str(sbom)]) == 0
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = release.main(["sign", "--summary", str(summary), "--key", f"{keys['release']}.key", "--offline",
                                 "--sbom", str(sbom)])
        assert code == 0
        repository = ref.rpartition(":")[0]
        yield {"registry": registry, "item": item, "ref": ref, "digest": digest, "repository": repository,
               "summary": summary, "sbom": sbom, "printed": out.getvalue().split()}
        real.remove_tags(docker_client, f"{registry.host}/")


def test_the_verified_digest_is_signed_and_verifies(signed: dict, keys: dict[str, Path]) -> None:
    signed_ref = f"{signed['repository']}@{signed['digest']}"
    assert signed["printed"] == [signed_ref], "sign prints exactly the verified ref@digest"
    proc = verify(keys["release"].with_suffix(".pub"), signed_ref)
    assert proc.returncode == 0, proc.stderr
    claims = json.loads(proc.stdout)
    assert [c["critical"]["image"]["docker-manifest-digest"] for c in claims] == [signed["digest"]]
    assert verify(keys["release"].with_suffix(".pub"), signed["ref"]).returncode == 0, "its tag, unmoved"


def test_another_key_does_not_verify(signed: dict, keys: dict[str, Path]) -> None:
    proc = verify(keys["other"].with_suffix(".pub"), f"{signed['repository']}@{signed['digest']}")
    assert proc.returncode != 0 and "no matching signatures" in proc.stderr


def test_a_digest_nobody_verified_is_neither_signed_nor_verifies(signed: dict, keys: dict[str, Path], docker_client,
                                                                 tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    with real.planted_images(docker_client) as plant:
        planted = plant({"planted.txt": b"never gated"})
        planted_digest = real.push_as(docker_client, planted, f"{signed['repository']}:planted")
    planted_ref = f"{signed['repository']}@{planted_digest}"
    assert verify(keys["release"].with_suffix(".pub"), planted_ref).returncode != 0
    # A summary claiming that digest holds the verified image: sign checks the registry and refuses.
    forged = json.loads(signed["summary"].read_text())
    forged["engines"][0]["pushed"] = [f"{signed['ref']}@{planted_digest}"]
    (tmp_path / "forged.json").write_text(json.dumps(forged))
    capsys.readouterr()
    code = release.main(["sign", "--summary", str(tmp_path / "forged.json"), "--key", f"{keys['release']}.key",
                         "--offline"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err == [f"bakery.release: {planted_ref} holds config {planted}, not the verified image "
                                 f"{signed['item']['image_id']}: refusing to publish it"], err
    assert verify(keys["release"].with_suffix(".pub"), planted_ref).returncode != 0, "nothing was signed"


def test_a_tag_moved_after_signing_does_not_verify(signed: dict, keys: dict[str, Path], docker_client) -> None:
    moved = f"{signed['repository']}:moved"
    assert real.push_as(docker_client, signed["item"]["image_id"], moved) == signed["digest"]
    public = keys["release"].with_suffix(".pub")
    assert verify(public, moved).returncode == 0  # the tag holds the signed digest
    with real.planted_images(docker_client) as plant:
        real.push_as(docker_client, plant({"planted.txt": b"pushed over a signed tag"}), moved)
    proc = verify(public, moved)
    assert proc.returncode != 0 and "no signatures found" in proc.stderr.lower(), proc.stderr


def test_the_attested_sbom_is_exactly_the_images(signed: dict, keys: dict[str, Path]) -> None:
    signed_ref = f"{signed['repository']}@{signed['digest']}"
    proc = cosign("verify-attestation", "--key", str(keys["release"].with_suffix(".pub")),
                  "--insecure-ignore-tlog=true", "--type", "cyclonedx", signed_ref)
    assert proc.returncode == 0, proc.stderr
    envelopes = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert len(envelopes) == 1 and envelopes[0]["payloadType"] == "application/vnd.in-toto+json"
    statement = json.loads(base64.b64decode(envelopes[0]["payload"]))
    assert statement["predicateType"] == "https://cyclonedx.org/bom"
    assert statement["subject"] == [{"name": signed["repository"],
                                     "digest": {"sha256": signed["digest"].removeprefix("sha256:")}}]
    assert statement["predicate"] == json.loads(signed["sbom"].read_text()), "the SBOM the image carries"
    proc = cosign("verify-attestation", "--key", str(keys["other"].with_suffix(".pub")),
                  "--insecure-ignore-tlog=true", "--type", "cyclonedx", signed_ref)
    assert proc.returncode != 0

