"""worker/requirements.txt is what worker/lock.py generates: exact pins, hashes, reasons (offline)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from bakery.host import downloads as worker_env
from tests.worker.helpers import WORKER_DIR

REQUIREMENTS = WORKER_DIR / "requirements.txt"


def load_lock() -> ModuleType:
    """worker/lock.py as a module (it is a script, not part of a package)."""
    spec = importlib.util.spec_from_file_location("worker_lock", WORKER_DIR / "lock.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def parsed() -> dict[str, tuple[str, str, list[str]]]:
    """name -> (version, marker, hashes) from requirements.txt."""
    text = REQUIREMENTS.read_text().replace("\\\n", " ")
    out = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        head, _, _ = line.partition("--hash")
        spec, _, marker = head.partition(";")
        name, _, version = spec.strip().partition("==")
        out[name] = (version, marker.strip(), re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
    return out


def test_every_requirement_is_exact_and_hashed() -> None:
    """`name==version`, at least one sha256 each: installable with --require-hashes --no-deps."""
    reqs = parsed()
    assert reqs
    for name, (version, _, hashes) in reqs.items():
        assert re.fullmatch(r"[A-Za-z0-9_.-]+", name)
        assert re.fullmatch(r"[0-9][0-9A-Za-z.+-]*", version), name
        assert hashes, name


def test_requirements_match_lock_py() -> None:
    """The file is exactly what lock.py renders from its PINS (so the lock is reproducible)."""
    lock = load_lock()
    reqs = parsed()
    assert {p.name for p in lock.PINS} == set(reqs)
    for pin in lock.PINS:
        assert reqs[pin.name][:2] == (pin.version, pin.marker), pin.name
    hashes = {lock._normalise(name): set(h) for name, (_, _, h) in reqs.items()}
    assert lock.render(hashes) == REQUIREMENTS.read_text()


def test_each_dependency_has_a_reason_and_the_rest_is_named() -> None:
    """The header says why each distribution is there and which of vastai's deps are left out."""
    header = "\n".join(line for line in REQUIREMENTS.read_text().splitlines() if line.startswith("#"))
    for name in parsed():
        assert re.search(rf"^#   {re.escape(name)}\s+\S", header, re.M), name
    for left_out in ("borb", "pillow", "cryptography", "rich", "aiodns"):
        assert left_out in header
    assert "vastai==1.9.1" in REQUIREMENTS.read_text()
    assert "supervisor" not in REQUIREMENTS.read_text()  # the entry point supervises with the stdlib


def test_compiled_wheels_are_hashed_for_every_target() -> None:
    """Binary distributions carry one hash per (CPython 3.10-3.12) x (x86_64, aarch64) wheel."""
    reqs = parsed()
    for name in ("aiohttp", "multidict", "yarl", "frozenlist", "propcache", "charset-normalizer"):
        assert len(reqs[name][2]) >= 6, name
    for name in ("psutil", "pycryptodome"):  # abi3: one wheel per architecture
        assert len(reqs[name][2]) >= 2, name


@pytest.mark.parametrize(("version", "present", "absent"), [
    ("3.10", {"async-timeout", "exceptiongroup"}, {"setuptools"}),
    ("3.11", set(), {"setuptools", "async-timeout", "exceptiongroup"}),
    ("3.12", {"setuptools"}, {"async-timeout", "exceptiongroup"}),
])
def test_markers(version: str, present: set[str], absent: set[str]) -> None:
    """setuptools (distutils) only from 3.12; the 3.10 backports only on 3.10."""
    names = {line.split("==")[0] for line in worker_env.requirement_lines(version)}
    assert present <= names
    assert not absent & names


def test_marker_evaluation() -> None:
    """worker_env evaluates the markers lock.py writes (pip would use the host's Python)."""
    assert worker_env.marker_applies('python_version >= "3.12"', "3.12")
    assert not worker_env.marker_applies('python_version >= "3.12"', "3.11")
    assert worker_env.marker_applies('python_version < "3.11"', "3.10")
    assert worker_env.marker_applies('python_version >= "3.10" and python_version < "3.11"', "3.10")
    with pytest.raises(Exception, match="unsupported marker"):
        worker_env.marker_applies('sys_platform == "linux"', "3.11")


def test_wheelhouse_holds_exactly_the_lock(worker_venv: Path) -> None:
    """The host's wheelhouse (what images install from) has one wheel per applicable requirement."""
    version = "3.11"
    wheels = worker_env.worker_wheelhouse(version, worker_env.host_platform_tag())
    names = {re.sub(r"[-_.]+", "-", w.name.split("-")[0]).lower() for w in wheels.glob("*.whl")}
    wanted = {re.sub(r"[-_.]+", "-", line.split("==")[0]).lower() for line in worker_env.requirement_lines(version)}
    assert names == wanted
