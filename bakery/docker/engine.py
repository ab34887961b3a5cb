"""The Docker layer's core: the one client factory, and what bakery asks the engine about images.

The Docker layer is this module and three beside it: `docker_build.py` (one build and its output
stream), `docker_push.py` (the push loop and what a refused push means) and `docker_cli.py` (the
docker CLI, for what the SDK cannot do: buildx imagetools, docker manifest). No other module imports
the Docker SDK or runs `docker` (tests/unit/test_layers.py), so how bakery reaches the engine is
read, changed and mocked here.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors

from bakery.errors import BuildError, InputError
from bakery.spec.image_ref import SHA256_DIGEST, name_and_tag

# Seconds one API call may wait for the engine. Making a local base runs steps that print nothing
# for longer (and imports a whole root file system), so bakery.bases asks for more.
TIMEOUT = 600


def client(timeout: int = TIMEOUT) -> docker.DockerClient:
    """A Docker client for the engine the environment names (DOCKER_HOST, default the local socket);
    one per timeout and engine, made once. A BuildError in one line when there is no engine."""
    return _client(timeout, os.environ.get("DOCKER_HOST", ""))


@functools.lru_cache(maxsize=8)
def _client(timeout: int, host: str) -> docker.DockerClient:
    try:
        engine = docker.from_env(timeout=timeout)
        engine.ping()
    except Exception as exc:  # noqa: BLE001 - the SDK raises several types; each means "no engine"
        where = host or "unix:///var/run/docker.sock"
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise BuildError(f"cannot reach the Docker engine at {where}: {exc.__class__.__name__}: {first} "
                         "(is dockerd running? start it or set DOCKER_HOST)") from None
    return engine


# ---- images on the local engine -------------------------------------------------------------------


def find_image(ref: str) -> Any | None:
    """The local image `ref` (a tag or an id) names, or None when the engine has none."""
    try:
        return client().images.get(ref)
    except docker.errors.ImageNotFound:
        return None


def image_exists(ref: str) -> bool:
    """True when `ref` (a tag or an id) is present on the local engine."""
    return find_image(ref) is not None


def require_image(ref: str, hint: str) -> None:
    """Fail with one line when a base image is missing (nothing can be pulled without a registry)."""
    if not image_exists(ref):
        raise InputError(f"base image {ref} is not on this Docker engine and is not pulled: {hint}")


def image_id(ref: str) -> str | None:
    """The id (config digest) of the local image `ref` names, or None when there is none."""
    image = find_image(ref)
    return None if image is None else str(image.id)


def image_labels(ref: str) -> dict[str, str]:
    """The labels of a local image."""
    return dict(client().images.get(ref).labels or {})


def image_info(ref: str) -> dict[str, Any]:
    """Size (bytes), id, labels and creation time of a local image, for reports and tests."""
    image = client().images.get(ref)
    return {"id": image.id, "size": image.attrs.get("Size", 0), "labels": image.labels,
            "created": image.attrs.get("Created")}


def tag_image(image: str, ref: str) -> None:
    """Give the local image `image` (an id or a tag) the tag `ref`; BuildError when the engine refuses."""
    name, tag = name_and_tag(ref)
    if not client().images.get(image).tag(name, tag):
        raise BuildError(f"could not tag {image[:19]} as {ref}")


def remove_image(image: str) -> bool:
    """Remove a local image when nothing uses it; False (and nothing removed) when something does."""
    try:
        client().images.remove(image, noprune=False)
    except docker.errors.APIError:
        return False
    return True


# ---- images made without a Dockerfile: import, and a container's file system -------------------------


def import_image(data: Iterable[bytes], changes: list[str], what: str, *, timeout: int = TIMEOUT) -> str:
    """`docker import` a tar stream, untagged, applying Dockerfile `changes`; returns the image id.

    The engine answers with JSON lines; an `error` line or no `sha256:` status is a BuildError naming `what`.
    """
    raw = client(timeout).api.import_image(src=data, changes=changes, stream_src=True)
    image = None
    for line in str(raw).splitlines():
        with contextlib.suppress(ValueError):
            message = json.loads(line)
            if message.get("error"):
                raise BuildError(f"docker import of {what} failed: {message['error']}")
            if str(message.get("status", "")).startswith("sha256:"):
                image = message["status"]
    if not image:
        raise BuildError(f"docker import of {what} failed: no image id in {str(raw)[:200]!r}")
    return image


@dataclass(frozen=True)
class FinishedContainer:
    """A container that ran its command to the end; its file system stays readable until the block ends."""

    status: int
    handle: Any

    def output(self) -> str:
        """What the command printed (stdout and stderr)."""
        return self.handle.logs().decode(errors="replace")

    def export(self) -> Iterator[bytes]:
        """The container's file system as a tar stream."""
        return self.handle.export()

    def commit(self, changes: list[str], what: str) -> str:
        """`docker commit` the container (its changes become one layer on its image) with Dockerfile
        `changes` applied, untagged; returns the image id (a BuildError naming `what` if none)."""
        try:
            image = self.handle.commit(changes=changes)
        except docker.errors.APIError as exc:
            raise BuildError(f"docker commit of {what} failed: {exc.explanation or exc}") from None
        return str(image.id)


@contextlib.contextmanager
def finished_container(image: str, command: list[str], *, labels: dict[str, str], timeout: int = TIMEOUT,
                       read_only_binds: dict[str, str] | None = None,
                       on_line: Callable[[str], None] | None = None) -> Iterator[FinishedContainer]:
    """Run `command` in a new container of `image` without network, wait for it, and yield the result;
    the container is removed when the block ends, whatever happened in it. `read_only_binds` maps host
    directories to where the container sees them (read-only); `on_line` gets each output line as it comes."""
    volumes = {host: {"bind": inside, "mode": "ro"} for host, inside in (read_only_binds or {}).items()}
    container = client(timeout).containers.create(image, command, network_disabled=True, labels=labels,
                                                  volumes=volumes or None)
    try:
        container.start()
        if on_line is not None:
            pending = b""
            for chunk in container.logs(stream=True, follow=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    on_line(line.decode(errors="replace"))
        yield FinishedContainer(status=int(container.wait().get("StatusCode", -1)), handle=container)
    finally:
        container.remove(force=True)


@contextlib.contextmanager
def _image_archive(image: str, path: str) -> Iterator[Iterable[bytes] | None]:
    """The tar stream of `path` in the local image `image` (what `docker cp` reads), from a container
    that is created and removed but never started, so nothing in the image runs; None when absent."""
    # The entry point is never run (the container is not started); it only has to exist for create.
    container = client().containers.create(image, entrypoint=["/bakery-never-runs"], network_disabled=True)
    try:
        try:
            stream, _stat = container.get_archive(path)
        except docker.errors.NotFound:
            stream = None
        yield stream
    finally:
        container.remove(force=True)


def archive_from_image(image: str, path: str, *, max_bytes: int) -> bytes | None:
    """`path` in the local image `image` as a tar archive in memory; None when the image has no `path`,
    ValueError when the archive grows past `max_bytes`."""
    with _image_archive(image, path) as stream:
        if stream is None:
            return None
        buffer = io.BytesIO()
        for chunk in stream:
            buffer.write(chunk)
            if buffer.tell() > max_bytes:
                raise ValueError(f"{path} in {image} is over {max_bytes} bytes")
    return buffer.getvalue()


def copy_from_image(image: str, path: str, dest: Path) -> Path:
    """`path` (a file or directory) of the local image `image`, copied into the directory `dest` through
    a tar file on disk (never held in memory, for models of gigabytes); returns the copy's path."""
    archive = dest / ".from-image.tar"
    with _image_archive(image, path) as stream:
        if stream is None:
            raise FileNotFoundError(f"{path} is not in {image}")
        with archive.open("wb") as out:
            for chunk in stream:
                out.write(chunk)
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="data")
    finally:
        archive.unlink()
    return dest / Path(path).name


# ---- registries, as the engine sees them -------------------------------------------------------------


def registry_digest(ref: str) -> str:
    """The digest `ref` resolves to in its registry now (the index digest for a multi-platform image),
    asked through the Docker engine's distribution API."""
    try:
        digest = client().images.get_registry_data(ref).id
    except docker.errors.APIError as exc:
        raise BuildError(f"cannot resolve the digest of {ref}: {exc.explanation or exc}") from None
    if not SHA256_DIGEST.match(str(digest)):
        raise BuildError(f"the registry answered {digest!r} as the digest of {ref}: not a sha256 digest")
    return str(digest)
