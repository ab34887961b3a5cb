"""Check an image's CycloneDX SBOM (/opt/bakery/sbom.cdx.json, templates/context/make-sbom.sh) against
what is really installed in the worker's venv, and take it out of a verified image for publishing.

The gate runs INSTALLED_PROBE with the venv's Python in the container, reads the SBOM, and asserts
`sbom_mismatches(sbom, installed) == []`: every distribution the venv holds is listed with its
version, and the SBOM lists nothing else (the bundled CPython component aside).

`export_sbom(image, out)` copies that file, byte for byte, out of an image on the local engine
(a created, never started container), refusing one without it or with one that is not a CycloneDX
document; the release attaches it to the verified digest (`python -m bakery.release sbom`).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from pathlib import Path
from typing import Any

from bakery.errors import InputError, VerificationError

SBOM_PATH = "/opt/bakery/sbom.cdx.json"
# Prints {name: version} of every distribution the running Python sees (run it with the venv's Python, -I).
INSTALLED_PROBE = ("import importlib.metadata as m, json; "
                   "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))")
_PYPI_PURL = re.compile(r"^pkg:pypi/(?P<name>[^@?#]+)@(?P<version>[^?#]+)")


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def sbom_distributions(sbom: dict[str, Any]) -> dict[str, str]:
    """The Python distributions an SBOM lists ({normalized name: version}), from each component's
    name/version (and its pkg:pypi purl, which must agree)."""
    found: dict[str, str] = {}
    components = sbom.get("components") or []
    if not isinstance(components, list) or not all(isinstance(c, dict) for c in components):
        raise ValueError("its components are not a list of objects")
    for component in components:
        purl = str(component.get("purl", ""))
        if not purl.startswith("pkg:pypi/"):
            continue
        match = _PYPI_PURL.match(purl)
        name, version = normalize(str(component.get("name", ""))), str(component.get("version", ""))
        if match is None or normalize(match["name"]) != name or match["version"] != version:
            raise ValueError(f"component {component.get('name')!r} {version!r} disagrees with its purl {purl!r}")
        found[name] = version
    return found


def cyclonedx_problems(sbom: Any) -> list[str]:
    """Why `sbom` (parsed JSON) is not a CycloneDX 1.x BOM whose Python components agree with their
    purls; empty when it is one."""
    if not isinstance(sbom, dict):
        return [f"not a CycloneDX document: the JSON is a {type(sbom).__name__}, not an object"]
    problems = []
    if sbom.get("bomFormat") != "CycloneDX" or not str(sbom.get("specVersion", "")).startswith("1."):
        problems.append(f"not a CycloneDX 1.x document (bomFormat={sbom.get('bomFormat')!r}, "
                        f"specVersion={sbom.get('specVersion')!r})")
    try:
        sbom_distributions(sbom)
    except ValueError as exc:
        problems.append(str(exc))
    return problems


def sbom_mismatches(sbom: dict[str, Any], installed: dict[str, str]) -> list[str]:
    """Every way `sbom` fails to list exactly the `installed` distributions ({name: version}); empty when
    it does. Also checks that the document is a CycloneDX BOM."""
    problems = cyclonedx_problems(sbom)
    try:
        listed = sbom_distributions(sbom)
    except ValueError:
        return problems  # cyclonedx_problems named the component that disagrees with its purl
    have = {normalize(name): version for name, version in installed.items()}
    for name in sorted(have.keys() - listed.keys()):
        problems.append(f"installed but not in the SBOM: {name}=={have[name]}")
    for name in sorted(listed.keys() - have.keys()):
        problems.append(f"in the SBOM but not installed: {name}=={listed[name]}")
    for name in sorted(have.keys() & listed.keys()):
        if have[name] != listed[name]:
            problems.append(f"{name}: the SBOM says {listed[name]}, installed is {have[name]}")
    return problems


# ---- the SBOM of a verified image, for publishing --------------------------------------------------

MAX_SBOM_BYTES = 64 * 1024 * 1024  # the worker's SBOM is ~30 kB; a bound keeps a hostile image from filling memory


def parse_sbom(data: bytes, where: str) -> dict[str, Any]:
    """The CycloneDX document in `data`; VerificationError (one line naming `where`) when it is not one."""
    try:
        sbom = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise VerificationError(f"{where}: not JSON ({exc}): not a CycloneDX SBOM; refusing to publish it") from None
    problems = cyclonedx_problems(sbom)
    if problems:
        raise VerificationError(f"{where}: {'; '.join(problems)}; refusing to publish it")
    return sbom


def image_sbom(image: str) -> bytes:
    """The bytes of SBOM_PATH in `image` (an id or a tag on the local engine), read from a container that
    is created and removed but never started, so nothing in the image runs."""
    from bakery.docker import engine as docker_engine

    if not docker_engine.image_exists(image):
        raise InputError(f"image {image} is not on the Docker engine: give a verified image's id or tag")
    try:
        archive = docker_engine.archive_from_image(image, SBOM_PATH, max_bytes=MAX_SBOM_BYTES + 1024 * 1024)
    except ValueError:
        raise VerificationError(f"image {image}: {SBOM_PATH} is over {MAX_SBOM_BYTES} bytes: not the "
                                "worker's SBOM; refusing to publish it") from None
    if archive is None:
        raise VerificationError(f"image {image} has no {SBOM_PATH}: it was not built by make-sbom.sh; "
                                "refusing to publish it without its SBOM")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = next((m for m in tar.getmembers() if m.name == Path(SBOM_PATH).name), None)
        if member is None or not member.isfile():
            raise VerificationError(f"image {image}: {SBOM_PATH} is not a regular file; refusing to publish it")
        handle = tar.extractfile(member)
        assert handle is not None  # a regular file always has content
        return handle.read()


def export_sbom(image: str, out: Path) -> dict[str, Any]:
    """Write `image`'s SBOM to `out` exactly as the image holds it (the bytes the gate checked), after
    checking it is CycloneDX; returns {path, sha256, specVersion, components}."""
    data = image_sbom(image)
    sbom = parse_sbom(data, f"{SBOM_PATH} in {image}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    return {"path": str(out), "sha256": "sha256:" + hashlib.sha256(data).hexdigest(),
            "specVersion": str(sbom.get("specVersion")), "components": len(sbom.get("components") or [])}
