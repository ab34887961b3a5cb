"""The layers of docs/architecture.md, read from the code (AST), so a shortcut past one fails here.

- Docker is reached only through the Docker layer (bakery/docker/*.py): no other module of bakery
  imports the Docker SDK or runs the `docker` CLI, and inside the layer each job is done once
  (one client factory, one build-stream reader, one push loop, the CLI calls in one module).
- Nothing below the CLI takes an argparse namespace: build.py's flags become typed options
  (bakery.recipe.plan.BuildOptions) in bakery/cli.py, and a module's own `main` reads its own flags only.
"""

from __future__ import annotations

import ast
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
