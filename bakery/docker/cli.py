"""The docker CLI, for what the SDK cannot do: read and create multi-platform indexes in a registry,
and run buildx bake (the release's push with provenance).

Two tools make the same index: `docker buildx imagetools` (GitHub's runners) and `docker manifest`
(the Docker CLI alone, where buildx is missing). Each command bakery runs is built here, by a named
function, so the release (bakery.release) decides what to publish and this module how it is sent.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from bakery.errors import BuildError
from bakery.spec.image_ref import registry_of

DOCKER = "docker"


def is_loopback(registry: str) -> bool:
    """True for a registry on this machine, which the Docker engine reaches over plain HTTP by default."""
    host = registry.partition("]")[0] + "]" if registry.startswith("[") else registry.partition(":")[0]
    return host.startswith("127.") or host in ("localhost", "[::1]")


def _insecure(ref: str) -> list[str]:
    # `docker manifest` wants --insecure for a plain-HTTP registry; only loopback gets it, as in the engine.
    return ["--insecure"] if is_loopback(registry_of(ref)) else []


def imagetools_inspect_raw(ref: str) -> dict[str, Any] | None:
    """The raw manifest (or index) at `ref`, or None when the registry has none."""
    proc = subprocess.run([DOCKER, "buildx", "imagetools", "inspect", "--raw", ref], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        if any(text in proc.stderr.lower() for text in ("not found", "manifest unknown", "name unknown")):
            return None
        raise BuildError(f"docker buildx imagetools inspect {ref} failed: {proc.stderr.strip()[-300:]}")
    return json.loads(proc.stdout)


def manifest_inspect(ref: str) -> dict[str, Any] | None:
    """The manifest (or manifest list) at `ref` read with `docker manifest inspect`, or None when absent.

    It reads the registry, except for a list still in the CLI's local store (~/.docker/manifests):
    drop those first (forget_local_lists); `manifest_push` drops each one it pushes.
    """
    proc = subprocess.run([DOCKER, "manifest", "inspect", *_insecure(ref), ref], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        if "no such manifest" in proc.stderr.lower():
            return None
        detail = " ".join(proc.stderr.split())[-300:]
        raise BuildError(f"cannot read {ref} from registry {registry_of(ref)}: {detail}")
    return json.loads(proc.stdout)


def imagetools_create(tags: list[str], sources: list[str]) -> list[str]:
    """The `docker buildx imagetools create` call that makes every tag at once from `sources`."""
    return [DOCKER, "buildx", "imagetools", "create", *[arg for tag in tags for arg in ("--tag", tag)], *sources]


def manifest_create(tag: str, sources: list[str]) -> list[str]:
    """`docker manifest create`: the CLI keeps the list locally until manifest_push sends it."""
    return [DOCKER, "manifest", "create", *_insecure(tag), tag, *sources]


def manifest_push(tag: str) -> list[str]:
    """`docker manifest push --purge`: send the list made by manifest_create, then drop the local copy."""
    return [DOCKER, "manifest", "push", *_insecure(tag), "--purge", tag]


def buildx_bake(bake_files: list[Path], target: str, *, settings: list[str], metadata_file: Path) -> list[str]:
    """`docker buildx bake -f FILE... --set S... --metadata-file M TARGET` (paths made absolute, so the
    command may run from the bake file's directory, where the contexts are relative to)."""
    files = [arg for path in bake_files for arg in ("-f", str(Path(path).resolve()))]
    return [DOCKER, "buildx", "bake", *files, *[arg for setting in settings for arg in ("--set", setting)],
            "--metadata-file", str(Path(metadata_file).resolve()), target]


def run(command: list[str], cwd: Path | None = None) -> None:
    """Run one docker CLI command made here (from `cwd`), its output going to the log as it comes;
    BuildError on failure."""
    if command[:1] != [DOCKER]:
        raise ValueError(f"not a docker command: {command[:2]}")
    proc = subprocess.run(command, cwd=cwd, check=False)
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(command[:4])} failed (exit {proc.returncode})")


def forget_local_lists(tags: list[str]) -> None:
    """Drop the Docker CLI's local manifest lists of `tags`, left by an interrupted run: `docker manifest
    inspect` would read them instead of the registry, and `create` would refuse to replace them."""
    for tag in tags:
        subprocess.run([DOCKER, "manifest", "rm", tag], capture_output=True, check=False)  # absent is fine
