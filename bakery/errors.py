"""Error types that map to build.py's exit codes (2 bad input, 1 build or verification failure)."""


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
