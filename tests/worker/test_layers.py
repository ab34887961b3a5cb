"""The worker's packages by job, read from the code (AST): each imports only the packages its row of
LAYERS allows, rows come after what they read, no row allows what nobody imports, no folder holds
more than MAX_MODULES modules, and docs/architecture.md shows this table.

The worker runs with worker/ as its import root (start_server.sh), so a package is imported by its
own name (`from policy import guards`); relative imports are not used.
"""

from __future__ import annotations

import ast
from pathlib import Path

from bakery.paths import REPO_ROOT
from tests.unit.test_layers import documented_layers

WORKER = REPO_ROOT / "worker"
MAX_MODULES = 12  # per folder: a newcomer reads a folder's names at a glance
# The packages, lowest first: package -> the packages it may import. `lock` is the dev tool that
# regenerates requirements.txt (never in an image's import path).
LAYERS: dict[str, tuple[str, ...]] = {
    "config": (),
    "control": (),
    "logs": ("config", "control"),
    "engine": ("config",),
    "policy": ("config", "control", "engine", "logs"),
    "front": ("config", "engine", "policy"),
    "app": ("config", "control", "engine", "front", "logs", "policy"),
    "boot": ("config", "logs"),
    "workers": ("app", "config"),
    "lock": (),
}
MARKER = "<!-- worker layers table: tests/worker/test_layers.py LAYERS -->"


def modules() -> list[Path]:
    return sorted(p for p in WORKER.rglob("*.py") if "__pycache__" not in p.parts)


def package_of(path: Path) -> str:
    rel = path.relative_to(WORKER)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def worker_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, package) of every import, anywhere in the module, of one of the worker's packages."""
    found = []
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
        found += [(node.lineno, name.split(".")[0]) for name in names if name.split(".")[0] in LAYERS]
    return found


def forbidden(path: Path, tree: ast.AST) -> list[str]:
    own = package_of(path)
    allowed = {own, *LAYERS.get(own, ())}
    return [f"worker/{path.relative_to(WORKER)}:{line}: imports {package} ({own} may import: "
            f"{', '.join(LAYERS.get(own, ())) or 'none'})" for line, package in worker_imports(tree)
            if package not in allowed]


def test_every_module_is_in_a_layer() -> None:
    unplaced = sorted({package_of(p) for p in modules()} - set(LAYERS))
    assert not unplaced, f"worker/ folders or modules in no row of LAYERS (add them, and to the doc): {unplaced}"


def test_each_layer_reads_only_layers_before_it() -> None:
    order = list(LAYERS)
    later = {layer: [m for m in may if order.index(m) >= order.index(layer)] for layer, may in LAYERS.items()}
    assert not any(later.values()), f"LAYERS reads upward: {later}"


def test_no_module_imports_past_its_layer() -> None:
    found = [hit for path in modules() for hit in forbidden(path, ast.parse(path.read_text(encoding="utf-8")))]
    assert not found, "imports past the worker's layers:\n" + "\n".join(found)


def test_the_layers_allow_nothing_unused() -> None:
    used: dict[str, set[str]] = {layer: set() for layer in LAYERS}
    for path in modules():
        used[package_of(path)] |= {p for _, p in worker_imports(ast.parse(path.read_text(encoding="utf-8")))}
    unused = {layer: sorted(set(may) - used[layer]) for layer, may in LAYERS.items() if set(may) - used[layer]}
    assert not unused, f"LAYERS allow imports no module makes; drop them: {unused}"


def test_no_folder_holds_more_than_the_most_modules() -> None:
    counts: dict[Path, int] = {}
    for path in modules():
        if path.name != "__init__.py":
            counts[path.parent] = counts.get(path.parent, 0) + 1
    crowded = {str(d.relative_to(REPO_ROOT)): n for d, n in counts.items() if n > MAX_MODULES}
    assert not crowded, f"folders with more than {MAX_MODULES} modules (split them by job): {crowded}"


def test_each_package_says_what_it_owns() -> None:
    silent = [str(p.relative_to(REPO_ROOT)) for p in sorted(WORKER.glob("*/__init__.py"))
              if p.parent.name in LAYERS and not ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))]
    assert not silent, f"packages without a docstring saying what they own: {silent}"


def test_the_architecture_doc_shows_these_layers() -> None:
    shown = documented_layers((REPO_ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"), MARKER)
    assert {layer: may for layer, (_, may) in shown.items()} == LAYERS, \
        "docs/architecture.md's worker layer table and LAYERS differ: change both"


def test_the_layer_check_can_fail() -> None:
    planted = ast.parse("from config import table\nfrom app import core\ndef f():\n    import front.wire\n"
                        "    from . import x\n")
    hits = forbidden(WORKER / "policy" / "guards.py", planted)
    assert [h.split(": imports ")[0] for h in hits] == ["worker/policy/guards.py:2", "worker/policy/guards.py:4"], hits
