"""The one place that talks to the Docker engine (through the Docker SDK for Python)."""

from __future__ import annotations

import functools

import docker
import docker.errors

from bakery.errors import BuildError, InputError


@functools.lru_cache(maxsize=1)
def client() -> docker.DockerClient:
    """A Docker client for the local engine; a clear BuildError when there is none."""
    try:
        engine = docker.from_env(timeout=600)
        engine.ping()
    except docker.errors.DockerException as exc:
        raise BuildError(f"cannot reach the Docker engine ({exc}): start Docker or set DOCKER_HOST") from None
    return engine


def image_exists(ref: str) -> bool:
    """True when `ref` (a tag or an id) is present on the local engine."""
    try:
        client().images.get(ref)
    except docker.errors.ImageNotFound:
        return False
    return True


def require_image(ref: str, hint: str) -> None:
    """Fail with one line when a base image is missing (nothing can be pulled without a registry)."""
    if not image_exists(ref):
        raise InputError(f"base image {ref} is not on this Docker engine and is not pulled: {hint}")
