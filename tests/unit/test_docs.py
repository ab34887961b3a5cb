"""The Markdown pages hold together: every relative link (and image) resolves to a file of the repository,
every `#anchor` to a heading of its target, every docs/ page is linked from README.md, and README.md stays
a front page (at most 200 lines). No Markdown parser is a dependency, so links are read with a regex
outside fenced code blocks and code spans; anchors follow GitHub's heading slugs (lower case, punctuation
but `-` and `_` dropped, each space a `-`, a repeated heading `-1`, `-2`, ...)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from bakery.paths import REPO_ROOT

README_MAX_LINES = 200

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
# [text](target "title") and ![alt](target); the text may hold one level of brackets.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]*)>?(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
# [label]: target, on a line of its own after a blank line (a definition cannot interrupt a paragraph)
REFERENCE_DEF = re.compile(r"(?:\A|(?<=\n\n)) {0,3}\[[^\]]+\]:[ \t]*<?(\S+?)>?(?:[ \t].*)?$", re.M)
HTML_LINK = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)=\"([^\"]*)\"", re.I)
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:|^//", re.I)


def prose(text: str) -> str:
    """`text` without its fenced code blocks and code spans (each line kept, so numbers stay right)."""
    lines, fence = [], None
    for line in text.split("\n"):
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
            lines.append("")
        elif fence is not None:
            if line.strip().startswith(fence[0] * len(fence)) and set(line.strip()) == {fence[0]}:
                fence = None
            lines.append("")
        else:
            lines.append(line)
    return CODE_SPAN.sub(lambda m: " " * len(m.group(0)), "\n".join(lines))


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every link and image of a Markdown text, code left out."""
    body = prose(text)
    found = []
    for pattern in (INLINE_LINK, REFERENCE_DEF, HTML_LINK):
        for match in pattern.finditer(body):
            found.append((match.start(), match.group(1)))
    return [(body.count("\n", 0, start) + 1, target) for start, target in sorted(found)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: its rendered text, lower case, punctuation dropped."""
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a Markdown text, repeated headings numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    for line in prose(text).split("\n"):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        if count:
            seen.setdefault(f"{base}-{count}", 1)
    return set(seen)


def resolve(page: Path, target: str) -> tuple[Path, str]:
    """The file a relative link of `page` points at, and its anchor ('' when none)."""
    path, _, anchor = target.partition("#")
    path = path.split("?", 1)[0]
    return (page if not path else (page.parent / path).resolve()), anchor


def dead_links(root: Path, pages: list[Path]) -> list[str]:
    """Each relative link of `pages` that points at no file of `root`, or at a heading its target lacks."""
    root = root.resolve()
    problems, cache = [], {}
    for page in (p.resolve() for p in pages):
        for number, target in links(page.read_text(encoding="utf-8")):
            if not target or SCHEME.match(target):
                continue
            where = f"{page.relative_to(root)}:{number}: ({target})"
            path, anchor = resolve(page, target)
            if root != path and root not in path.parents:
                problems.append(f"{where} points outside the repository")
            elif not path.exists():
                problems.append(f"{where} no such file: {path.relative_to(root)}")
            elif anchor and path.suffix == ".md":
                if path not in cache:
                    cache[path] = anchors(path.read_text(encoding="utf-8"))
                if anchor not in cache[path]:
                    problems.append(f"{where} no heading #{anchor} in {path.relative_to(root)}")
    return problems


def orphans(root: Path) -> list[str]:
    """Each docs/*.md page README.md does not link to directly."""
    readme = (root / "README.md").resolve()
    linked = {resolve(readme, target)[0] for _, target in links(readme.read_text(encoding="utf-8"))
              if not SCHEME.match(target)}
    return [f"docs/{page.name}" for page in sorted((root / "docs").glob("*.md")) if page.resolve() not in linked]


def markdown_pages() -> list[Path]:
    """The repository's Markdown files: tracked, or new and not ignored."""
    proc = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", "*.md"],
                          cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    return [REPO_ROOT / name for name in sorted(set(proc.stdout.split("\0"))) if name and (REPO_ROOT / name).exists()]


def test_every_relative_link_resolves() -> None:
    pages = markdown_pages()
    assert {"README.md", "BENCHMARKS.md", "docs/gate.md"} <= {str(p.relative_to(REPO_ROOT)) for p in pages}
    assert dead_links(REPO_ROOT, pages) == []


def test_every_docs_page_is_linked_from_the_readme() -> None:
    assert orphans(REPO_ROOT) == []


def test_readme_is_a_front_page() -> None:
    lines = (REPO_ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move text to docs/"


def test_slugs_follow_github() -> None:
    # Anchors the pages use, as GitHub made them.
    assert slug("The gate (what an image must show before it gets a tag)") == \
        "the-gate-what-an-image-must-show-before-it-gets-a-tag"
    assert slug("Environment contract (worker)") == "environment-contract-worker"
    assert slug("Following new releases (python -m bakery.bump, engine-bump.yml)") == \
        "following-new-releases-python--m-bakerybump-engine-bumpyml"
    assert slug("The `vastai` SDK: what bakery relies on") == "the-vastai-sdk-what-bakery-relies-on"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n## A\n") == {"a", "a-1", "a-2"}


def test_the_checks_fire_on_planted_defects(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## Some section (two)\n\n[The front](../README.md).\n")
    (tmp_path / "docs" / "orphan.md").write_text("# Nobody links here\n")
    (tmp_path / "README.md").write_text(
        "# Front\n\n[page](docs/page.md), [section](docs/page.md#some-section-two), [self](#front)\n"
        "![logo](docs/logo.png) and [gone](docs/gone.md)\n"
        "[bad anchor](docs/page.md#no-such-section) [web](https://example.com/x.md)\n"
        "`[in a code span](docs/nothing.md)`\n```\n[in a fence](docs/nothing.md)\n```\n"
        "[out](../../etc/passwd)\n  [0.1, 8]: not a definition, a paragraph goes on\n\n[def]: docs/missing.md\n")
    problems = dead_links(tmp_path, [tmp_path / "README.md", tmp_path / "docs" / "page.md"])
    assert problems == [
        "README.md:4: (docs/logo.png) no such file: docs/logo.png",
        "README.md:4: (docs/gone.md) no such file: docs/gone.md",
        "README.md:5: (docs/page.md#no-such-section) no heading #no-such-section in docs/page.md",
        "README.md:10: (../../etc/passwd) points outside the repository",
        "README.md:13: (docs/missing.md) no such file: docs/missing.md",
    ]
    assert orphans(tmp_path) == ["docs/orphan.md"]
