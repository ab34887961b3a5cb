"""Tag and push only what the gate verified: the exact image id that passed, by digest."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bakery.docker import engine as docker_engine
from bakery.docker.push import push
from bakery.errors import VerificationError


@dataclass(frozen=True)
class Pushed:
    """One pushed tag and the digest the registry holds it under; prints as `ref@digest`."""

    ref: str
    digest: str

    def __str__(self) -> str:
        return f"{self.ref}@{self.digest}"


def tag_verified(image_id: str, tags: list[str], *, verified: bool) -> None:
    """Give release tags to `image_id`; refuses an image whose gate did not pass."""
    if not verified:
        raise VerificationError(f"image {image_id[:19]} did not pass the gate: it gets no release tag")
    for ref in tags:
        docker_engine.tag_image(image_id, ref)


def push_verified(image_id: str, tags: list[str], *, verified: bool,
                  progress: Callable[[str], None] | None = None) -> list[Pushed]:
    """Push the verified image under `tags`; returns what was pushed, each tag with its digest.

    Each tag is checked to still point at `image_id` right before its push, so a tag moved by
    someone else between verification and push is never published. The first failure stops the
    pushes (a BuildError naming the registry and the reason): every tag pushed before it holds the
    verified image, and no later tag is sent.
    """
    if not verified:
        raise VerificationError(f"image {image_id[:19]} did not pass the gate: it is never pushed")
    pushed = []
    for ref in tags:
        current = docker_engine.image_id(ref)
        if current != image_id:
            raise VerificationError(f"{ref} now points at {(current or 'nothing')[:19]}, not the verified "
                                    f"{image_id[:19]}: not pushed")
        pushed.append(Pushed(ref, push(ref, progress)))
    return pushed
