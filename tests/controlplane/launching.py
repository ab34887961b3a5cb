"""What a launch as the platform does it needs from the stand-in, standard library only.

The gate's launches (tests/image/launch.py, which adds the Docker SDK) and scripts/gpu-check (which
runs on a bare GPU host with only `docker` and Python) share these: where the stand-in lives inside the
container under test, the platform's variables pointing the worker at it, how its records are read and
what the platform counts as a ready report. No pycryptodome here: the host side never signs; the stand-in
inside the container does, on the worker venv's Python.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from pathlib import Path
from typing import Any

CONTROLPLANE_SOURCE = Path(__file__).resolve().parent
# Where the stand-in lives inside the container under test (put there before the container starts).
CONTROLPLANE_ROOT = "/tmp/bakery-gate"
CONTROLPLANE_STATE = f"{CONTROLPLANE_ROOT}/state"
CONTROLPLANE_RECORDS = f"{CONTROLPLANE_STATE}/records.jsonl"
CONTROLPLANE_PORT = 18200
CONTROLPLANE_ADDR = f"http://127.0.0.1:{CONTROLPLANE_PORT}"
WORKER_PYTHON = "/opt/bakery/venv/bin/python"  # the worker venv of every image (pycryptodome included)
# What the platform sets at a real serverless launch (docs/sdk.md "Environment read at start"):
# security on (no UNSECURED), REPORT_ADDR at the control plane (the in-container stand-in), plain
# HTTP on the worker port.
PLATFORM_ENV = {
    "CONTAINER_ID": "1",
    "REPORT_ADDR": CONTROLPLANE_ADDR,
    "PUBLIC_IPADDR": "127.0.0.1",
    "WORKER_PORT": "3000",
    "VAST_TCP_PORT_3000": "3000",
    "USE_SSL": "false",
}
# Test sizing, not configuration: a one-request benchmark so a CPU model is ready in seconds.
BENCHMARK_ENV = {"BENCHMARK_RUNS": "1", "BENCHMARK_CONCURRENCY": "1", "BENCHMARK_MAX_TOKENS": "8"}


def parse_records(text: str) -> list[dict[str, Any]]:
    """Records from the JSON-lines text (a last line still being written is skipped)."""
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def is_ready_report(body: Any) -> bool:
    """What the platform reads as a loaded worker: a status with loadtime > 0, max_perf > 0, no error."""
    return (isinstance(body, dict) and _number(body.get("loadtime")) > 0 and _number(body.get("max_perf")) > 0
            and not body.get("error_msg"))


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def controlplane_archive(key_pem: bytes | None = None) -> bytes:
    """tests/controlplane's Python files as a tar rooted at bakery-gate/controlplane/ (put into /tmp of
    the container), with `key_pem` as the stand-in's private key when given (else it makes one at
    start, which takes about a second)."""
    buf = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buf, mode="w") as tar:
        files = [(f"bakery-gate/controlplane/{path.name}", path.read_bytes(), 0o644)
                 for path in sorted(CONTROLPLANE_SOURCE.glob("*.py"))]
        if key_pem is not None:
            state = tarfile.TarInfo("bakery-gate/state")
            state.type, state.mode, state.mtime = tarfile.DIRTYPE, 0o700, now
            tar.addfile(state)
            files.append(("bakery-gate/state/key.pem", key_pem, 0o600))
        for name, data, mode in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, now
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
