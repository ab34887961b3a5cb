"""The worker's and the entry point's lines reach the container's output whole, one write each.

The worker runs unbuffered (start_server.sh sets PYTHONUNBUFFERED), where print() writes a line and
its newline separately; the entry point writes to the same pipe, and a line of its once landed
between a worker line and its newline, glued onto it (the gate then missed that stage line).
"""

from __future__ import annotations

import ast
import io

from app import core
from tests.worker.helpers import WORKER_DIR


class Recording(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


def test_a_line_is_one_write_with_its_newline() -> None:
    stream = Recording()
    core.line_out(stream, "bakery-worker: stage benchmark_begins at 1.000")
    assert stream.writes == ["bakery-worker: stage benchmark_begins at 1.000\n"]


def test_no_module_of_the_worker_or_the_boot_prints() -> None:
    """Only the demo client (run by a person, on their machine) may print()."""
    offenders = []
    for path in sorted(WORKER_DIR.rglob("*.py")):
        if path.name == "client.py" or path.name == "lock.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                offenders.append(f"{path.relative_to(WORKER_DIR)}:{node.lineno}")
    assert offenders == []
