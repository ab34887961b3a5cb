"""The layers of docs/architecture.md, read from the code (AST), so a shortcut past one fails here.

- Every module of bakery/ is in one layer of LAYERS, and imports (at any depth, in a function too)
  only its own layer and the layers LAYERS lets it; LAYERS is the table docs/architecture.md shows
  (checked here too), it lists every layer after the ones it reads, and it allows nothing unused.
- Docker is reached only through the Docker layer (bakery/docker/*.py): no other module of bakery
  imports the Docker SDK or runs the `docker` CLI, and inside the layer each job is done once
  (one client factory, one build-stream reader, one push loop, the CLI calls in one module).
- Nothing below the CLI takes an argparse namespace: build.py's flags become typed options
  (bakery.recipe.plan.BuildOptions) in bakery/cli.py, and a module's own `main` reads its own flags only.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from bakery.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "bakery"
MODULES = sorted(PACKAGE.rglob("*.py"))
DOCKER_LAYER = {"docker/__init__.py", "docker/engine.py", "docker/build.py", "docker/push.py", "docker/cli.py"}
# Inside the layer: which module alone may do each thing (an SDK call, by attribute, or a subprocess).
ONLY_IN = {
    "from_env": "docker/engine.py",  # the one client factory
    "DockerClient": "docker/engine.py",
    "build": "docker/build.py",  # client.api.build: the one build-stream reader
    "push": "docker/push.py",  # client.api.push: the one push loop
    "import_image": "docker/engine.py",
    "subprocess": "docker/cli.py",  # the docker CLI
}
_RUNNERS = {"run", "Popen", "call", "check_call", "check_output", "system", "which", "execvp", "execv", "spawnvp"}


# The layers, lowest first: layer -> (its packages and modules, the layers it may import). A module
# belongs to the longest entry naming it or a package above it; `bakery` is the package's own
# __init__ (its __version__) only.
LAYERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "core": (("bakery", "bakery.paths", "bakery.errors", "bakery.tracked"), ()),
    "spec": (("bakery.spec",), ("core",)),
    "model": (("bakery.model",), ("core", "spec")),
    "recipe": (("bakery.recipe",), ("core", "spec", "model")),
    "host": (("bakery.host",), ("core", "spec")),
    "docker": (("bakery.docker",), ("core", "spec")),
    "bases": (("bakery.bases",), ("core", "spec", "host", "docker")),
    "build": (("bakery.build",), ("core", "spec", "recipe", "host", "docker", "bases")),
    "upkeep": (("bakery.upkeep",), ("core", "spec")),
    "release": (("bakery.release",), ("core", "spec", "recipe", "host", "docker", "build")),
    "entry": (("bakery.cli",), ("core", "spec", "recipe", "build", "release")),
}
ARCHITECTURE = REPO_ROOT / "docs" / "architecture.md"


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _tree(path: Path) -> ast.AST:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def docker_imports(tree: ast.AST) -> list[str]:
    """`import docker`, `import docker.errors`, `from docker... import ...` (the SDK), by line."""
    found = []
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
        found += [f"line {node.lineno}: import {n}" for n in names if n == "docker" or n.startswith("docker.")]
    return found


def _is_docker_word(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and \
        (node.value == "docker" or node.value.startswith("docker "))


def docker_commands(tree: ast.AST) -> list[str]:
    """Argument lists that start with `docker`, and process runners (subprocess, os, shutil.which)
    given `docker` or a `docker ...` command line."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)) and node.elts and _is_docker_word(node.elts[0]):
            found.append(f"line {node.lineno}: a command starting with 'docker'")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _RUNNERS \
                and node.args and _is_docker_word(node.args[0]):
            found.append(f"line {node.lineno}: {ast.unparse(node.func)}({node.args[0].value!r}, ...)")
    return found


def _uses(tree: ast.AST) -> set[str]:
    """Attribute names and imported modules a module uses (what ONLY_IN is checked against)."""
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            used |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            used.add(node.module.split(".")[0])
    return used


def test_the_layer_modules_exist() -> None:
    assert {_rel(p) for p in MODULES} >= DOCKER_LAYER, "update DOCKER_LAYER to the layer's modules"


@pytest.mark.parametrize("path", [p for p in MODULES if _rel(p) not in DOCKER_LAYER], ids=_rel)
def test_no_module_outside_the_docker_layer_reaches_docker(path: Path) -> None:
    tree = _tree(path)
    found = docker_imports(tree) + docker_commands(tree)
    assert not found, (f"bakery/{_rel(path)} reaches Docker directly ({'; '.join(found)}): call a function of "
                       f"the Docker layer ({', '.join(sorted(DOCKER_LAYER))}) instead")


def test_each_docker_job_is_done_in_one_module_of_the_layer() -> None:
    for name, owner in ONLY_IN.items():
        where = sorted(_rel(p) for p in MODULES if _rel(p) in DOCKER_LAYER and name in _uses(_tree(p)))
        if name in ("build", "push"):  # an attribute many objects have: only the SDK's api.<name> counts
            where = sorted(_rel(p) for p in MODULES if _rel(p) in DOCKER_LAYER
                           and f"api.{name}(" in p.read_text(encoding="utf-8"))
        assert where in ([owner], []), f"{name}: done in {where}; only {owner} may"
        assert where == [owner], f"{owner} no longer does {name}: update ONLY_IN"


def test_nothing_below_the_cli_takes_an_argparse_namespace() -> None:
    found = []
    for path in MODULES:
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _rel(path) != "cli.py":
                annotated = [a for a in [*node.args.args, *node.args.kwonlyargs]
                             if a.annotation is not None and "Namespace" in ast.unparse(a.annotation)]
                found += [f"bakery/{_rel(path)}: {node.name}({a.arg})" for a in annotated]
    assert not found, f"typed options (bakery.recipe.plan.BuildOptions), not an argparse namespace: {found}"


def test_the_checks_can_fail() -> None:
    planted = ast.parse('import docker.errors\nfrom docker import errors\nimport subprocess, shutil\n'
                        'subprocess.run(["docker", "manifest", "inspect", ref])\nshutil.which("docker")\n'
                        'os.system("docker push x")\ncmd = ("docker", "buildx")\nok = ["dockerd", "x"]\n')
    assert [hit.split(":")[0] for hit in docker_imports(planted)] == ["line 1", "line 2"]
    assert sorted(hit.split(":")[0] for hit in docker_commands(planted)) == ["line 4", "line 5", "line 6", "line 7"]


def module_name(path: Path) -> str:
    """bakery/recipe/plan.py -> bakery.recipe.plan; a package's __init__.py is the package."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str | None:
    """The layer whose longest entry is `module` or a package above it (`bakery` only exactly)."""
    best = None
    for layer, (entries, _) in LAYERS.items():
        for entry in entries:
            if (module == entry or (entry != "bakery" and module.startswith(entry + "."))) \
                    and (best is None or len(entry) > len(best[1])):
                best = (layer, entry)
    return best[0] if best else None


def _is_module(name: str) -> bool:
    where = PACKAGE.parent.joinpath(*name.split("."))
    return where.is_dir() or where.with_suffix(".py").is_file()


def bakery_imports(module: str, tree: ast.AST, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, module) of every import of bakery in a module, anywhere in it; `from bakery.x import y`
    counts as bakery.x.y when y is a module of bakery (so `from bakery.spec import secrets` is spec's)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "bakery"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] == "bakery":
                found += [(node.lineno, f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base)
                          for a in node.names]
    return found


def forbidden_imports(path: Path, tree: ast.AST) -> list[str]:
    """Each import of `path` that its layer may not make, as `bakery/x.py:line: ...`."""
    module = module_name(path)
    layer = layer_of(module)
    allowed = {layer, *LAYERS[layer][1]} if layer else set()
    found = []
    for line, imported in bakery_imports(module, tree, path.name == "__init__.py"):
        other = layer_of(imported)
        if other not in allowed:
            found.append(f"bakery/{_rel(path)}:{line}: imports {imported} (layer {other}), which layer {layer} "
                         f"may not import (it may: {', '.join(LAYERS[layer][1]) or 'nothing of bakery'})")
    return found


def test_every_module_is_in_one_layer() -> None:
    unplaced = [_rel(p) for p in MODULES if layer_of(module_name(p)) is None]
    assert not unplaced, f"modules in no layer of LAYERS (add them, and to docs/architecture.md): {unplaced}"


def test_each_layer_reads_only_layers_listed_before_it() -> None:
    order = list(LAYERS)
    for layer, (_, may) in LAYERS.items():
        later = [m for m in may if order.index(m) >= order.index(layer)]
        assert not later, f"LAYERS: {layer} may import {later}, which are not below it"


def test_no_module_imports_past_its_layer() -> None:
    found = [hit for path in MODULES for hit in forbidden_imports(path, _tree(path))]
    assert not found, "imports past the layers of docs/architecture.md:\n" + "\n".join(found)


def test_the_layers_allow_nothing_unused() -> None:
    used: dict[str, set[str]] = {layer: set() for layer in LAYERS}
    for path in MODULES:
        module = module_name(path)
        for _, imported in bakery_imports(module, _tree(path), path.name == "__init__.py"):
            used[layer_of(module)].add(layer_of(imported))
    unused = {layer: sorted(set(may) - used[layer]) for layer, (_, may) in LAYERS.items() if set(may) - used[layer]}
    assert not unused, f"LAYERS (and docs/architecture.md) allow imports no module makes; drop them: {unused}"


def documented_layers(text: str, marker: str = "<!-- layers table: tests/unit/test_layers.py LAYERS -->"
                      ) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """The layer table after `marker` in docs/architecture.md: `| layer | `modules` | may import |` rows."""
    table = text.split(marker, 1)[1].split("\n\n", 1)[0]
    rows = {}
    for line in table.strip().splitlines()[2:]:
        layer, modules, may = (cell.strip() for cell in line.strip("|").split("|"))
        rows[layer] = (tuple(re.findall(r"`([\w.]+)`", modules)),
                       () if may == "-" else tuple(m.strip() for m in may.split(",")))
    return rows


def test_the_architecture_doc_shows_these_layers() -> None:
    assert documented_layers(ARCHITECTURE.read_text(encoding="utf-8")) == LAYERS, \
        "docs/architecture.md's layer table and LAYERS differ: change both"


def test_the_layer_check_can_fail() -> None:
    planted = ast.parse("from bakery.paths import REPO_ROOT\nfrom bakery.spec import engine_spec\n"
                        "def f():\n    from bakery.docker.engine import client\n"
                        "    import bakery.release.ci\n    from . import plan\n")
    hits = forbidden_imports(PACKAGE / "recipe" / "render.py", planted)
    assert [h.split(": imports ")[0] for h in hits] == ["bakery/recipe/render.py:4", "bakery/recipe/render.py:5"], hits
    assert "imports bakery.docker.engine (layer docker), which layer recipe may not import" in hits[0]
    assert layer_of("bakery.cli") == "entry" and layer_of("bakery.clix") is None and layer_of("bakery.x") is None
