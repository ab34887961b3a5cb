"""The one seam to the SDK (control/sdk_seam.py): its hook table holds on the locked SDK, a
missing hook stops the worker with exit 4 naming it, and no other worker module names an SDK private.

The rule for "names an SDK private", checked on the source of every module under worker/ but
sdk_seam.py (boot/ aside: PID 1 imports no SDK):
- an attribute access `x._name` (a name matching `^_[A-Za-z]`, so not a dunder) is allowed only when
  the receiver is `self` or `cls`, or a standard-library module the file imports (`os._exit`), or
  when bakery's worker code itself defines `_name` (a module-level or class-level name, or an
  attribute it assigns on `self`) and `_name` is not an SDK hook's;
- no string constant is a name-mangled name (`_Class__name`) or a private hook attribute of HOOKS
  (so `getattr(obj, "_request_reject")` counts too).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from control import sdk_seam
from tests.worker.helpers import WORKER_DIR, baked_facts, free_port_pair

SEAM = WORKER_DIR / "control" / "sdk_seam.py"
PRIVATE = re.compile(r"^_[A-Za-z]")
MANGLED = re.compile(r"^_[A-Za-z][A-Za-z0-9]*__[A-Za-z0-9_]+$")
HOOK_PRIVATES = {part for h in sdk_seam.HOOKS for part in h.attr.split(".") if PRIVATE.match(part)}
ENV = {"CONTAINER_ID": "5", "REPORT_ADDR": "http://127.0.0.1:9", "PUBLIC_IPADDR": "203.0.113.7",
       "USE_SSL": "false", "UNSECURED": "false"}


def own_names(tree: ast.AST) -> set[str]:
    """The private names a module defines: module- and class-level names, and `self.<name> = ...`."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id == "self"):
            names.add(node.attr)
    return {n for n in names if PRIVATE.match(n)}


def stdlib_modules(tree: ast.AST) -> set[str]:
    """The names a module binds to standard-library modules (`import os`, `import os.path as p`)."""
    return {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
            for alias in node.names if alias.name.split(".")[0] in sys.stdlib_module_names}


def private_uses(tree: ast.AST, allowed: set[str]) -> list[str]:
    found = []
    own_receivers = {"self", "cls", *stdlib_modules(tree)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and PRIVATE.match(node.attr):
            receiver = node.value.id if isinstance(node.value, ast.Name) else None
            if receiver in own_receivers and node.attr not in HOOK_PRIVATES:
                continue
            if node.attr in allowed:
                continue
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                MANGLED.match(node.value) or node.value in HOOK_PRIVATES):
            found.append(f"line {node.lineno}: {node.value!r}")
    return found


def worker_modules() -> dict[Path, ast.AST]:
    return {path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(WORKER_DIR.rglob("*.py"))
            if path.relative_to(WORKER_DIR).parts[0] != "boot"}


def test_only_the_seam_names_an_sdk_private() -> None:
    modules = worker_modules()
    bakery_own = set().union(*(own_names(tree) for tree in modules.values())) - HOOK_PRIVATES
    offenders = {}
    for path, tree in modules.items():
        if path == SEAM:
            continue
        uses = private_uses(tree, bakery_own)
        if uses:
            offenders[str(path.relative_to(WORKER_DIR))] = uses
    assert offenders == {}


def seam_privates(tree: ast.AST) -> list[str]:
    """Where a module reaches the seam's own privates (`sdk_seam._find`, `from control.sdk_seam import _put`):
    a hook taken by its key, not through the adapter's named interface."""
    found = [f"line {node.lineno}: sdk_seam.{node.attr}" for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
             and node.value.id == "sdk_seam" and node.attr.startswith("_")]
    found += [f"line {node.lineno}: import {alias.name}" for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("sdk_seam")
              for alias in node.names if alias.name.startswith("_")]
    return found


def test_other_modules_use_the_adapters_names_only() -> None:
    """No worker module but the seam takes an SDK point by its hook key: each goes through a named method."""
    offenders = {str(path.relative_to(WORKER_DIR)): uses for path, tree in worker_modules().items()
                 if path != SEAM and (uses := seam_privates(tree))}
    assert offenders == {}


@pytest.mark.parametrize("source", ["sdk_seam._put(backend, 'x', f)\n",
                                    "from control.sdk_seam import _find\n"])
def test_the_adapter_rule_sees_each_form(source: str) -> None:
    assert seam_privates(ast.parse(source)), source


@pytest.mark.parametrize("source", [
    "backend._Backend__call_backend = f\n",
    "x = metrics._model_loaded\n",
    "getattr(metrics, '_model_loaded')\n",
    "getattr(m, '_Metrics__send_metrics_and_reset')\n",
    "self._fetch_pubkey = f\n",
])
def test_the_rule_sees_each_form(source: str) -> None:
    assert private_uses(ast.parse(source), set()), source


def test_the_rule_lets_bakery_own_privates_pass() -> None:
    tree = ast.parse("class A:\n    def __init__(self):\n        self._real = 1\n\ndef f(a):\n    return a._real\n")
    assert private_uses(tree, own_names(tree)) == []


def test_every_hook_row_is_complete() -> None:
    assert len(sdk_seam.BY_KEY) == len(sdk_seam.HOOKS)
    for hook in sdk_seam.HOOKS:
        assert hook.owner in sdk_seam.INSTANCE_OWNERS or hook.owner.startswith(("vastai.", "aiohttp.")), hook
        assert hook.use in ("wrap", "replace", "call", "read", "set"), hook
        assert hook.users and hook.why and hook.checked == sdk_seam.SDK_VERSION, hook


def test_the_seam_is_checked_against_the_locked_sdk() -> None:
    pins = (WORKER_DIR / "requirements.txt").read_text(encoding="utf-8")
    assert f"vastai=={sdk_seam.SDK_VERSION} " in pins or f"vastai=={sdk_seam.SDK_VERSION}\n" in pins


def run_in_worker(worker_python: Path, code: str, port: int, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(WORKER_DIR), "PYTHONNOUSERSITE": "1",
           "TMPDIR": str(tmp), **ENV, "WORKER_PORT": str(port), "VAST_TCP_PORT_" + str(port): "41234",
           **baked_facts("llama"), "MODEL_LOG": str(tmp / "engine.log")}
    return subprocess.run([str(worker_python), "-c", code], capture_output=True, text=True, env=env,
                          timeout=120, check=False, cwd=tmp)


MAKE_WORKER = """
import json, sys, vastai
from workers.llama.worker import DEFAULTS
from app import core
from app import worker_config
from config import table
from control import sdk_seam
settings = worker_config.load_settings(DEFAULTS, table.snapshot())
sdk_config, _ = core.build_worker_config(settings, vastai, ["word"])
worker = vastai.Worker(sdk_config)
"""


def test_every_hook_exists_on_the_locked_sdk(worker_python: Path, tmp_path: Path) -> None:
    """Each row of HOOKS is on a real Worker (optional rows too), and what the worker wraps, replaces
    or calls is callable."""
    code = MAKE_WORKER + """
import functools
owners = {"Backend": worker.backend, "Metrics": worker.backend.metrics}
out = {"missing": [h.key for h in sdk_seam.missing(worker, required_only=False)], "not_callable": []}
for h in sdk_seam.HOOKS:
    if h.use in ("wrap", "replace", "call") and h.key not in ("web", "engine_session"):
        obj = owners.get(h.owner) or sys.modules[h.owner]
        value = sdk_seam._find(obj, h.key, "test") if h.owner in owners else \
            functools.reduce(getattr, h.attr.split("."), obj)
        if not callable(value) and not hasattr(value, "set"):
            out["not_callable"].append(h.key)
print(json.dumps(out))
"""
    result = run_in_worker(worker_python, code, free_port_pair(), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == {"missing": [], "not_callable": []}


PLANTED = {
    "send_report": ("vastai.serverless.server.lib.metrics", "Metrics", "_Metrics__send_metrics_and_reset"),
    "fetch_pubkey": ("vastai.serverless.server.lib.backend", "Backend", "_fetch_pubkey"),
    "open_file": ("vastai.serverless.server.lib.backend", None, "open_file"),
}


@pytest.mark.parametrize("key", sorted(PLANTED))
def test_a_missing_hook_stops_the_worker_with_exit_4_naming_it(key: str, worker_python: Path) -> None:
    """The worker's own start (core.run) with one hook taken out of the SDK: exit 4, before serving,
    one line naming the hook and who uses it."""
    module, cls, attr = PLANTED[key]
    target = f"getattr(importlib.import_module({module!r}), {cls!r})" if cls else \
        f"importlib.import_module({module!r})"
    code = f"""
import importlib, vastai
delattr({target}, {attr!r})
from workers.llama.worker import DEFAULTS
from app import core
core.run(DEFAULTS)
"""
    with tempfile.TemporaryDirectory() as tmp:
        result = run_in_worker(worker_python, code, free_port_pair(), Path(tmp))
    assert result.returncode == 4, (result.stdout[-2000:], result.stderr[-3000:])
    errors = [line for line in result.stderr.splitlines() if line.startswith("bakery-worker: error: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    hook: Any = sdk_seam.hook(key)
    assert hook.where in errors[0] and f"hook {key!r}" in errors[0] and "sdk_seam.py" in errors[0], errors
    assert all(user in errors[0] for user in hook.users), errors


def test_the_front_imports_nothing_of_the_sdk() -> None:
    """policy/rules.py (bakery's HTTP policy) takes what it needs as values and callables: no SDK module, not
    even through the seam, and no SDK module's name."""
    tree = ast.parse((WORKER_DIR / "policy" / "rules.py").read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert all(name.split(".")[0] in sys.stdlib_module_names or name == "__future__" for name in imported), imported
    assert not [node.value for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and "vastai" in node.value]
