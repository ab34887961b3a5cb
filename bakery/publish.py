"""Tag and push only what the gate verified: the exact image id that passed, by digest."""

from __future__ import annotations

from collections.abc import Callable

from bakery.docker_engine import client
from bakery.errors import BuildError, VerificationError


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
    someone else between verification and push is never published.
    """
    if not verified:
        raise VerificationError(f"image {image_id[:19]} did not pass the gate: it is never pushed")
    pushed = []
    for ref in tags:
        current = client().images.get(ref).id
        if current != image_id:
            raise BuildError(f"{ref} now points at {current[:19]}, not the verified {image_id[:19]}: not pushed")
        repo, _, tag = ref.rpartition(":")
        digest = ""
        for event in client().api.push(repo, tag=tag, stream=True, decode=True):
            if "error" in event:
                raise BuildError(f"push of {ref} failed: {event['error'].strip()}")
            digest = (event.get("aux") or {}).get("Digest", digest)
            if progress and event.get("status") and "id" not in event:
                progress(f"push {ref}: {event['status']}")
        pushed.append(f"{ref}@{digest}" if digest else ref)
    return pushed
