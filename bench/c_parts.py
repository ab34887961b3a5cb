"""The benches' two C programs: the relay floor and the engine floor, compiled here when a bench runs.

bench/relay_floor.c is the least any forwarder can do (a byte relay); bench/engine_floor.c is an engine
that answers as the vLLM stand-in does at the scale parts' pace while leaving the host's cores to the
forwarder, as a GPU engine leaves them. Not part of the product.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the benches put the repository on sys.path before they import this module
    from tests.worker.helpers import Engine, Harness

BENCH = Path(__file__).resolve().parent


def build_c(tmp: Path, name: str, static: bool = False) -> Path:
    """Compile bench/`name`.c into `tmp` with the host's C compiler; the binary's path. `static` links
    it statically, to run inside an image whatever its C library."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit(f"bench: no C compiler (cc/gcc) on this host to build bench/{name}.c: install gcc")
    binary = tmp / name
    subprocess.run([compiler, "-O2", "-Wall", *(["-static"] if static else []), "-o", str(binary),
                    str(BENCH / f"{name}.c")], check=True)
    return binary


def wait_listening(port: int, timeout: float = 10.0) -> None:
    """Return once 127.0.0.1:`port` accepts a connection; SystemExit after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"bench: nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")


def engine_floor(harness: Harness, tmp: Path, model: str, tokens: int = 64, delay_ms: float = 20.0) -> Engine:
    """bench/engine_floor.c started under `harness` (a tests.worker.helpers.Harness) on a fresh slot,
    answering as `model` with `tokens` tokens at `delay_ms` each; its Engine once it listens. It stops
    with the harness, or by itself 600 s after its last connection."""
    slot = harness.slot("engine-floor")
    engine = harness.engine([str(build_c(tmp, "engine_floor")), str(slot.port), str(slot.log), model,
                             str(tokens), str(delay_ms), "600"], at=slot, output=tmp / "engine-floor.out")
    wait_listening(slot.port)
    return engine
