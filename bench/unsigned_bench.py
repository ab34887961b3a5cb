#!/usr/bin/env python3
"""Bench what an unsigned request costs the worker: peak memory added and CPU, per MiB of body.

    python3 bench/unsigned_bench.py [--runs 3] [--cases NAME,...]

One secured worker (worker/start_server.sh, the lean venv, the real SDK; no UNSECURED) runs in front
of the vLLM stand-in and serves the completion routes and /v1/images/edits (so the body limit follows
the upload limit: 96 MiB). Each case POSTs one body whose envelope is signed by a key the worker does
not know, and reads the worker process's own counters around it (Linux /proc):
- peak RSS added: VmHWM after the request less VmRSS before it, the high-water mark reset first
  (`echo 5 > /proc/PID/clear_refs`); the body itself, as aiohttp buffers it, is part of it;
- CPU: utime + stime of the worker over the request (clock ticks), per MiB of body;
- VmRSS before includes memory the worker freed and kept from earlier requests, so a body that fits
  in it shows less than it costs (the figure is what the worker grew by, not what it allocated).
The targets (issue 21): peak added <= 3x the body, CPU <= 50 ms per MiB. A signed 16 MiB body is
measured too, as the reference of what a served request costs, and a small forged request (a
one-token completion whose signature is well formed but another key's: a flood's unit) beside the
same request signed, with their CPU per request. The machine's idle CPU share over the
whole run is printed (other load on the machine inflates the CPU figures). Nothing is asserted.
Needs root (clear_refs) and loopback only.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bakery.host import downloads  # noqa: E402 (after the repo root is on sys.path)
from tests.worker.helpers import SDK_READY, Harness, SigningKey, make_signing_key  # noqa: E402

MIB = 1024 * 1024
SMALL_REPEAT = 2000  # a small body is sent this many times at most (its CPU is counted in 10 ms ticks)
ROUTES = "/v1/completions,/v1/chat/completions,/v1/images/edits"
TICK = os.sysconf("SC_CLK_TCK")


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of `pid`, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def machine_idle() -> tuple[int, int]:
    """(idle ticks, all ticks) of the whole machine so far (/proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return values[3] + values[4], sum(values)


def envelope(auth: dict, payload_json: bytes) -> bytes:
    """An envelope whose payload is the JSON text `payload_json` (json.dumps would build it slowly)."""
    return b'{"auth_data": ' + json.dumps(auth).encode() + b', "payload": ' + payload_json + b"}"


def items_body(auth: dict, size: int) -> bytes:
    """A completion whose payload holds a list of `{}` items, the whole body about `size` bytes."""
    count = max(1, size // 3)
    return envelope(auth, b'{"prompt": "x", "items": [' + b",".join([b"{}"] * count) + b"]}")


def deep_body(auth: dict, size: int) -> bytes:
    """Valid JSON nested 60 levels deep (below the 64 allowed), repeated to about `size` bytes."""
    unit = b"[" * 60 + b"1" + b"]" * 60
    return envelope(auth, b'{"prompt": "x", "deep": [' + b",".join([unit] * max(1, size // 122)) + b"]}")


def edit_body(auth: dict, size: int, files: int = 15) -> bytes:
    """An image edit with `files` base64 images (valid PNG-named uploads), about `size` bytes in all."""
    one = base64.b64encode(os.urandom(size // files * 3 // 4)).decode()
    return envelope(auth, json.dumps({"prompt": "p", "image": [one] * files,
                                      "filename": [f"{i}.png" for i in range(files)]}).encode())


def small_body(auth: dict, size: int) -> bytes:
    """A one-token completion (`size` is ignored): what a flood of forged requests would send."""
    return envelope(auth, b'{"model": "standin-model", "prompt": "x", "max_tokens": 1}')


CASES: dict[str, tuple[str, int, Callable[[dict, int], bytes], bool]] = {
    "forged-small": ("/v1/completions", 0, small_body, False),
    "signed-small": ("/v1/completions", 0, small_body, True),
    "items-1MiB": ("/v1/completions", 1 * MIB, items_body, False),
    "items-16MiB": ("/v1/completions", 16 * MIB, items_body, False),
    "deep60-16MiB": ("/v1/completions", 16 * MIB, deep_body, False),
    "edit-40MiB": ("/v1/images/edits", 40 * MIB, edit_body, False),
    "edit-60MiB": ("/v1/images/edits", 60 * MIB, edit_body, False),
    "signed-items-16MiB": ("/v1/completions", 16 * MIB, items_body, True),
}


def post(port: int, path: str, body: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def measure(pid: int, port: int, path: str, body: bytes) -> tuple[int, int, float]:
    """(status, peak RSS added in bytes, CPU seconds) of one request. A small body is sent several
    times in a row (16 MiB in all, at most SMALL_REPEAT times) and its CPU divided: the kernel counts
    CPU in 10 ms ticks."""
    repeat = max(1, min(SMALL_REPEAT, 16 * MIB // len(body)))
    time.sleep(0.3)  # let the worker settle (status reports, log polling)
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    before, cpu = proc_status(pid)["VmRSS"], cpu_seconds(pid)
    statuses = {post(port, path, body)[0] for _ in range(repeat)}
    time.sleep(0.05)
    return min(statuses), proc_status(pid)["VmHWM"] - before, (cpu_seconds(pid) - cpu) / repeat


def main() -> int:
    """Start the worker, run each case, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    python = downloads.host_worker_venv() / "bin" / "python"
    key: SigningKey = make_signing_key(python)
    stranger: SigningKey = make_signing_key(python)
    idle0 = machine_idle()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bakery-unsigned-bench-") as tmp, \
            Harness(Path(tmp), python, key.pem) as harness:
        served = harness.worker("vllm", harness.standin("vllm"), UNSECURED=None, OPENAI_ROUTES=ROUTES)
        served.worker.wait_for(SDK_READY, timeout=120)
        pid = served.worker.popen.pid
        for name in args.cases.split(","):
            path, size, make, signed = CASES[name]
            auth = {"cost": "8", "endpoint": "bench", "reqnum": 1, "request_idx": 1, "url": served.url,
                    "signature": (key if signed else stranger).sign(served.url)}
            body = make(auth, size)
            results = [measure(pid, served.port, path, body) for _ in range(args.runs)]
            statuses = sorted({r[0] for r in results})
            peak = statistics.median(r[1] for r in results)
            cpu = statistics.median(r[2] for r in results)
            mib = len(body) / MIB
            rows.append((name, mib, statuses, peak / MIB, peak / len(body), cpu * 1000 / mib, cpu * 1000))
            print(f"{name}: {statuses} peak +{peak / MIB:.1f} MiB, cpu {cpu:.3f} s", flush=True)
    idle1 = machine_idle()
    idle = (idle1[0] - idle0[0]) / max(1, idle1[1] - idle0[1])
    print()
    print(f"unsigned bench: {args.runs} runs each (median), Python {sys.version_info[0]}.{sys.version_info[1]} "
          f"host; machine idle {idle:.0%} of CPU over the run; targets: peak <= 3.0x, <= 50 ms/MiB")
    print(f"{'case':<20}{'MiB':>7}{'status':>10}{'peak +MiB':>11}{'peak/size':>11}{'CPU ms/MiB':>12}"
          f"{'CPU ms/req':>12}")
    for name, mib, statuses, peak_mib, ratio, per_mib, per_request in rows:
        print(f"{name:<20}{mib:>7.1f}{','.join(map(str, statuses)):>10}{peak_mib:>11.1f}{ratio:>10.2f}x"
              f"{per_mib:>12.1f}{per_request:>12.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
