"""The committed rendered Dockerfiles (`rendered/<engine>/Dockerfile`), reviewed like docker-library's.

Every engine's Dockerfile for its production base is generated into the repository, so a template or
spec change shows up in review as a Dockerfile diff. `python -m bakery.recipe.rendered` (`make render`)
regenerates them; `--check` (and tests/unit/test_rendered_current.py) fails, naming each file and the
command, when one was not regenerated.

    python -m bakery.recipe.rendered            rewrite rendered/ from images/ and templates/
    python -m bakery.recipe.rendered --check    exit 1 listing every stale, missing or orphaned file
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from bakery.errors import cli_main
from bakery.paths import RENDERED_DIR
from bakery.recipe.render import render
from bakery.spec.engine_spec import available_engines, display_path, load_engine

REGENERATE = "make render (python -m bakery.recipe.rendered)"
# The first line of every committed file: a reviewer and an editor both see it is generated.
MARK = (f"# GENERATED from images/<engine>.yaml and templates/ for the production base: do not edit; "
        f"run `{REGENERATE}`.\n")


@dataclass(frozen=True)
class Stale:
    """One committed file that does not match what the specs and templates render."""

    path: Path
    why: str

    def __str__(self) -> str:
        return f"{display_path(self.path)}: {self.why}; run `{REGENERATE}` and commit it"


def expected(images_dir: Path | None = None) -> dict[str, str]:
    """Each engine's committed Dockerfile text: the mark, then the production-base render."""
    return {name: MARK + render(load_engine(name, images_dir)).dockerfile for name in available_engines(images_dir)}


def regenerate(directory: Path = RENDERED_DIR, images_dir: Path | None = None) -> list[Path]:
    """Rewrite `directory/<engine>/Dockerfile` for every engine and remove directories of engines that
    are gone; returns the files written."""
    wanted = expected(images_dir)
    directory.mkdir(parents=True, exist_ok=True)
    for child in directory.iterdir():
        if child.is_dir() and child.name not in wanted:
            shutil.rmtree(child)
    written = []
    for name, text in wanted.items():
        target = directory / name / "Dockerfile"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        written.append(target)
    return written


def stale(directory: Path = RENDERED_DIR, images_dir: Path | None = None) -> list[Stale]:
    """Every committed file that is missing, out of date, or belongs to no engine."""
    wanted = expected(images_dir)
    problems = []
    for name, text in wanted.items():
        target = directory / name / "Dockerfile"
        if not target.is_file():
            problems.append(Stale(target, f"missing (engine {name} has no committed Dockerfile)"))
        elif target.read_text(encoding="utf-8") != text:
            problems.append(Stale(target, f"out of date with images/{name}.yaml and templates/"))
    if directory.is_dir():
        for child in sorted(directory.iterdir()):
            if child.name not in wanted:
                problems.append(Stale(child, "belongs to no engine in images/"))
    return problems


@cli_main("bakery.recipe.rendered")
def main(argv: list[str] | None = None) -> int:
    """Regenerate rendered/ or, with --check, report what is stale (exit 1)."""
    parser = argparse.ArgumentParser(prog="python -m bakery.recipe.rendered", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a file is stale")
    parser.add_argument("--dir", type=Path, default=RENDERED_DIR, help="where the files are (default: rendered/)")
    args = parser.parse_args(argv)
    if args.check:
        problems = stale(args.dir)
        for problem in problems:
            print(f"bakery.recipe.rendered: {problem}", file=sys.stderr)
        return 1 if problems else 0
    for path in regenerate(args.dir):
        print(f"wrote {display_path(path)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
