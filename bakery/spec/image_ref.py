"""Image references checked against the grammar Docker itself parses them with.

Written from the grammar of github.com/distribution/reference (reference.go), which the Docker
engine and BuildKit use for `FROM` and `docker pull`:

    reference        := name [ ":" tag ] [ "@" digest ]
    name             := [domain "/"] remote-name          (at most 255 characters)
    domain           := host [":" port-number]
    host             := domain-name | "[" IPv6address "]"
    domain-name      := domain-component ["." domain-component]*
    domain-component := /([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])/
    remote-name      := path-component ["/" path-component]*
    path-component   := alpha-numeric [separator alpha-numeric]*
    alpha-numeric    := /[a-z0-9]+/
    separator        := /[_.]|__|[-]*/
    tag              := /[\\w][\\w.-]{0,127}/
    digest           := algorithm ":" hex   (go-digest: sha256 = 64, sha384 = 96, sha512 = 128
                                             lower-case hex digits)

A reference that matches contains no blank, quote, `$`, `\\`, `#` or control character, so it is
one word of any Dockerfile instruction as it stands: nothing in it can be expanded or split.
"""

from __future__ import annotations

import re

NAME_MAX = 255
FORM = "[registry[:port]/]name[:tag][@sha256:<64 hex>], name in lower-case"
# go-digest's registered algorithms and the exact length of each one's hex encoding.
DIGEST_LENGTHS = {"sha256": 64, "sha384": 96, "sha512": 128}
# The one digest form registries answer with and bakery records (an image id is one too).
SHA256_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")

_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_DOMAIN = rf"{_HOST}(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[_.]|__|-+)[a-z0-9]+)*"
_REMOTE_NAME = rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"

# The whole grammar as one pattern (tests generate references from it).
REFERENCE = rf"(?P<name>(?:{_DOMAIN}/)?{_REMOTE_NAME})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?"
_REFERENCE = re.compile(REFERENCE, re.ASCII)


class ReferenceRefused(ValueError):
    """An image reference Docker would not parse; the message says what is wrong, not where."""


def _digest_problem(digest: str) -> str | None:
    """Why `algorithm:hex` is not a digest Docker accepts (go-digest's rules), or None."""
    algorithm, _, hex_part = digest.partition(":")
    if algorithm not in DIGEST_LENGTHS:
        return f"digest algorithm {algorithm!r} is not one of {', '.join(DIGEST_LENGTHS)}"
    want = DIGEST_LENGTHS[algorithm]
    if len(hex_part) != want:
        return f"digest {algorithm}: has {len(hex_part)} hex digits; {algorithm} needs exactly {want}"
    if not re.fullmatch(r"[0-9a-f]+", hex_part):
        return f"digest {algorithm}: must be lower-case hex digits (0-9, a-f)"
    return None


def _why_not(ref: str) -> str:
    """The most useful single reason a reference that does not match the grammar is refused."""
    bad = next((c for c in ref if c.isspace() or not c.isprintable() or c in "\"'`$\\#;|&<>(){}*?!,="), None)
    if bad is not None:
        return f"contains {bad!r}, which no image reference can hold"
    if not ref.isascii():
        return "contains a non-ASCII character"
    if ref.startswith((":", "@", "/")) or ref.split("@", 1)[0].rsplit(":", 1)[0].endswith("/"):
        return "has no repository name"
    if "@" in ref:
        ref, _, digest = ref.partition("@")
        if problem := _digest_problem(digest):
            return problem
    if ref != ref.lower() and _REFERENCE.fullmatch(ref.lower()):
        return "repository name must be lower-case"
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        tag = last.rsplit(":", 1)[1]
        if not re.fullmatch(_TAG, tag, re.ASCII):
            return f"tag {tag!r} is invalid (letters, digits, '_', '.', '-'; at most 128; not starting with '.' or '-')"
    return "does not follow the reference grammar (name components: a-z, 0-9, '.', '_', '-')"


def registry_of(ref: str) -> str:
    """The registry host of an image reference, as Docker resolves it (docker.io when none is named):
    the first component is a host when it has a `.` or a `:`, or is `localhost`."""
    first, slash, _rest = ref.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def name_and_tag(ref: str) -> tuple[str, str]:
    """The repository name and the tag of `ref` (`latest` when it names none), as the grammar splits them.

    A registry port is part of the name (`localhost:5000/acme/x:1` → `localhost:5000/acme/x`, `1`),
    which splitting at the last `:` gets wrong for a reference without a tag.
    """
    match = _REFERENCE.fullmatch(check_reference(ref))
    assert match is not None  # check_reference refused anything else
    return match.group("name"), match.group("tag") or "latest"


def explicit_tag(ref: str) -> str | None:
    """The tag `ref` names itself, or None (a bare name or a digest alone, which Docker reads differently)."""
    match = _REFERENCE.fullmatch(check_reference(ref))
    assert match is not None  # check_reference refused anything else
    return match.group("tag")


def check_reference(ref: str) -> str:
    """Return `ref` when it is a valid image reference; raise ReferenceRefused saying why otherwise."""
    if not isinstance(ref, str):
        raise ReferenceRefused(f"must be text, not {type(ref).__name__}")
    if not ref:
        raise ReferenceRefused(f"is empty (expected {FORM})")
    match = _REFERENCE.fullmatch(ref)
    if match is None:
        raise ReferenceRefused(f"{_why_not(ref)} (expected {FORM})")
    if len(match.group("name")) > NAME_MAX:
        raise ReferenceRefused(f"repository name is longer than {NAME_MAX} characters")
    if match.group("digest") and (problem := _digest_problem(match.group("digest"))):
        raise ReferenceRefused(problem)
    return ref
