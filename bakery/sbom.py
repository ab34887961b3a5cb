"""Check an image's CycloneDX SBOM (/opt/bakery/sbom.cdx.json, templates/context/make-sbom.sh) against
what is really installed in the worker's venv.

The gate runs INSTALLED_PROBE with the venv's Python in the container, reads the SBOM, and asserts
`sbom_mismatches(sbom, installed) == []`: every distribution the venv holds is listed with its
version, and the SBOM lists nothing else (the bundled CPython component aside).
"""

from __future__ import annotations

import re
from typing import Any

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
    for component in sbom.get("components") or []:
        purl = str(component.get("purl", ""))
        if not purl.startswith("pkg:pypi/"):
            continue
        match = _PYPI_PURL.match(purl)
        name, version = normalize(str(component.get("name", ""))), str(component.get("version", ""))
        if match is None or normalize(match["name"]) != name or match["version"] != version:
            raise ValueError(f"component {component.get('name')!r} {version!r} disagrees with its purl {purl!r}")
        found[name] = version
    return found


def sbom_mismatches(sbom: dict[str, Any], installed: dict[str, str]) -> list[str]:
    """Every way `sbom` fails to list exactly the `installed` distributions ({name: version}); empty when
    it does. Also checks that the document is a CycloneDX BOM."""
    problems = []
    if sbom.get("bomFormat") != "CycloneDX" or not str(sbom.get("specVersion", "")).startswith("1."):
        problems.append(f"not a CycloneDX 1.x document (bomFormat={sbom.get('bomFormat')!r}, "
                        f"specVersion={sbom.get('specVersion')!r})")
    try:
        listed = sbom_distributions(sbom)
    except ValueError as exc:
        return [*problems, str(exc)]
    have = {normalize(name): version for name, version in installed.items()}
    for name in sorted(have.keys() - listed.keys()):
        problems.append(f"installed but not in the SBOM: {name}=={have[name]}")
    for name in sorted(listed.keys() - have.keys()):
        problems.append(f"in the SBOM but not installed: {name}=={listed[name]}")
    for name in sorted(have.keys() & listed.keys()):
        if have[name] != listed[name]:
            problems.append(f"{name}: the SBOM says {listed[name]}, installed is {have[name]}")
    return problems
