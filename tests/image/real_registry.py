"""Debian's `docker-registry` (the CNCF distribution registry, 2.8) on 127.0.0.1, and `skopeo` to read it.

The publishing tests push to the real registry software, not to a stand-in written for them, and
read back what arrived with skopeo, a reader that shares no code with bakery. Each registry runs
from its own config and storage directory in a temporary folder, on a free loopback port, so it
never meets the packaged service (`/etc/docker/registry/config.yml`, :5000, htpasswd auth) that a
systemd host starts when the package is installed. The Docker engine talks plain HTTP to it because
127.0.0.0/8 is an insecure registry by default (`docker info`: "Insecure Registries: 127.0.0.0/8").

Not a conftest: the test modules import what they need from here (tests/image/conftest.py belongs
to the gate).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors
import pytest
import yaml

from bakery.build.verify import GateResult, run_gate
from tests.host_tools import require_tool
from tests.ports import free_port

START_TIMEOUT = 20.0  # seconds until a started registry must answer /v2/; it takes ~0.1 s here


@dataclass
class RunningRegistry:
    """A registry process: `host` is `127.0.0.1:<port>`, `storage` its directory."""

    host: str
    storage: Path
    log: Path
    process: subprocess.Popen

    def repositories(self) -> list[str]:
        """Repository names present in the storage directory (readable even when HTTP refuses)."""
        root = self.storage / "docker" / "registry" / "v2" / "repositories"
        return sorted(str(p.parent.relative_to(root)) for p in root.rglob("_manifests")) if root.exists() else []


def _config(storage: Path, port: int, *, readonly: bool, htpasswd: Path | None) -> dict[str, Any]:
    storage_cfg: dict[str, Any] = {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True}}
    if readonly:
        storage_cfg["maintenance"] = {"readonly": {"enabled": True}}
    config: dict[str, Any] = {
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": storage_cfg,
        # A fixed secret silences the "no HTTP secret" warning; it only signs upload state here.
        "http": {"addr": f"127.0.0.1:{port}", "secret": "bakery-test-only"},
    }
    if htpasswd is not None:
        config["auth"] = {"htpasswd": {"realm": "bakery-test", "path": str(htpasswd)}}
    return config


def _answers(host: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}/v2/", timeout=1):
            return True
    except urllib.error.HTTPError as exc:
        return exc.code == 401  # an auth registry answers /v2/ with its challenge
    except OSError:
        return False


@contextlib.contextmanager
def running_registry(directory: Path, *, readonly: bool = False, auth: bool = False) -> Iterator[RunningRegistry]:
    """Start `docker-registry serve` with its own config in `directory`; stop it on exit.

    `readonly` refuses every write (storage maintenance mode); `auth` requires htpasswd credentials
    that nobody has (an empty password file), so any push is refused.
    """
    binary = require_tool("docker-registry")
    directory.mkdir(parents=True, exist_ok=True)
    storage = directory / "storage"
    storage.mkdir(exist_ok=True)
    htpasswd = None
    if auth:
        htpasswd = directory / "htpasswd"
        htpasswd.write_text("")
    log = directory / "registry.log"
    for _attempt in range(3):  # another process may take the free port before the registry binds it
        port = free_port()
        config = directory / "config.yml"
        config.write_text(yaml.safe_dump(_config(storage, port, readonly=readonly, htpasswd=htpasswd)))
        with log.open("ab") as out:
            process = subprocess.Popen([binary, "serve", str(config)], stdout=out, stderr=subprocess.STDOUT)
        host = f"127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT
        while process.poll() is None and time.monotonic() < deadline and not _answers(host):
            time.sleep(0.05)
        if process.poll() is None and _answers(host):
            break
        _stop(process)
    else:
        pytest.fail(f"docker-registry did not start; its log {log}:\n{log.read_text()[-2000:]}")
    try:
        yield RunningRegistry(host=host, storage=storage, log=log, process=process)
    finally:
        _stop(process)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


# ---- skopeo: the independent reader -------------------------------------------------------------


def _skopeo(*args: str) -> subprocess.CompletedProcess:
    skopeo = require_tool("skopeo")
    # --tls-verify=false: the loopback registry speaks plain HTTP (skopeo does not assume it for 127/8).
    return subprocess.run([skopeo, *args[:1], "--tls-verify=false", *args[1:]], capture_output=True,
                          timeout=60, check=False)


def _unknown(stderr: bytes) -> bool:
    text = stderr.decode(errors="replace").lower()
    return any(s in text for s in ("manifest unknown", "name unknown", "404 (not found)", "not found"))


def skopeo_raw(ref: str) -> tuple[dict[str, Any], str] | None:
    """(the parsed manifest or index stored at `ref`, its digest), or None when the registry has none.

    The digest is skopeo's own (`inspect --format {{.Digest}}` would resolve an index to one platform,
    so it is computed here from the raw bytes: a manifest's digest is the sha256 of those bytes).
    """
    proc = _skopeo("inspect", "--raw", f"docker://{ref}")
    if proc.returncode != 0:
        if _unknown(proc.stderr):
            return None
        raise AssertionError(f"skopeo inspect --raw {ref} failed: {proc.stderr.decode().strip()}")
    return json.loads(proc.stdout), "sha256:" + hashlib.sha256(proc.stdout).hexdigest()


def skopeo_tags(repository: str) -> list[str]:
    """The tags `repository` holds, per skopeo; [] when the registry has no such repository."""
    proc = _skopeo("list-tags", f"docker://{repository}")
    if proc.returncode != 0:
        if _unknown(proc.stderr):
            return []
        raise AssertionError(f"skopeo list-tags {repository} failed: {proc.stderr.decode().strip()}")
    return sorted(json.loads(proc.stdout)["Tags"] or [])


def skopeo_config(ref: str) -> dict[str, Any]:
    """The image config at `ref` (os, architecture, ...), per skopeo `inspect --config`."""
    proc = _skopeo("inspect", "--config", f"docker://{ref}")
    if proc.returncode != 0:
        raise AssertionError(f"skopeo inspect --config {ref} failed: {proc.stderr.decode().strip()}")
    return json.loads(proc.stdout)


# ---- the gate, once per image id ----------------------------------------------------------------

_GATE_RESULTS: dict[tuple[str, str, str], GateResult] = {}


def gate_once(image_id: str, engine: str, *, variant: str = "local", **kwargs: Any) -> GateResult:
    """The real gate (bakery.build.verify.run_gate), run once per (image id, engine, level) in a session.

    A gate result is a property of the image id: the publishing tests rebuild one image (Docker's
    cache gives the same id) and push it to several registries, so only the first run pays.
    """
    key = (image_id, engine, variant)
    if key not in _GATE_RESULTS:
        result = _GATE_RESULTS[key] = run_gate(image_id, engine, variant=variant, **kwargs)
        if not result.passed:  # the callers run build.py --quiet: say why here, or nobody sees it
            print(f"the gate of {engine} failed; the end of its output:\n{result.output[-2400:]}", file=sys.stderr)
    return _GATE_RESULTS[key]


def tiny_image(client: Any, content: str) -> str:
    """A one-file image (never verified by any gate) made with `docker import`; returns its id."""
    return import_image(client, {"planted.txt": content.encode()})


def import_image(client: Any, files: dict[str, bytes]) -> str:
    """An image holding exactly `files` ({path: content}; never built, never gated), made with
    `docker import`; returns its id."""
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    result = client.api.import_image_from_data(buffer.getvalue())
    image_id = json.loads(result.strip().splitlines()[-1])["status"] if isinstance(result, str) else None
    if not image_id:
        raise AssertionError(f"docker import returned {result!r}")
    return client.images.get(image_id).id


@contextlib.contextmanager
def planted_images(client: Any) -> Iterator[Callable[[dict[str, bytes]], str]]:
    """make(files) -> the id of an imported image (import_image); every one is removed on exit."""
    made: list[str] = []

    def make(files: dict[str, bytes]) -> str:
        made.append(import_image(client, files))
        return made[-1]

    try:
        yield make
    finally:
        for image_id in made:
            with contextlib.suppress(docker.errors.APIError):
                client.images.remove(image_id, force=True)


def push_as(client: Any, image_id: str, ref: str) -> str:
    """Tag `image_id` as `ref` and push it (a test's own push, not bakery's); returns the digest."""
    repo, _, tag = ref.rpartition(":")
    client.images.get(image_id).tag(repo, tag)
    digest = ""
    for event in client.api.push(repo, tag=tag, stream=True, decode=True):
        if "error" in event:
            raise AssertionError(f"push {ref}: {event['error']}")
        digest = (event.get("aux") or {}).get("Digest", digest)
    return digest


def own_context_dir(label: str = "") -> Callable[[str], Path]:
    """bakery.build.builder.context_dir for these tests: other builds on this machine lay out
    cache/contexts/<engine>, and a planted build must not rewrite the good build's context."""
    from bakery.paths import cache_path

    return lambda name: cache_path("contexts", f"test-publish{label}-{name}")


KEEP_TAG = f"bakery-test/publish:{os.environ.get('BAKERY_SUITE_TAG', 'suite')}"


def keep(client: Any, image_id: str) -> None:
    """Hold a local test tag on the verified image, so removing the registry tags never deletes it:
    a rebuild would get a new id (new layer times) and pay for the gate again. The previous run's
    image loses the tag, and is removed when nothing else holds it, so runs do not pile up."""
    repo, _, tag = KEEP_TAG.rpartition(":")
    try:
        previous = client.images.get(KEEP_TAG).id
    except docker.errors.ImageNotFound:
        previous = None
    client.images.get(image_id).tag(repo, tag)
    if previous and previous != image_id:
        with contextlib.suppress(docker.errors.APIError):
            client.images.remove(previous)


def remove_tags(client: Any, prefix: str) -> None:
    """Remove every local tag that starts with `prefix` (the images stay if something else uses them)."""
    for image in client.images.list():
        for ref in image.tags:
            if ref.startswith(prefix):
                with contextlib.suppress(Exception):
                    client.images.remove(ref)

