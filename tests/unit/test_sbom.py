"""bakery.release.sbom: an SBOM must list exactly the distributions installed (the gate's SBOM check)."""

from __future__ import annotations

import pytest

from bakery.release.sbom import sbom_distributions, sbom_mismatches


def component(name: str, version: str, purl_name: str | None = None) -> dict:
    return {"type": "library", "name": name, "version": version,
            "purl": f"pkg:pypi/{(purl_name or name).lower()}@{version}"}


def bom(*components: dict) -> dict:
    return {"bomFormat": "CycloneDX", "specVersion": "1.6", "components": list(components)}


INSTALLED = {"vastai": "1.9.1", "typing_extensions": "4.16.0", "supervisor": "4.3.0"}
EXACT = bom(component("vastai", "1.9.1"), component("typing_extensions", "4.16.0"), component("supervisor", "4.3.0"),
            {"type": "application", "name": "cpython", "version": "3.11.2", "purl": "pkg:generic/cpython@3.11.2"})


def test_an_exact_sbom_passes_and_names_are_compared_as_pep_503() -> None:
    assert sbom_mismatches(EXACT, INSTALLED) == []
    assert sbom_mismatches(EXACT, {"VastAI": "1.9.1", "typing-extensions": "4.16.0", "supervisor": "4.3.0"}) == []
    assert sbom_distributions(EXACT) == {"vastai": "1.9.1", "typing-extensions": "4.16.0", "supervisor": "4.3.0"}


@pytest.mark.parametrize("document, expected", [
    (bom(component("vastai", "1.9.1"), component("supervisor", "4.3.0")),
     "installed but not in the SBOM: typing-extensions==4.16.0"),
    (bom(*EXACT["components"], component("requests", "2.34.2")), "in the SBOM but not installed: requests==2.34.2"),
    (bom(component("vastai", "1.9.0"), component("typing_extensions", "4.16.0"), component("supervisor", "4.3.0")),
     "vastai: the SBOM says 1.9.0, installed is 1.9.1"),
    (bom(component("vastai", "1.9.1", purl_name="vastai-sdk"), component("typing_extensions", "4.16.0"),
         component("supervisor", "4.3.0")), "disagrees with its purl"),
    ({**EXACT, "bomFormat": "SPDX"}, "not a CycloneDX 1.x document"),
    ({"bomFormat": "CycloneDX", "specVersion": "1.6"}, "installed but not in the SBOM: supervisor==4.3.0"),
])
def test_every_difference_is_reported(document: dict, expected: str) -> None:
    problems = sbom_mismatches(document, INSTALLED)
    assert any(expected in p for p in problems), problems
