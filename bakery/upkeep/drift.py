"""Log-grammar drift: does every baked load, error and stage line still occur in the engine's pinned source?

The worker becomes ready or errored only by matching the engine's own log lines, so a line an engine
stopped printing turns into a 30-minute wait; a stage line it stopped printing silently drops a stage from
the time-to-ready split (docs/cold-start.md). Each spec names its source (`source`, or
`upstream.repository`) and pinned version (`version`, or `upstream.tag`); this module looks for every
line of MODEL_LOAD_LOG_MSG, MODEL_ERROR_LOG_MSGS and, where the spec bakes them, the stage lines
BAKERY_LOAD_BEGIN_LOG_MSGS and BAKERY_WEIGHTS_LOADED_LOG_MSGS in that source, by the same rules:

- a line listed in `upstream.lines` with an `origin` is written by someone else (bakery's entry point,
  supervisord, Python, uvicorn) and is reported, not looked for; the engine's exit line
  (`INFO exited: <name>`) is always bakery's own;
- a line listed with a `pattern` is found by that regular expression over each file's whole text (for
  text the source builds, e.g. an exception Python prints as `RuntimeError: Engine ...`, or a line a C
  macro prefixes with the function's name); it is reported where its group `at` begins if it has one
  (a pattern that reads through a function to the call), else where the match begins;
- a line listed with a `file` counts only in a source file whose path ends with it (the file that prints
  it), so a copy of the line elsewhere (an example app, another server in the same tree) cannot hide its
  removal from the engine's own server;
- every other line must occur literally somewhere in the source.

The source may be a repository checkout or a wheel's package tree (`vllm/` without the repository root):
a declared `file` is matched by the end of its path, so the same declaration holds for both.

    python -m bakery.upkeep.drift --engine vllm --source-dir ~/src/vllm     check against a checkout
    python -m bakery.upkeep.drift --all --fetch                             clone each pinned tag (CI, network)

Exit codes: 0 every line found or declared, 1 a line is gone (named with its spec and variable),
2 bad input.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bakery.errors import InputError, cli_main
from bakery.spec.engine_spec import DRIFT_VARS, EXIT_LINE, EngineSpec, available_engines, load_engine

# Files a log line can be written from; everything else (weights, images, docs) is skipped.
SOURCE_SUFFIXES = frozenset({".py", ".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".cu", ".cuh", ".rs", ".go",
                             ".js", ".ts", ".java", ".kt", ".m", ".mm", ".swift", ".zig"})
# Tests and docs quote log lines without printing them: a line found only there has drifted.
SKIP_DIRS = frozenset({".git", "node_modules", "__pycache__", "docs", "tests", "test", "benchmarks"})
MAX_FILE_BYTES = 4 * 1024 * 1024
# Where --fetch clones from: https://github.com/<owner>/<name>.git; overridable for tests and mirrors.
GIT_BASE_VAR = "BAKERY_DRIFT_GIT_BASE"
GIT_BASE = "https://github.com"


@dataclass(frozen=True)
class Finding:
    """Where one baked line comes from: a place in the source, a declared origin, or nowhere."""

    variable: str
    line: str
    how: str  # "literal", "pattern" or "origin"
    where: str | None  # "path:line" in the source, or the origin; None when not found

    @property
    def found(self) -> bool:
        return self.where is not None

    def describe(self) -> str:
        """One line for the report."""
        if self.how == "origin":
            return f"declared  {self.line!r}  written by {self.where}"
        if self.where is None:
            return f"MISSING   {self.line!r}  ({self.variable}, {self.how})"
        return f"found     {self.line!r}  {self.where} ({self.how})"


def repository(spec: EngineSpec) -> str:
    """The engine's GitHub owner/name: upstream.repository, else taken from a GitHub `source` URL."""
    if spec.upstream.repository:
        return spec.upstream.repository
    match = re.fullmatch(r"https://github\.com/([^/]+/[^/]+?)(?:\.git)?/?", spec.source)
    if not match:
        raise InputError(f"{spec.spec_path}: upstream.repository: not set and source {spec.source!r} is not a "
                         "GitHub URL; set it to the engine's owner/name")
    return match.group(1)


def tag(spec: EngineSpec) -> str:
    """The git tag of the pinned release: upstream.tag, else version."""
    return spec.upstream.tag or spec.version


def source_files(root: Path) -> Iterator[Path]:
    """The files of a source tree a log line could be written from, in a stable order."""
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            path = Path(directory, name)
            if path.suffix in SOURCE_SUFFIXES and not path.is_symlink():
                yield path


def _read(path: Path) -> str | None:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return None
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _in_file(root: Path, path: Path, file: str | None) -> bool:
    """Whether `path` is the declared file: its path below `root` ends with `file`, component by component."""
    if file is None:
        return True
    parts, want = path.relative_to(root).parts, tuple(file.split("/"))
    return parts[-len(want):] == want


def _search(root: Path, texts: dict[Path, str], needle: str | re.Pattern[str], file: str | None = None) -> str | None:
    for path, text in texts.items():
        if not _in_file(root, path, file):
            continue
        if isinstance(needle, str):
            index = text.find(needle)
        else:
            match = needle.search(text)
            # A pattern that reads its way to the line (through a function's body, say) names the line `at`.
            index = -1 if match is None else match.start("at" if "at" in needle.groupindex else 0)
        if index >= 0:
            return f"{path.relative_to(root)}:{text.count(chr(10), 0, index) + 1}"
    return None


def check(spec: EngineSpec, source_dir: Path) -> list[Finding]:
    """Look for each baked load, error and stage line of `spec` in the source tree at `source_dir`."""
    if not source_dir.is_dir():
        raise InputError(f"--source-dir {source_dir}: not a directory (a checkout of {repository(spec)} at "
                         f"{tag(spec)})")
    texts = {path: text for path in source_files(source_dir) if (text := _read(path)) is not None}
    exit_line = EXIT_LINE.format(name=spec.name)
    findings = []
    seen: set[str] = set()
    for variable in DRIFT_VARS:
        for line in spec.bake.env.get(variable, []):  # the stage lines are optional
            if line in seen:
                continue
            seen.add(line)
            declared = spec.upstream.lines.get(line)
            if line == exit_line:
                findings.append(Finding(variable, line, "origin", "bakery (the entry point, when the program exits)"))
            elif declared is not None and declared.origin is not None:
                findings.append(Finding(variable, line, "origin", declared.origin))
            elif declared is not None and declared.pattern is not None:
                where = _search(source_dir, texts, re.compile(declared.pattern), declared.file)
                findings.append(Finding(variable, line, "pattern", where))
            elif declared is not None:
                findings.append(Finding(variable, line, "literal", _search(source_dir, texts, line, declared.file)))
            else:
                findings.append(Finding(variable, line, "literal", _search(source_dir, texts, line)))
    return findings


def fetch(spec: EngineSpec, workdir: Path) -> Path:
    """Shallow-clone the engine's pinned tag into `workdir` (reused when already there); returns the tree."""
    repo, pinned = repository(spec), tag(spec)
    target = workdir / f"{spec.name}-{pinned}"
    if (target / ".git").is_dir():
        return target
    url = f"{os.environ.get(GIT_BASE_VAR, GIT_BASE).rstrip('/')}/{repo}.git"
    proc = subprocess.run(["git", "clone", "--quiet", "--depth", "1", "--branch", pinned, url, str(target)],
                          capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        detail = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
        raise InputError(f"{spec.spec_path}: cannot clone {url} at tag {pinned!r} (version / upstream.tag): {detail}")
    return target


def _how(spec: EngineSpec, finding: Finding) -> str:
    """How a missing line was looked for, as the failure names it."""
    declared = spec.upstream.lines.get(finding.line)
    how = f"pattern {declared.pattern!r}" if finding.how == "pattern" and declared else "literally"
    if declared is not None and declared.file is not None:
        how += f" in {declared.file}"
    return how


def report(spec: EngineSpec, findings: list[Finding]) -> tuple[list[str], list[str]]:
    """The report lines and, separately, one failure line per line that is gone."""
    head = f"{spec.name}: {repository(spec)}@{tag(spec)}"
    lines = [head, *(f"  {f.describe()}" for f in findings)]
    failures = [f"{spec.spec_path}: {f.variable}: {f.line!r} no longer occurs in {repository(spec)}@{tag(spec)} "
                f"({_how(spec, f)}); fix the line, or declare where it comes from in upstream.lines"
                for f in findings if not f.found]
    return lines, failures


@cli_main("bakery.upkeep.drift")
def main(argv: list[str] | None = None) -> int:
    """Check the chosen engines; exit 0 clean, 1 drift, 2 bad input."""
    parser = argparse.ArgumentParser(prog="python -m bakery.upkeep.drift", description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", action="append", default=[], metavar="NAME", help="an engine (repeatable)")
    parser.add_argument("--all", action="store_true", help="every engine")
    parser.add_argument("--images-dir", type=Path, metavar="DIR", help="specs from DIR instead of images/")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--source-dir", type=Path, metavar="DIR", help="a checkout of the one chosen engine")
    where.add_argument("--fetch", action="store_true",
                       help="git clone --depth 1 --branch <tag> each engine's source (needs the network)")
    parser.add_argument("--workdir", type=Path, metavar="DIR", help="where --fetch clones (default: a temp dir)")
    args = parser.parse_args(argv)
    names = available_engines(args.images_dir) if args.all else args.engine
    if not names:
        raise InputError("no engine chosen: pass --engine NAME or --all")
    if args.source_dir and len(names) != 1:
        raise InputError("--source-dir is one engine's checkout: choose exactly one --engine")
    specs = [load_engine(name, args.images_dir) for name in dict.fromkeys(names)]
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bakery-drift-") as scratch:
        for spec in specs:
            tree = args.source_dir or fetch(spec, args.workdir or Path(scratch))
            lines, gone = report(spec, check(spec, tree))
            print("\n".join(lines))
            failures += gone
    for failure in failures:
        print(f"bakery.upkeep.drift: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
