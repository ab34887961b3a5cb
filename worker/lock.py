#!/usr/bin/env python3
"""Regenerate worker/requirements.txt: the worker's lean, exactly pinned, hash-locked dependencies.

    python3 worker/lock.py            # rewrite worker/requirements.txt
    python3 worker/lock.py --check    # exit 1 if requirements.txt differs from what PINS gives

The pins live in PINS below, each with the reason it is there. The script downloads the wheels of
every pin for each target (CPython 3.10, 3.11, 3.12 on manylinux x86_64 and aarch64) with the host's
pip, hashes the files it got, and writes one requirement per pin with all of those hashes, sorted,
so the same PINS always produce the same file. A pin that has no wheel for a target it applies to
is an error. Needs PyPI (the ordinary pip client); nothing else.

Why lean: `vastai` declares ~40 distributions (~195 MB installed: borb, pillow, fonttools, lxml,
cryptography, ...) but its serverless worker path imports only the ones below. The images install
this file with `pip install --no-index --find-links <wheelhouse> --no-deps --require-hashes`, so
anything not listed here is absent; tests/worker/test_import_set.py proves the worker path still
imports and runs with exactly this set.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements.txt"
PYTHONS = ("3.10", "3.11", "3.12")
ARCHES = ("x86_64", "aarch64")
# pip picks one wheel per pin from the platform tags it is given, so the hashes must cover every
# tag set a consumer uses: manylinux2014 alone (bakery.host.downloads.worker_wheelhouse(); pip also
# accepts the older manylinux1/2010 tags under it) and manylinux up to glibc 2.35 (Ubuntu 22.04,
# the oldest production base), where a project that ships a separate newer-glibc wheel wins.
PLATFORM_TAG_SETS = (
    ("manylinux2014_{arch}",),
    tuple(f"manylinux{g}_{{arch}}" for g in ("2014", "_2_17", "_2_24", "_2_27", "_2_28", "_2_31", "_2_34", "_2_35")),
)


@dataclass(frozen=True)
class Pin:
    """One locked distribution: exact version, Python range it applies to, and why it is here."""

    name: str
    version: str
    why: str
    python_min: str | None = None  # applies when python_version >= python_min
    python_below: str | None = None  # applies when python_version < python_below

    def applies(self, python: str) -> bool:
        """Whether this pin is installed on CPython `python` (e.g. "3.12")."""
        key = tuple(int(p) for p in python.split("."))
        if self.python_min and key < tuple(int(p) for p in self.python_min.split(".")):
            return False
        return not (self.python_below and key >= tuple(int(p) for p in self.python_below.split(".")))

    @property
    def marker(self) -> str:
        """The PEP 508 environment marker for the Python range ("" when it always applies)."""
        parts = []
        if self.python_min:
            parts.append(f'python_version >= "{self.python_min}"')
        if self.python_below:
            parts.append(f'python_version < "{self.python_below}"')
        return " and ".join(parts)


PINS: tuple[Pin, ...] = (
    Pin("vastai", "1.9.1", "the serverless SDK (Worker, WorkerConfig, ...)"),
    Pin("aiohttp", "3.14.5", "SDK: the worker's HTTP server, engine client and status reports"),
    Pin("aiohappyeyeballs", "2.7.1", "aiohttp: connection setup"),
    Pin("aiosignal", "1.4.0", "aiohttp: signals"),
    Pin("attrs", "26.1.0", "aiohttp: data classes"),
    Pin("frozenlist", "1.8.0", "aiohttp, aiosignal"),
    Pin("multidict", "7.1.0", "aiohttp, yarl: headers (7.2 dropped Python 3.10)"),
    Pin("propcache", "0.5.4", "aiohttp, yarl"),
    Pin("yarl", "1.25.1", "aiohttp: URLs"),
    Pin("idna", "3.20", "yarl, anyio, requests"),
    Pin("typing_extensions", "4.16.0", "SDK (serverless.remote.base), aiohttp, anyio"),
    Pin("async-timeout", "5.0.1", "aiohttp on Python 3.10", python_below="3.11"),
    Pin("exceptiongroup", "1.3.2", "anyio on Python 3.10", python_below="3.11"),
    Pin("anyio", "4.16.0", "SDK: async reading of the model log (anyio.open_file)"),
    Pin("psutil", "7.2.2", "SDK: disk usage in status reports"),
    Pin("pycryptodome", "3.24.1", "SDK: request signature check (Crypto.*), imported at start"),
    Pin("msgspec", "0.22.0", "bakery: reads auth_data without materialising the payload (signed_first)"),
    Pin("uvloop", "0.23.0", "bakery: the worker's event loop in C (libuv), less CPU per event (BAKERY_EVENT_LOOP)"),
    Pin("requests", "2.34.2", "SDK: imported by vastai/__init__ (api client, managed endpoints)"),
    Pin("urllib3", "2.8.0", "requests"),
    Pin("certifi", "2026.10.19.post1", "requests"),
    Pin("charset-normalizer", "3.5.3", "requests"),
    Pin("python-dateutil", "3.0.0", "SDK: vastai/__init__ imports vastai.api.billing; 4.x needs 3.11"),
    Pin("six", "1.17.0", "python-dateutil 3"),
    Pin("setuptools", "84.2.1", "SDK imports distutils, gone from the stdlib in 3.12", python_min="3.12"),
)

# vastai's declared dependencies deliberately left out: nothing on the serverless worker path
# imports them (CLI, PDF invoices, DNS acceleration, pretty printing).
LEFT_OUT = (
    "aiodns", "pycares", "argcomplete", "borb", "cryptography", "curlify", "pillow",
    "pyparsing", "rich", "xdg", "tzdata (python-dateutil's, only for named zones)",
)


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_name(filename: str) -> str:
    if not filename.endswith(".whl"):
        raise SystemExit(f"lock.py: pip fetched a non-wheel {filename}")
    return _normalise(filename.split("-", 1)[0])


def download_hashes(
    python: str, arch: str, tags: tuple[str, ...], pins: tuple[Pin, ...]
) -> dict[str, set[str]]:
    """sha256 of every wheel pip picks for the pins on (CPython `python`, `tags` for `arch`), by name."""
    wanted = [p for p in pins if p.applies(python)]
    with tempfile.TemporaryDirectory(prefix="bakery-lock-") as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet",
            "--no-deps", "--only-binary", ":all:", "--implementation", "cp",
            "--python-version", python, "--dest", tmp,
        ]
        for tag in tags:
            cmd += ["--platform", tag.format(arch=arch)]
        cmd += [f"{p.name}=={p.version}" for p in wanted]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"lock.py: pip download for cp{python} {arch} failed:\n{proc.stderr}")
        found: dict[str, set[str]] = {}
        for path in Path(tmp).iterdir():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            found.setdefault(_wheel_name(path.name), set()).add(digest)
    missing = [p.name for p in wanted if _normalise(p.name) not in found]
    if missing:
        raise SystemExit(f"lock.py: no wheel for cp{python} {arch}: {', '.join(missing)}")
    return found


def render(hashes: dict[str, set[str]], pins: tuple[Pin, ...] = PINS) -> str:
    """The text of requirements.txt for `pins` with the collected `hashes`."""
    out = [
        "# bakery worker: lean, exact, hash-locked. GENERATED by worker/lock.py; edit PINS there.",
        "# Install (images): pip install --no-index --find-links <wheelhouse> --no-deps \\",
        "#     --require-hashes -r worker/requirements.txt",
        f"# Hashes cover CPython {', '.join(PYTHONS)} on manylinux {' and '.join(ARCHES)}.",
        "#",
        "# vastai declares ~40 distributions (~195 MB installed); its serverless worker path imports",
        "# only these. Why each one is here:",
    ]
    width = max(len(p.name) for p in pins)
    out += [f"#   {p.name:<{width}}  {p.why}" for p in pins]
    out += [
        "# Deliberately left out (declared by vastai, never imported by the worker path):",
        *textwrap.wrap(", ".join(LEFT_OUT), 95, initial_indent="#   ", subsequent_indent="#   "),
        "# tests/worker/test_import_set.py fails if the SDK starts importing one of them.",
        "",
    ]
    for pin in sorted(pins, key=lambda p: _normalise(p.name)):
        line = f"{pin.name}=={pin.version}"
        if pin.marker:
            line += f" ; {pin.marker}"
        digests = sorted(hashes[_normalise(pin.name)])
        out.append(line + " \\")
        out += [f"    --hash=sha256:{d}" + (" \\" if i < len(digests) - 1 else "")
                for i, d in enumerate(digests)]
    return "\n".join(out) + "\n"


def lock(pins: tuple[Pin, ...] = PINS) -> str:
    """Download for every target and return the requirements.txt text."""
    hashes: dict[str, set[str]] = {}
    for python in PYTHONS:
        for arch in ARCHES:
            for tags in PLATFORM_TAG_SETS:
                for name, digests in download_hashes(python, arch, tags, pins).items():
                    hashes.setdefault(name, set()).update(digests)
    return render(hashes, pins)


def main(argv: list[str] | None = None) -> int:
    """Rewrite (or with --check, compare) worker/requirements.txt."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    text = lock()
    if args.check:
        current = REQUIREMENTS.read_text() if REQUIREMENTS.exists() else ""
        if current != text:
            print("worker/requirements.txt is stale: run python3 worker/lock.py", file=sys.stderr)
            return 1
        print("worker/requirements.txt is up to date")
        return 0
    REQUIREMENTS.write_text(text)
    print(f"wrote {REQUIREMENTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
