"""The tag scheme: computed from the spec, the bakery version, the base variant and the commit.

For engine `llama` at engine version `b6550`, bakery 0.1.0, commit abc1234, repository `bakery`:

| tag | moves when | use it to |
|---|---|---|
| `bakery/llama:b6550-bakery0.1.0-gabc1234` | never (one build) | pin an exact build |
| `bakery/llama:b6550-bakery0.1.0` | a rebuild of the same versions | pin engine + bakery versions |
| `bakery/llama:b6550` | a new bakery release | follow bakery fixes for one engine version |
| `bakery/llama:latest` | any release | try things out (production base only) |

An image built on another base than the spec's production one gets the variant in every tag
(`-local` for this machine's bases, `-custom` for --base-image) and never `latest`, so a stand-in
build can never be mistaken for a production one.
"""

from __future__ import annotations

import re

from bakery import __version__
from bakery.spec import EngineSpec

VARIANTS = ("production", "local", "custom")


def _clean(text: str) -> str:
    # A Docker tag: [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text).lstrip(".-")[:128]


def release_tags(spec: EngineSpec, *, repository: str = "bakery", variant: str = "production",
                 revision: str = "unknown") -> list[str]:
    """All release tags for one verified image, most specific first."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}")
    suffix = "" if variant == "production" else f"-{variant}"
    repo = f"{repository.rstrip('/')}/{spec.name}"
    versions = f"{spec.version}-bakery{__version__}"
    tags = []
    if revision and revision != "unknown" and not revision.endswith("-dirty"):
        tags.append(f"{versions}-g{revision[:7]}{suffix}")
    tags += [f"{versions}{suffix}", f"{spec.version}{suffix}"]
    if variant == "production":
        tags.append("latest")
    return [f"{repo}:{_clean(tag)}" for tag in tags]
