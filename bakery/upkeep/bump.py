"""Move each spec to its engine's newest release: `version`, the base image's tag and `upstream.tag`.

For every spec with an `upstream.releases` feed (bakery/upkeep/feeds.py) this asks the feed for its
newest stable release and, when that is newer than the pinned one, rewrites the spec in place. The
edit is textual and minimal: only the characters of the three values change (found by their YAML
positions), so comments, order and quoting stay as they were; the result must load as a valid spec
with exactly the new values, or nothing is written.

    python -m bakery.upkeep.bump --all                     rewrite every spec that is behind, print the changes
    python -m bakery.upkeep.bump --engine vllm --dry-run   only print what would change
    python -m bakery.upkeep.bump --all --summary out.md    also write the changes as Markdown (a PR body)

The base tag follows the version by substitution: the pinned version must occur in the tag
(`vllm/vllm-openai:v0.33.0`, `ghcr.io/ggml-org/llama.cpp:server-b11434`), and a digest pinned after the
tag is dropped (it names the old image; CI resolves the new one at release). A registry feed's tag
template must give the same tag. What a bump cannot check here (the new source's log lines, the
rendered Dockerfile) is the drift check's and `make render`'s job: .github/workflows/engine-bump.yml.

Exit codes: 0 done (changed or not), 2 bad input (a malformed feed, a spec the rule cannot bump).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from packaging.version import InvalidVersion, Version

from bakery.errors import InputError, cli_main
from bakery.spec.engine_spec import (
    EngineSpec,
    ReleaseFeed,
    available_engines,
    display_path,
    images_dir,
    load_engine,
    parse_spec,
)
from bakery.upkeep import feeds


@dataclass(frozen=True)
class Change:
    """One value of a spec that a bump rewrites."""

    key: str  # dotted path in the spec: version, base.image, base.cuda_lines.<n>.image, upstream.tag
    old: str
    new: str


@dataclass(frozen=True)
class Bump:
    """What bumping one spec found: the pinned and the newest release, and the changes (none: current)."""

    spec: EngineSpec
    path: Path
    pinned: str
    newest: str
    feed: str
    changes: tuple[Change, ...]

    def describe(self) -> str:
        """One line for the report."""
        if not self.changes:
            return f"{self.spec.name}: {self.spec.version} is current ({self.feed} newest: {self.newest})"
        return f"{display_path(self.path)}: " + "; ".join(f"{c.key} {c.old} -> {c.new}" for c in self.changes)


def release_of(spec: EngineSpec, feed: ReleaseFeed) -> str:
    """The release the spec pins, read back through the feed's `version` spelling (`v{release}`)."""
    before, _, after = feed.version.partition("{release}")
    match = re.fullmatch(re.escape(before) + "(?P<release>.+)" + re.escape(after), spec.version)
    if not match:
        raise InputError(f"{spec.spec_path}: version: {spec.version!r} is not spelled as upstream.releases.version "
                         f"{feed.version!r}; make them agree")
    return match.group("release")


def _is_newer(newest: str, pinned: str, where: str) -> bool:
    try:
        return Version(newest) > Version(pinned)
    except InvalidVersion:
        raise InputError(f"{where}: {pinned!r} is not a version the feed's releases compare with") from None


def _split_image(image: str) -> tuple[str, str, str]:
    """(repository, tag, digest suffix) of `name[:tag][@digest]`; the tag may be empty."""
    name, at, digest = image.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        return name[:colon], name[colon + 1:], at + digest
    return name, "", at + digest


def plan(spec: EngineSpec, newest: str) -> tuple[Change, ...]:
    """The changes that move `spec` to release `newest` (empty when it is not newer)."""
    feed = spec.upstream.releases
    if feed is None:
        raise InputError(f"{spec.spec_path}: upstream.releases: not set; name the engine's release feed to bump it")
    pinned = release_of(spec, feed)
    if not _is_newer(newest, pinned, spec.spec_path):
        return ()
    old_version, new_version = spec.version, feed.version.format(release=newest)
    repository, tag, _digest = _split_image(spec.base.image)
    if old_version not in tag:
        raise InputError(f"{spec.spec_path}: base.image: the tag {tag!r} does not contain the version "
                         f"{old_version!r}, so the new tag cannot be derived; set base.image by hand")
    new_tag = tag.replace(old_version, new_version)
    if feed.tag is not None and new_tag != feed.tag.format(release=newest):
        raise InputError(f"{spec.spec_path}: base.image: the derived tag {new_tag!r} is not the feed's "
                         f"{feed.tag.format(release=newest)!r}; make base.image and upstream.releases.tag agree")
    # A digest after the tag pins the old image: the new reference has none (CI resolves it at release).
    changes = [Change("version", old_version, new_version),
               Change("base.image", spec.base.image, f"{repository}:{new_tag}")]
    # Every other CUDA line's base moves with the release too (each names it in its tag: v0.33.0-cu129).
    for index, line in enumerate(spec.base.cuda_lines):
        if line.image is not None:
            changes.append(_line_change(spec, index, line.image, old_version, new_version))
    if spec.upstream.tag is not None:
        if old_version not in spec.upstream.tag:
            raise InputError(f"{spec.spec_path}: upstream.tag: {spec.upstream.tag!r} does not contain the version "
                             f"{old_version!r}; set it by hand")
        changes.append(Change("upstream.tag", spec.upstream.tag, spec.upstream.tag.replace(old_version, new_version)))
    return tuple(changes)


def _line_change(spec: EngineSpec, index: int, image: str, old_version: str, new_version: str) -> Change:
    """The change that moves CUDA line `index`'s base to the new release (its tag holds the version)."""
    key = f"base.cuda_lines.{index}.image"
    repository, tag, _digest = _split_image(image)
    if old_version not in tag:
        raise InputError(f"{spec.spec_path}: {key}: the tag {tag!r} does not contain the version {old_version!r}, "
                         "so the new tag cannot be derived; set it by hand")
    return Change(key, image, f"{repository}:{tag.replace(old_version, new_version)}")


def _read_back(spec: EngineSpec, key: str) -> str | None:
    """The value at a Change's dotted `key` in a parsed spec."""
    if key.startswith("base.cuda_lines."):
        return spec.base.cuda_lines[int(key.split(".")[2])].image
    return {"version": spec.version, "base.image": spec.base.image, "upstream.tag": spec.upstream.tag}[key]


def _value_span(root: yaml.Node, key: str, source: str) -> tuple[int, int]:
    """Character offsets of the scalar at dotted `key` in the composed document (a number indexes a list)."""
    node = root
    for part in key.split("."):
        if isinstance(node, yaml.SequenceNode) and part.isdigit() and int(part) < len(node.value):
            node = node.value[int(part)]
            continue
        if not isinstance(node, yaml.MappingNode):
            raise InputError(f"{source}: {key}: not found as a mapping path")
        found = [value for name, value in node.value if isinstance(name, yaml.ScalarNode) and name.value == part]
        if not found:
            raise InputError(f"{source}: {key}: not found")
        node = found[0]
    if not isinstance(node, yaml.ScalarNode):
        raise InputError(f"{source}: {key}: not a single value")
    return node.start_mark.index, node.end_mark.index


def rewrite(text: str, changes: tuple[Change, ...], source: str) -> str:
    """`text` with each change's value replaced where the YAML holds it, and nothing else touched."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is None:
        raise InputError(f"{source}: empty spec")
    spans = sorted(((*_value_span(root, c.key, source), c) for c in changes), key=lambda item: item[0], reverse=True)
    for start, end, change in spans:
        written = text[start:end]
        if written.count(change.old) != 1:
            raise InputError(f"{source}: {change.key}: {written!r} does not hold {change.old!r} once; edit it by hand")
        text = text[:start] + written.replace(change.old, change.new) + text[end:]
    return text


def bump_spec(spec: EngineSpec, path: Path, newest_release: Callable[[ReleaseFeed], str]) -> tuple[Bump, str | None]:
    """Ask the spec's feed; returns what it found and, when a newer release exists, the spec's new text."""
    feed = spec.upstream.releases
    if feed is None:
        raise InputError(f"{spec.spec_path}: upstream.releases: not set; name the engine's release feed to bump it")
    newest = newest_release(feed)
    changes = plan(spec, newest)
    result = Bump(spec, path, release_of(spec, feed), newest, feeds.describe(feed), changes)
    if not changes:
        return result, None
    text = path.read_text(encoding="utf-8")
    new_text = rewrite(text, changes, spec.spec_path)
    bumped = parse_spec(yaml.safe_load(new_text), spec.spec_path)
    wanted = {c.key: c.new for c in changes}
    if any(_read_back(bumped, key) != value for key, value in wanted.items()):
        raise InputError(f"{spec.spec_path}: the rewritten spec does not read back as the bump intended; "
                         "edit it by hand")
    return result, new_text


def summary(bumps: list[Bump]) -> str:
    """The changes as Markdown, for a pull request's body."""
    lines = ["Engine releases newer than the pinned ones (python -m bakery.upkeep.bump):", ""]
    for bump in bumps:
        if bump.changes:
            lines.append(f"- **{bump.spec.name}** {bump.pinned} -> {bump.newest} ({bump.feed}):")
            lines += [f"  - `{c.key}`: `{c.old}` -> `{c.new}`" for c in bump.changes]
    return "\n".join(lines) + "\n"


@cli_main("bakery.upkeep.bump")
def main(argv: list[str] | None = None) -> int:
    """Bump the chosen specs; exit 0 (changed or not), 2 bad input."""
    parser = argparse.ArgumentParser(prog="python -m bakery.upkeep.bump", description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", action="append", default=[], metavar="NAME", help="an engine (repeatable)")
    parser.add_argument("--all", action="store_true", help="every engine with upstream.releases")
    parser.add_argument("--images-dir", type=Path, metavar="DIR", help="specs from DIR instead of images/")
    parser.add_argument("--dry-run", action="store_true", help="print the changes, write nothing")
    parser.add_argument("--summary", type=Path, metavar="FILE", help="write the changes as Markdown to FILE")
    args = parser.parse_args(argv)
    names = available_engines(args.images_dir) if args.all else list(dict.fromkeys(args.engine))
    if not names:
        raise InputError("no engine chosen: pass --engine NAME or --all")
    directory = images_dir(args.images_dir)
    bumps, writes = [], []
    for name in names:
        spec = load_engine(name, args.images_dir)
        if spec.upstream.releases is None and args.all:
            print(f"{name}: no upstream.releases feed; not followed")
            continue
        bump, new_text = bump_spec(spec, directory / f"{name}.yaml", feeds.newest_release)
        bumps.append(bump)
        if new_text is not None:
            writes.append((bump.path, new_text))
    # Written only once every spec was asked and planned: a bad feed leaves all specs as they were.
    for path, new_text in writes if not args.dry_run else []:
        path.write_text(new_text, encoding="utf-8")
    for bump in bumps:
        print(("(dry run) " if args.dry_run and bump.changes else "") + bump.describe())
    if args.summary:
        args.summary.write_text(summary(bumps), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
