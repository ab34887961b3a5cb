"""The one push loop: send a local tag to its registry through the engine, get its digest, or say why not.

bakery.build.publish (release tags of a verified image) and bakery.release.bakefile (local bases for a remote
builder) push through `push()`; what a refusal means is read here once (`push_failure`).
"""

from __future__ import annotations

from collections.abc import Callable

import docker.errors
import requests.exceptions

from bakery.docker import engine as docker_engine
from bakery.errors import BuildError
from bakery.spec.image_ref import name_and_tag, registry_of

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


def push_failure(ref: str, error: str) -> BuildError:
    """One line: which registry, which tag, and why the push failed (the engine's words kept at the end)."""
    registry = registry_of(ref)
    detail = " ".join(error.split())
    lowered = detail.lower()
    reason = next((text.format(registry=registry) for needles, text in _REASONS
                   if any(n in lowered for n in needles)), "the push failed")
    return BuildError(f"push to registry {registry} failed: {reason} ({detail[:300]}); "
                      f"{ref} was not pushed")


def push(ref: str, progress: Callable[[str], None] | None = None) -> str:
    """Push the local tag `ref` to its registry; returns the digest the registry stored it under.

    Any refusal (an error in the engine's stream, an API or connection error, no digest at the end)
    is one BuildError from `push_failure`. `progress` gets the engine's per-push status lines.
    """
    name, tag = name_and_tag(ref)
    digest = ""
    try:
        for event in docker_engine.client().api.push(name, tag=tag, stream=True, decode=True):
            if "error" in event:
                raise push_failure(ref, str(event["error"]))
            digest = (event.get("aux") or {}).get("Digest", digest)
            if progress and event.get("status") and "id" not in event:
                progress(f"push {ref}: {event['status']}")
    except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
        raise push_failure(ref, str(exc)) from None
    if not digest:
        raise push_failure(ref, "the engine reported no digest")
    return digest
