#!/usr/bin/env python3
"""The floor under the worker's CPU per streamed event and per request (issue 24, target 2), and
under a burst's first token (target 1).

    python3 bench/relay_floor.py [--streams 256] [--runs 3] [--scale-timeout 120] [--engine c|standin]
                                  [--worker-python PATH]

One run, eight sides per round, the order rotating: N streamed completions at once (20 ms per token,
64 tokens, as serving_bench.py's `scale` part), (1) straight to the engine, (2) through
`relay_floor`, a byte relay in C compiled here from bench/relay_floor.c (epoll, one recv and one
send per arrival, no parsing: the least any forwarder can do), (3) through bench/py_relay.py, the
same relay on one asyncio loop in Python (the least any one-loop Python server can do), and the
same on uvloop's loop (the worker's default), (4) through
bench/lean_proxy.py, the leanest honest aiohttp.web proxy (issue 24's reference: what aiohttp.web
alone costs here), and the same on uvloop, (5) through the same proxy in two processes on one port (SO_REUSEPORT: what a
second core buys a forwarder on this machine, where the engine and the load share the same two
cores), and (6) through the worker (`UNSECURED=true`, the lean worker venv, or --worker-python's). For each
forwarder: CPU time (utime and stime from /proc, every process of the tree) per streamed event, and
the first token's p50 and p95 added to the direct side's of the same round (the burst's queue: every
stream is sent in the same millisecond). After each round's streams, N non-streamed one-token
requests at once go through each forwarder: CPU per request (the relay opens one engine connection
per client connection, as the load opens one client connection per request). The relay's figures
are what this machine's kernel and one event loop cost; a target below them cannot be met by any
design that forwards each event as it arrives. Nothing is asserted; it reports.

The engine is bench/engine_floor.c (`--engine c`, the default since 2026-12-04), compiled here: the
stand-in's answers at its pace from one epoll loop in C, held to it by
tests/bases/test_engine_floor.py. `--engine standin` uses the Python vLLM stand-in, as the figures
before that date: it takes most of the two cores by itself at 256 streams (straight to it, ~9.7k of
the 12.8k events/s the load asks for), so every millisecond of forwarder CPU is taken from the
engine; the C engine leaves the cores to the forwarder, as a GPU engine leaves them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from c_parts import build_c, engine_floor  # noqa: E402
from serving_bench import (  # noqa: E402
    MODEL,
    SCALE_STANDIN,
    Watch,
    _num,
    _outcome,
    cpu_idle,
    cpu_model,
    p50,
    raise_open_files,
    say,
    streamload,
)

from bakery.host import downloads  # noqa: E402
from tests.ports import free_port  # noqa: E402
from tests.worker.helpers import Harness  # noqa: E402

SIDES = ("direct", "relay", "pyrelay", "pyrelay_uv", "lean", "lean_uv", "lean2", "worker")


def _added(side: str, ttft: dict[str, tuple[float | None, float | None]],
           added: dict[str, dict[str, list[float]]]) -> str:
    """One side's first token p50/p95 minus the direct side's of the same round, kept in `added`."""
    (mine50, mine95), (base50, base95) = ttft.get(side, (None, None)), ttft.get("direct", (None, None))
    if None in (mine50, mine95, base50, base95):
        return f"{side} -"
    added[side]["p50"].append(mine50 - base50)
    added[side]["p95"].append(mine95 - base95)
    return f"{side} {mine50 - base50:+.1f} / {mine95 - base95:+.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scale-timeout", type=float, default=120.0)
    parser.add_argument("--worker-python", default=None,
                        help="the Python of the worker and the lean proxy (default: the lean worker venv of "
                             "worker/requirements.txt on the running interpreter)")
    parser.add_argument("--engine", choices=("c", "standin"), default="c",
                        help="bench/engine_floor.c (default: leaves the cores to the forwarders) or the "
                             "Python vLLM stand-in")
    args = parser.parse_args()
    if args.streams < 1 or args.runs < 1:
        print("relay_floor: --streams and --runs must be positive", file=sys.stderr)
        return 2
    say(f"CPU: {cpu_model()}; {raise_open_files()}; load average {os.getloadavg()[0]:.2f}")
    worker_python = Path(args.worker_python) if args.worker_python else downloads.host_worker_venv() / "bin" / "python"
    say(f"worker venv: {worker_python.parent.parent}")
    code = "from Crypto.PublicKey import RSA; print(RSA.generate(1024).publickey().export_key().decode())"
    pubkey = subprocess.run([str(worker_python), "-c", code], capture_output=True, text=True, check=True).stdout
    payload = {"model": MODEL, "prompt": "scale", "stream": True}
    single = {"model": MODEL, "prompt": "scale", "stream": False, "max_tokens": 1}
    per_request: dict[str, list[float]] = {s: [] for s in SIDES[1:]}
    per_event: dict[str, dict[str, list[float]]] = {s: {"all": [], "user": [], "system": []} for s in SIDES[1:]}
    eps: dict[str, list[float]] = {s: [] for s in SIDES}
    added: dict[str, dict[str, list[float]]] = {s: {"p50": [], "p95": []} for s in SIDES[1:]}
    with (tempfile.TemporaryDirectory(prefix="bk-relay-floor-") as root,
          Harness(Path(root), worker_python, pubkey) as harness):
        tmp = Path(root)
        relay_bin = build_c(tmp, "relay_floor")
        # 64 tokens at 20 ms either way (SCALE_STANDIN).
        engine = engine_floor(harness, tmp, MODEL) if args.engine == "c" else harness.standin("vllm", **SCALE_STANDIN)
        say(f"engine: {'bench/engine_floor.c' if args.engine == 'c' else 'the vLLM stand-in'} on port {engine.port}")
        (tmp / "worker").mkdir()
        with Harness(tmp / "worker", worker_python, pubkey) as per_worker:
            served = per_worker.serve("vllm", engine, MODEL_NAME=MODEL)
            relay_port = free_port()
            # Bounded: the relay exits by itself 60 s after its last connection closed.
            relay = subprocess.Popen([str(relay_bin), str(relay_port), str(engine.port), "60"],
                                     stdout=subprocess.PIPE, text=True)
            lean_port = free_port()
            lean = subprocess.Popen([str(worker_python), str(BENCH / "lean_proxy.py"), str(lean_port),
                                     str(engine.port)], stdout=subprocess.PIPE, text=True)
            pyrelay_port = free_port()
            pyrelay = subprocess.Popen([str(worker_python), str(BENCH / "py_relay.py"), str(pyrelay_port),
                                        str(engine.port)], stdout=subprocess.PIPE, text=True)
            pyrelay_uv_port = free_port()
            pyrelay_uv = subprocess.Popen([str(worker_python), str(BENCH / "py_relay.py"), str(pyrelay_uv_port),
                                           str(engine.port), "uvloop"], stdout=subprocess.PIPE, text=True)
            lean_uv_port = free_port()
            lean_uv = subprocess.Popen([str(worker_python), str(BENCH / "lean_proxy.py"), str(lean_uv_port),
                                        str(engine.port), "1", "uvloop"], stdout=subprocess.PIPE, text=True)
            lean2_port = free_port()
            lean2 = subprocess.Popen([str(worker_python), str(BENCH / "lean_proxy.py"), str(lean2_port),
                                      str(engine.port), "2"], stdout=subprocess.PIPE, text=True)
            ports = {"direct": engine.port, "relay": relay_port, "pyrelay": pyrelay_port,
                     "pyrelay_uv": pyrelay_uv_port, "lean": lean_port, "lean_uv": lean_uv_port,
                     "lean2": lean2_port,
                     "worker": served.port}
            pids = {"relay": relay.pid, "pyrelay": pyrelay.pid, "pyrelay_uv": pyrelay_uv.pid, "lean": lean.pid,
                    "lean_uv": lean_uv.pid, "lean2": lean2.pid,
                    "worker": served.worker.popen.pid}
            try:
                for process in (relay, pyrelay, pyrelay_uv, lean, lean_uv, lean2):
                    say(process.stdout.readline().strip() if process.stdout else f"{process.args[0]} started")
                idx = 1
                for i in range(args.runs):
                    order = SIDES[i % len(SIDES):] + SIDES[:i % len(SIDES)]
                    say(f"{args.streams} streams, round {i + 1} of {args.runs} (order {', '.join(order)})")
                    ttft: dict[str, tuple[float | None, float | None]] = {}
                    for side in order:
                        idle = cpu_idle()
                        pid = pids.get(side)
                        watch = Watch(pid) if pid else None
                        result = streamload(ports[side], args.streams, payload, args.scale_timeout,
                                            idx if side == "worker" else None)
                        ttft[side] = (result.get("ttft_p50_ms"), result.get("ttft_p95_ms"))
                        if side == "worker":
                            idx += args.streams
                        line = (f"  {side}: idle before {idle:.0%}; {_outcome(result)}; {result['events']} events, "
                                f"{_num(result['events_per_s'])} events/s")
                        if result["events_per_s"]:
                            eps[side].append(result["events_per_s"])
                        if watch is not None:
                            watch.stop()
                            if result["events"]:
                                n = result["events"]
                                for key, value in (("all", watch.cpu), ("user", watch.user), ("system", watch.system)):
                                    per_event[side][key].append(value / n * 1e6)
                                line += (f"; CPU {watch.cpu:.2f} s (user {watch.user:.2f}, system {watch.system:.2f})"
                                         f" = {watch.cpu / n * 1e6:.1f} us/event")
                        say(line)
                    say("  first token added to direct's, p50 / p95: " + "; ".join(
                        _added(side, ttft, added) for side in SIDES[1:]))
                    for side in order:
                        if side == "direct":
                            continue
                        idle = cpu_idle()
                        watch = Watch(pids[side])
                        result = streamload(ports[side], args.streams, single, args.scale_timeout,
                                            idx if side == "worker" else None)
                        watch.stop()
                        if side == "worker":
                            idx += args.streams
                        line = f"  {side}, requests: idle before {idle:.0%}; {_outcome(result)}"
                        if result["completed"]:
                            ms = watch.cpu / result["completed"] * 1000
                            per_request[side].append(ms)
                            line += (f"; CPU {watch.cpu:.3f} s (user {watch.user:.3f}, system {watch.system:.3f})"
                                     f" = {ms:.3f} ms/request")
                        say(line)
            finally:
                for process in (relay, pyrelay, pyrelay_uv, lean, lean_uv, lean2):
                    process.terminate()
                    process.wait(timeout=10)
    say(f"medians over {args.runs} round(s), {args.streams} streams x 64 tokens at 20 ms/token:")
    for side in SIDES:
        rate = f"events/s {_num(p50(eps[side]) if eps[side] else None)}"
        if side == "direct":
            say(f"  direct: {rate}")
            continue
        cpu = per_event[side]
        say(f"  {side}: {rate}; CPU per event {_num(p50(cpu['all']) if cpu['all'] else None)} us (user "
            f"{_num(p50(cpu['user']) if cpu['user'] else None)}, system "
            f"{_num(p50(cpu['system']) if cpu['system'] else None)}); CPU per request "
            f"{_num(p50(per_request[side]) if per_request[side] else None, '.3f')} ms; first token added "
            f"p50 {_num(p50(added[side]['p50']) if added[side]['p50'] else None, '+.1f')} ms, p95 "
            f"{_num(p50(added[side]['p95']) if added[side]['p95'] else None, '+.1f')} ms")
    if per_event["relay"]["all"] and per_event["worker"]["all"]:
        floor, ours = p50(per_event["relay"]["all"]), p50(per_event["worker"]["all"])
        say(f"  worker / floor: {ours / floor:.2f}x; the floor against the 15 us target: {floor / 15:.2f}x")
    if per_request["relay"] and per_request["worker"]:
        floor, ours = p50(per_request["relay"]), p50(per_request["worker"])
        say(f"  per request, worker / floor: {ours / floor:.2f}x; the floor against the 0.3 ms target: "
            f"{floor / 0.3:.2f}x")
    if per_request["lean"] and per_request["worker"] and per_event["lean"]["all"] and per_event["worker"]["all"]:
        lean_request, lean_event = p50(per_request["lean"]), p50(per_event["lean"]["all"])
        say(f"  against aiohttp.web alone (lean proxy): per request {lean_request:.3f} ms, worker "
            f"{p50(per_request['worker']) / lean_request:.2f}x, the 0.3 ms target {lean_request / 0.3:.2f}x "
            f"of it; per event {lean_event:.1f} us, worker {p50(per_event['worker']['all']) / lean_event:.2f}x")
    if all(eps[s] and added[s]["p50"] and per_event[s]["all"] and per_request[s] for s in ("lean", "lean2")):
        say(f"  a second process (lean proxy, 1 -> 2 processes on one port): events/s "
            f"{p50(eps['lean2']) / p50(eps['lean']):.2f}x; first token added p50 "
            f"{p50(added['lean']['p50']):+.1f} -> {p50(added['lean2']['p50']):+.1f} ms, p95 "
            f"{p50(added['lean']['p95']):+.1f} -> {p50(added['lean2']['p95']):+.1f} ms; CPU per event "
            f"{p50(per_event['lean']['all']):.1f} -> {p50(per_event['lean2']['all']):.1f} us, per request "
            f"{p50(per_request['lean']):.3f} -> {p50(per_request['lean2']):.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
