"""Sign exactly the verified digest with cosign, and attest its SBOM: keyless on GitHub, or your own key.

The release signs what a gate verified and nothing else. The digest comes from a verified record
(`python -m bakery.release verify --push`) or from build.py's summary (`build.py --push --json`),
never from the command line, and is checked in the registry before cosign sees it (the record's
manifest holds the verified image id as its config, and its pushed tag still holds that manifest:
bakery.release.ci.check_sources). Then:

    cosign sign --yes [--key K] <repository>@<digest>
    cosign attest --yes --type cyclonedx --predicate SBOM [--key K] <repository>@<digest>

`sign_command` and `attest_command` write both calls; the manifest job of images.yml runs their
keyless form (no --key: the job's OIDC identity signs, recorded in Sigstore's transparency log), and
tests/unit/test_workflows.py fails when the workflow's calls differ from it. With `--key` (a cosign
key pair of your own; its password in $COSIGN_PASSWORD, never on the command line) the same calls
sign with that key. `--offline` uploads nothing to Sigstore's transparency log (`--tlog-upload=false`),
for a registry with no Sigstore around it; verify such signatures with `--insecure-ignore-tlog`.
A loopback registry (plain HTTP) gets `--allow-insecure-registry --allow-http-registry`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bakery.docker.cli import is_loopback
from bakery.errors import BuildError, InputError
from bakery.spec.image_ref import SHA256_DIGEST as DIGEST
from bakery.spec.image_ref import registry_of

COSIGN = "cosign"
SBOM_TYPE = "cyclonedx"  # cosign maps it to in-toto's CycloneDX predicate, https://cyclonedx.org/bom


def _options(ref: str, key: str | None, offline: bool) -> list[str]:
    """The flags a key pair, an offline signature and a plain-HTTP loopback registry add."""
    flags = ["--key", key] if key else []
    if offline:
        flags.append("--tlog-upload=false")
    if is_loopback(registry_of(ref)):
        flags += ["--allow-insecure-registry", "--allow-http-registry"]
    return flags


def sign_command(ref: str, *, key: str | None = None, offline: bool = False) -> list[str]:
    """`cosign sign` of one `repository@digest`; keyless unless `key`."""
    return [COSIGN, "sign", "--yes", *_options(ref, key, offline), ref]


def attest_command(ref: str, predicate: str, *, key: str | None = None, offline: bool = False) -> list[str]:
    """`cosign attest` of the CycloneDX SBOM `predicate` on one `repository@digest`; keyless unless `key`."""
    return [COSIGN, "attest", "--yes", "--type", SBOM_TYPE, "--predicate", predicate, *_options(ref, key, offline),
            ref]


def summary_records(path: Path) -> list[Any]:
    """Verified records of what `build.py --push --json` published: one per engine it pushed, naming
    the verified image id, the digest it was pushed as and the first tag pushed."""
    from bakery.release.ci import VerifiedRecord

    try:
        engines = json.loads(Path(path).read_text(encoding="utf-8"))["engines"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: not a build.py --json summary: {exc}") from None
    records = []
    for item in engines:
        if not item.get("verified") or not item.get("pushed"):
            continue  # unverified images are never pushed, so there is nothing of them to sign
        ref, _, digest = str(item["pushed"][0]).rpartition("@")
        repository = ref.rpartition(":")[0] if ":" in ref.rpartition("/")[2] else ref
        if not DIGEST.match(digest):
            raise InputError(f"{path}: {item['pushed'][0]} is not ref@sha256:<digest>")
        records.append(VerifiedRecord(engine=item["engine"], target=item["engine"], platform="", variant=item.get(
            "variant", ""), repository=repository, revision="", image_id=item["image_id"],
            checks_run=item.get("checks_run", 0), tags=list(item.get("tags", [])), pushed_ref=ref, digest=digest))
    if not records:
        raise InputError(f"{path}: build.py pushed no verified image: nothing to sign")
    return records


def sign_verified(records: list[Any], *, key: str | None, sboms: dict[str, Path], offline: bool = False,
                  inspect: Callable[[str], dict[str, Any] | None] | None = None,
                  run: Callable[[list[str]], None] | None = None) -> list[str]:
    """Check each record's digest in the registry, then sign it (and attest its SBOM, when given);
    returns the signed `repository@digest` refs. Nothing is signed unless every record checks out."""
    from bakery.release.ci import INSPECT, check_sources

    if key is not None and not Path(key).is_file():
        raise InputError(f"--key {key}: no such file (a cosign private key: cosign generate-key-pair)")
    for sbom in sboms.values():
        if not Path(sbom).is_file():
            raise InputError(f"--sbom {sbom}: no such file (write it with python -m bakery.release sbom)")
    check_sources(records, inspect or INSPECT["imagetools"])
    signed = []
    for record in records:
        ref = f"{record.repository}@{record.digest}"
        commands = [sign_command(ref, key=key, offline=offline)]
        if record.target in sboms:
            commands.append(attest_command(ref, str(sboms[record.target]), key=key, offline=offline))
        for command in commands:
            print(f"[bakery.release] {record.target}: {' '.join(command)}", file=sys.stderr, flush=True)
            (run or run_cosign)(command)
        signed.append(ref)
    return signed


def run_cosign(command: list[str]) -> None:
    """Run one cosign command made here; BuildError (one line, cosign's last words) on failure."""
    if command[:1] != [COSIGN]:
        raise ValueError(f"not a cosign command: {command[:2]}")
    try:
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise InputError("cosign is not installed (scripts/setup-host installs it; GitHub: "
                         "sigstore/cosign-installer)") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise BuildError(f"{' '.join(command[:2])} {command[-1]} failed (exit {proc.returncode}): {last[-300:]}")
