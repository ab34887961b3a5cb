"""supervisord's engine program: exec the engine's argv that the entry point wrote, output to its log.

Usage (the only form supervisord's ini holds): `python -I launch.py /run/bakery/engine.json`.
The JSON file holds {"argv": [...], "log": "/abs/path"}. The argv is passed to execvp as a list, so
no shell and no ini parser ever sees the launch values: quotes, `;`, `#`, `%`, spaces and any
unicode reach the engine exactly. The engine replaces this process (same pid), so supervisord's
signals and exit status are the engine's own. Standard library only.
"""

from __future__ import annotations

import errno
import json
import os
import sys


def load(path: str) -> tuple[list[str], str]:
    """Read and check the engine file the entry point wrote."""
    with open(path, encoding="ascii") as handle:
        data = json.load(handle)
    argv, log = data.get("argv"), data.get("log")
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        raise ValueError("argv is not a non-empty list of strings")
    if not (isinstance(log, str) and log.startswith("/")):
        raise ValueError("log is not an absolute path")
    return argv, log


def main(args: list[str]) -> int:
    """Exec the engine; returns only on failure (127 not found, 126 not runnable, 2 bad engine file)."""
    if len(args) != 1:
        print("launch.py: usage: launch.py ENGINE_JSON", file=sys.stderr)
        return 2
    try:
        argv, log = load(args[0])
    except (OSError, ValueError) as exc:
        print(f"bakery: cannot read the engine's command from {args[0]}: {exc}", file=sys.stderr)
        return 2
    try:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        print(f"bakery: cannot open the engine's log {log!r}: {exc.strerror}", file=sys.stderr)
        return 2
    console = os.dup(2)  # kept (not inherited by the engine) to report an exec failure to the container
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        os.execvp(argv[0], argv)  # noqa: S606 - an argv, on purpose: no shell may see the values
    except OSError as exc:
        line = f"bakery: cannot start the engine {argv[0]!r}: {exc.strerror}\n".encode("utf-8", "backslashreplace")
        os.write(2, line)  # MODEL_LOG, next to supervisord's exit line that watch.py appends
        os.write(console, line)
        return 127 if exc.errno == errno.ENOENT else 126
    return 1  # not reached: execvp returns only by raising


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
