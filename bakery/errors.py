"""Error types that map to build.py's exit codes (2 bad input, 1 build or verification failure)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

Main = Callable[[list[str] | None], int]


class BakeryError(Exception):
    """Base class: every error bakery raises on purpose carries a one-line, user-facing message."""

    exit_code = 1


class InputError(BakeryError):
    """Bad input (spec, option, environment): exit code 2, one line that names the culprit and the fix."""

    exit_code = 2


class BuildError(BakeryError):
    """A build step failed (docker build, base creation, host preparation): exit code 1."""


class VerificationError(BakeryError):
    """The verification gate failed: exit code 1."""


def cli_main(prog: str) -> Callable[[Main], Main]:
    """Decorate a module's `main(argv)`: a BakeryError it raises becomes one line on stderr,
    `prog: message`, and the error's exit code (2 for bad input), never a traceback."""

    def decorate(main: Main) -> Main:
        @functools.wraps(main)
        def run(argv: list[str] | None = None) -> int:
            try:
                return main(argv)
            except BakeryError as exc:
                print(f"{prog}: {exc}", file=sys.stderr)
                return exc.exit_code

        return run

    return decorate
