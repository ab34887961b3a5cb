"""Tag and push only what the gate verified: the exact image id that passed, by digest."""

from __future__ import annotations

from collections.abc import Callable

from bakery.docker_engine import client
from bakery.errors import BuildError, VerificationError

# What the engine says when a push fails, and what it means for the person reading the error.
_REASONS = [
    (("connection refused", "no such host", "i/o timeout", "no route to host", "network is unreachable",
      "connection reset"), "the registry is unreachable"),
    (("no basic auth credentials", "unauthorized", "authentication required"),
     "the registry refused the push: authentication required (docker login {registry})"),
    (("denied",), "the registry denied the push (no write access)"),
    (("http 405", "method not allowed"), "the registry refused the upload (HTTP 405: is it read-only?)"),
    (("server gave http response to https client",), "the registry speaks plain HTTP and the engine "
                                                     "wants HTTPS (add it to the engine's insecure-registries)"),
]


def registry_of(ref: str) -> str:
    """The registry host of an image reference, as Docker resolves it (docker.io when none is named)."""
    first, slash, _rest = ref.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def push_failure(ref: str, error: str) -> BuildError:
    """One line: which registry, which tag, and why the push failed (the engine's words kept at the end)."""
    registry = registry_of(ref)
    detail = " ".join(error.split())
    lowered = detail.lower()
    reason = next((text.format(registry=registry) for needles, text in _REASONS
                   if any(n in lowered for n in needles)), "the push failed")
    return BuildError(f"push to registry {registry} failed: {reason} ({detail[:300]}); "
                      f"{ref} was not pushed")


def tag_verified(image_id: str, tags: list[str], *, verified: bool) -> None:
    """Give release tags to `image_id`; refuses an image whose gate did not pass."""
    if not verified:
        raise VerificationError(f"image {image_id[:19]} did not pass the gate: it gets no release tag")
    image = client().images.get(image_id)
    for ref in tags:
        repo, _, tag = ref.rpartition(":")
        if not image.tag(repo, tag):
            raise BuildError(f"could not tag {image_id[:19]} as {ref}")


def push_verified(image_id: str, tags: list[str], *, verified: bool,
                  progress: Callable[[str], None] | None = None) -> list[str]:
    """Push the verified image under `tags`; returns the pushed `ref@digest` lines.

    Each tag is checked to still point at `image_id` right before its push, so a tag moved by
    someone else between verification and push is never published. The first failure stops the
    pushes (a BuildError naming the registry and the reason): every tag pushed before it holds the
    verified image, and no later tag is sent.
    """
    import docker.errors
    import requests.exceptions

    if not verified:
        raise VerificationError(f"image {image_id[:19]} did not pass the gate: it is never pushed")
    pushed = []
    for ref in tags:
        current = client().images.get(ref).id
        if current != image_id:
            raise VerificationError(f"{ref} now points at {current[:19]}, not the verified {image_id[:19]}: "
                                    "not pushed")
        repo, _, tag = ref.rpartition(":")
        digest = ""
        try:
            for event in client().api.push(repo, tag=tag, stream=True, decode=True):
                if "error" in event:
                    raise push_failure(ref, str(event["error"]))
                digest = (event.get("aux") or {}).get("Digest", digest)
                if progress and event.get("status") and "id" not in event:
                    progress(f"push {ref}: {event['status']}")
        except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
            raise push_failure(ref, str(exc)) from None
        if not digest:
            raise push_failure(ref, "the engine reported no digest")
        pushed.append(f"{ref}@{digest}")
    return pushed
