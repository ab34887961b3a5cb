"""bakery-relay, the worker's streamed-body relay in C (worker/relay/bakery_relay.c), compiled here.

An image build copies it into the worker (worker/relay/bakery-relay in the build context; the worker's
native_relay.py starts it). It is linked statically, so it runs on any base whatever its C library,
and cached by the hash of its source and of the compiler's version. Built only for the host's own
architecture (no cross compiler is assumed): a build context for another platform holds no program,
and that image's worker relays streamed bodies in Python (it says so when it starts). The suite also
builds it with AddressSanitizer and UndefinedBehaviorSanitizer (`sanitized_relay`) and as a libFuzzer
harness (tests/worker/relay_fuzz/), through the same cached compile (`compile_cached`).
"""

from __future__ import annotations

import hashlib
import os
import platform as host_platform
import shutil
import subprocess
from pathlib import Path

from bakery.errors import BuildError
from bakery.paths import WORKER_DIR, cache_path

SOURCE = WORKER_DIR / "relay" / "bakery_relay.c"
PROGRAM = "bakery-relay"
_MACHINE = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}
SANITIZE = ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]


def compile_cached(compiler: str, flags: list[str], sources: list[Path], name: str, fix: str,
                   included: tuple[Path, ...] = ()) -> Path:
    """`sources` compiled and linked with `flags` into the program `name`, cached by the sources' (and
    the `included` files'), the flags' and the compiler's version; BuildError naming `fix` when it
    does not compile."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False).stdout
    digest = hashlib.sha256(version.encode() + " ".join(flags).encode())
    for source in (*sources, *included):
        digest.update(source.read_bytes())
    binary = cache_path("build", f"{name}-{digest.hexdigest()[:16]}", name)
    if binary.exists():
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_name(f"{name}.{os.getpid()}.partial")  # test processes may race
    done = subprocess.run([compiler, *flags, "-o", str(partial), *map(str, sources)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BuildError(f"{sources[0].name} did not compile ({last}): {fix}")
    partial.replace(binary)
    return binary


def _cc() -> str:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise BuildError(f"no C compiler (cc) to build {SOURCE.name}: install gcc and libc6-dev "
                         "(scripts/setup-host does)")
    return compiler


def relay_program(platform: str = "linux/amd64") -> Path | None:
    """The compiled bakery-relay for `platform` (cached); None when `platform` is not the host's own.
    BuildError, naming the fix, when no C compiler or no static C library is installed."""
    if _MACHINE.get(platform) != host_platform.machine():
        return None
    return compile_cached(_cc(), ["-O2", "-Wall", "-static"], [SOURCE], PROGRAM,
                          "install gcc and libc6-dev (scripts/setup-host does)")


def sanitized_relay() -> Path:
    """bakery-relay built for this host with AddressSanitizer and UndefinedBehaviorSanitizer (any
    finding ends it with a report on stderr): what the suite drives beside the shipped build."""
    return compile_cached(_cc(), ["-Wall", *SANITIZE], [SOURCE], f"{PROGRAM}-sanitized",
                          "install gcc and libc6-dev (scripts/setup-host does)")
