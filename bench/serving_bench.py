#!/usr/bin/env python3
"""Serving under real traffic (issue 14): what users of the worker on :3000 feel, measured on this host.

    python3 bench/serving_bench.py [--only PARTS] [--runs N] [--drain-stops 20] [--streams 256,1024]
                                   [--scale-timeout 120] [--scale-engine c|standin]
                                   [--event-loop uvloop|asyncio] [--worker-env BAKERY_NAME=VALUE ...]

PARTS (comma-separated, default all): stream_llama, stream_standin, latency, drain, report, routable, scale.

- stream_llama: the real llama.cpp (xllamacpp, SmolLM2, 1 thread), 150 tokens streamed (greedy,
  ignore_eos), N requests straight to the engine and N through the worker, alternating. Time to first
  token added (p50 of worker minus p50 of direct), gap between tokens added (same), whole answer ratio.
- stream_standin: the vLLM stand-in at 20 ms per token, 50 tokens, 16 concurrent streams, N rounds each.
- latency: the stand-in answering in 50 ms (10 tokens x 5 ms, not streamed), 16 concurrent clients in a
  closed loop for 5 s: throughput through the worker / direct, p50 added.
- drain: N stops (--drain-stops, default 20): a fresh worker, 4 streamed answers in flight (1 s each),
  SIGTERM, one request after the signal; lost = an answer in flight that did not end with [DONE].
- report: in each drain cycle, from the engine's load line (appended to MODEL_LOG once the worker
  listens, the engine already serving) to the SDK's "marking model as loaded" line and to the first
  /worker_status/ report with loadtime > 0 and max_perf > 0 at a report server on loopback.
- routable (Docker): container start -> the first /worker_status/ report with loadtime > 0 and
  max_perf > 0, as the platform routes on it: the llama image (real llama.cpp, SmolLM2) and the vLLM
  stand-in image on their local bases, each launched as the platform launches it (security on, the
  control-plane stand-in of tests/controlplane inside the container, its key made beforehand), N
  boots of ours and N of the upstream boot path emulated (bench/boot_bench.py: a fresh venv and the
  SDK pip-installed from a local wheelhouse at every boot), alternating. Ratio upstream / ours.
- scale (issue 24): for each N of --streams (default 256,1024), N streamed completions at once from
  the vLLM stand-in (20 ms per token, 64 tokens), straight to the engine ("direct") and through the
  worker (a fresh one for each N), the order alternating across --runs rounds; the load comes from
  bench/streamload.py, a process of its own (its CPU is not the bench's); an event is a `data:` line,
  66 per stream ([DONE] included). Per round and side: events/s, worker/direct ratio,
  first token p50/p95 and the ms added; for the worker side its CPU time (utime+stime of the worker's
  process and every descendant, /proc/<pid>/stat) per streamed event and its RSS (VmRSS sampled every
  50 ms) at the round's peak minus before it, per open stream. Then N non-streamed requests
  (max_tokens 1) through the worker: its CPU per request. Medians over the rounds. Errors (a refused
  or cut stream, --scale-timeout reached) are counted and named, never raised. RLIMIT_NOFILE's soft
  limit is raised to the hard one for the bench and all it starts, so that 1024 streams can open.
  The engine is bench/engine_floor.c (`--scale-engine c`, the default since 2026-12-04): the stand-in's
  answers at its pace from C, held to it by tests/bases/test_engine_floor.py. `--scale-engine standin`
  answers from the Python stand-in, as the figures before that date: it takes most of this machine's
  two cores by itself at 256 streams, so the worker's CPU is taken from the engine and hides in its
  slowness; the C engine leaves the cores to the worker, as a GPU engine does. `--event-loop` sets
  the worker's BAKERY_EVENT_LOOP (uvloop, its default, or asyncio) for this part, `--front` its
  BAKERY_FRONT (wire, its default, or aiohttp), `--relay` its BAKERY_RELAY (native, its default:
  bakery-relay moves a streamed body after its head; or python), and each `--worker-env NAME=VALUE`
  any other BAKERY_ setting (e.g. BAKERY_ENGINE_READY_CONNECTIONS=0: no engine connections opened at
  load, so the first round's burst opens them, as before 2026-12-06).

Before each part (and each scale round) the share of idle CPU over 1 s is printed, and the CPU model
once: this machine's 2 cores are shared, so a low share marks figures as provisional. Nothing is
asserted; it reports.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from c_parts import engine_floor  # noqa: E402

from bakery.host import downloads  # noqa: E402
from tests.worker.helpers import SDK_READY, Engine, Harness, Served  # noqa: E402
from tests.worker.serving import MODEL, envelope  # noqa: E402

PARTS = ("stream_llama", "stream_standin", "latency", "drain", "report", "routable", "scale")
ROUTABLE_ENGINES = ("llama", "vllm")
PER_TOKEN_20MS = {"STANDIN_TOKEN_DELAY": "0.02", "STANDIN_REPLY_TOKENS": "50"}  # a 1 s streamed answer
ANSWER_50MS = {"STANDIN_TOKEN_DELAY": "0.005", "STANDIN_REPLY_TOKENS": "10"}  # 50 ms, not streamed
LOAD_LINE = "(APIServer pid=1) INFO:     Application startup complete.\n"  # the vLLM stand-in's ready line
SCALE_STANDIN = {"STANDIN_TOKEN_DELAY": "0.02", "STANDIN_REPLY_TOKENS": "64"}  # 64 tokens, 1.28 s per stream
STREAMLOAD = Path(__file__).resolve().parent / "streamload.py"
CLOCK_TICK = os.sysconf("SC_CLK_TCK")


def say(message: str) -> None:
    print(message, flush=True)


def cpu_idle(seconds: float = 1.0) -> float:
    """Share of the machine's CPU time that was idle over the next `seconds` (from /proc/stat)."""
    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return fields[3] + fields[4], sum(fields)
    idle0, total0 = sample()
    time.sleep(seconds)
    idle1, total1 = sample()
    return (idle1 - idle0) / max(1, total1 - total0)


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def cpu_model() -> str:
    """The CPU's "model name" (/proc/cpuinfo) and the number of CPUs."""
    names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
             if line.startswith("model name")]
    return f"{names[0] if names else 'unknown'} x {os.cpu_count()}"


def raise_open_files() -> str:
    """Raise RLIMIT_NOFILE's soft limit to the hard one, for the bench and every process it starts
    (1024 streams need more than a default soft limit of 1024 descriptors in the client, the worker
    and the engine); what the limit is now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError) as exc:
            return f"open files: soft {soft}, hard {hard} (raising failed: {exc})"
        soft = wanted
    return f"open files: soft {soft}, hard {hard}"


# --------------------------------------------------------------------------- one streamed answer


@dataclass
class Timing:
    """One streamed answer: first token, gaps between token events, whole answer (seconds)."""

    ttft: float = 0.0
    gaps: list[float] = field(default_factory=list)
    total: float = 0.0
    done: bool = False
    status: int = 0
    error: str = ""


def stream_once(port: int, path: str, body: bytes) -> Timing:
    """Send `body`, read the SSE answer event by event, time it."""
    timing = Timing()
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        return _read_stream(conn, path, body, timing, start)
    except OSError as exc:  # counted as an answer without [DONE]; named in the output
        timing.error = type(exc).__name__
        return timing
    finally:
        conn.close()


def _read_stream(conn: http.client.HTTPConnection, path: str, body: bytes, timing: Timing, start: float) -> Timing:
    """Send `body` on `conn` and time the SSE answer into `timing`."""
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    timing.status = response.status
    last = None
    while line := response.readline():
        if not line.startswith(b"data: "):
            continue
        now = time.perf_counter()
        if line.strip() == b"data: [DONE]":
            timing.done = True
            continue
        event = json.loads(line[6:])
        choices = event.get("choices") or []
        piece = choices[0].get("text") or (choices[0].get("delta") or {}).get("content") if choices else None
        if not piece:
            continue
        if last is None:
            timing.ttft = now - start
        else:
            timing.gaps.append(now - last)
        last = now
    timing.total = time.perf_counter() - start
    return timing


def compare_streams(label: str, direct: list[Timing], ours: list[Timing]) -> None:
    """Print the added first-token time, added gap and whole-answer ratio (p50s of complete answers)."""
    for side, timings in (("direct", direct), ("worker", ours)):
        bad = [t.error or str(t.status) for t in timings if t.status != 200 or not t.done]
        if bad:
            say(f"    {side}: {len(bad)} answer(s) without 200 + [DONE], left out: {', '.join(sorted(set(bad)))}")
    direct = [t for t in direct if t.done]
    ours = [t for t in ours if t.done]
    d_gaps = [g for t in direct for g in t.gaps]
    o_gaps = [g for t in ours for g in t.gaps]
    d_ttft, o_ttft = p50([t.ttft for t in direct]), p50([t.ttft for t in ours])
    d_total, o_total = p50([t.total for t in direct]), p50([t.total for t in ours])
    say(f"  {label}: {len(direct)} / {len(ours)} complete answers direct / through the worker")
    say(f"    time to first token p50: direct {d_ttft * 1000:.1f} ms, worker {o_ttft * 1000:.1f} ms, "
        f"added {(o_ttft - d_ttft) * 1000:+.2f} ms")
    say(f"    gap between tokens p50: direct {p50(d_gaps) * 1000:.2f} ms, worker {p50(o_gaps) * 1000:.2f} ms, "
        f"added {(p50(o_gaps) - p50(d_gaps)) * 1000:+.3f} ms")
    say(f"    whole answer p50: direct {d_total:.3f} s, worker {o_total:.3f} s, ratio {o_total / d_total:.3f}x")


# --------------------------------------------------------------------------- parts


def part_stream_llama(tmp: Path, runs: int, worker_python: Path, pubkey: str) -> None:
    with Harness(tmp, worker_python, pubkey) as harness:
        engine = harness.llama(downloads.xllamacpp_python(), downloads.smollm2_model_path())
        served = harness.serve("llama", engine, MODEL_NAME="smollm2")
        engine_port = engine.port
        payload = {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 150, "ignore_eos": True,
                   "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        raw = json.dumps(payload).encode()
        direct, ours = [], []
        stream_once(engine_port, "/v1/completions", raw)  # warm the prompt cache for both sides alike
        for i in range(runs):
            order = [("d", engine_port, raw), ("w", served.port, envelope(payload, i + 1))]
            for kind, port, body in order if i % 2 == 0 else order[::-1]:
                (direct if kind == "d" else ours).append(stream_once(port, "/v1/completions", body))
        compare_streams("real llama.cpp, 150 tokens, one stream at a time", direct, ours)


def concurrent(port: int, body: bytes, clients: int) -> list[Timing]:
    out: list[Timing] = []
    lock = threading.Lock()

    def one() -> None:
        timing = stream_once(port, "/v1/completions", body)
        with lock:
            out.append(timing)

    threads = [threading.Thread(target=one) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out


def part_stream_standin(tmp: Path, runs: int, worker_python: Path, pubkey: str) -> None:
    with Harness(tmp, worker_python, pubkey) as harness:
        engine = harness.standin("vllm", **PER_TOKEN_20MS)
        served = harness.serve("vllm", engine, MODEL_NAME=MODEL)
        engine_port = engine.port
        payload = {"model": MODEL, "prompt": "stream", "stream": True}
        direct, ours = [], []
        for i in range(runs):
            first = i % 2 == 0
            for kind in ("d", "w") if first else ("w", "d"):
                if kind == "d":
                    direct += concurrent(engine_port, json.dumps(payload).encode(), 16)
                else:
                    ours += concurrent(served.port, envelope(payload, i + 1), 16)
        compare_streams("stand-in, 20 ms per token, 50 tokens, 16 concurrent streams", direct, ours)


def closed_loop(port: int, body: bytes, clients: int, seconds: float) -> tuple[float, list[float]]:
    """`clients` threads sending `body` back to back for `seconds`; (requests/s, latencies)."""
    latencies: list[float] = []
    errors: list[int] = []
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def loop() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        mine = []
        while time.perf_counter() < stop:
            start = time.perf_counter()
            try:
                conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
            except OSError:  # a reset keep-alive connection: counted, then a new one
                errors.append(1)
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                continue
            if response.status == 200:
                mine.append(time.perf_counter() - start)
        conn.close()
        with lock:
            latencies.extend(mine)

    began = time.perf_counter()
    threads = [threading.Thread(target=loop) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        say(f"    port {port}: {len(errors)} connection error(s) (reset), retried on a new connection")
    return len(latencies) / (time.perf_counter() - began), latencies


def part_latency(tmp: Path, runs: int, worker_python: Path, pubkey: str) -> None:
    with Harness(tmp, worker_python, pubkey) as harness:
        engine = harness.standin("vllm", **ANSWER_50MS)
        served = harness.serve("vllm", engine, MODEL_NAME=MODEL)
        engine_port = engine.port
        payload = {"model": MODEL, "prompt": "fifty ms"}
        ratios, added = [], []
        for i in range(runs):
            direct = closed_loop(engine_port, json.dumps(payload).encode(), 16, 5.0)
            ours = closed_loop(served.port, envelope(payload, i + 1), 16, 5.0)
            ratios.append(ours[0] / direct[0])
            added.append(p50(ours[1]) - p50(direct[1]))
            say(f"    round {i + 1}: direct {direct[0]:.1f} req/s p50 {p50(direct[1]) * 1000:.1f} ms; worker "
                f"{ours[0]:.1f} req/s p50 {p50(ours[1]) * 1000:.1f} ms")
        say(f"  engine answering in 50 ms, 16 concurrent: throughput worker/direct p50 {p50(ratios):.3f}x "
            f"(min {min(ratios):.3f}), p50 added {p50(added) * 1000:+.2f} ms")


def held_answer(port: int, body: bytes, started: threading.Barrier, results: list[Timing]) -> None:
    """A streamed answer that is in flight when `started` opens; appends whether it ended with [DONE]."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    timing = Timing()
    try:
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        timing.status = response.status
        response.readline()
        started.wait(10)
        timing.done = response.read().rstrip().endswith(b"data: [DONE]")
    except Exception:  # noqa: BLE001 - a cut answer is a lost one
        timing.done = False
    finally:
        conn.close()
    results.append(timing)  # list.append is atomic under the GIL


def part_drain(tmp: Path, stops: int, worker_python: Path, pubkey: str, report: bool) -> None:
    """`stops` cycles of: fresh worker, (the load line -> loaded report), 4 answers in flight, SIGTERM."""
    lost = in_flight = refused = 0
    to_ready, to_report = [], []
    with Harness(tmp, worker_python, pubkey) as harness:
        engine = harness.standin("vllm", **PER_TOKEN_20MS)
        time.sleep(1.0)
        payload = {"model": MODEL, "prompt": "drain", "stream": True}
        for cycle in range(stops):
            cycle_dir = tmp / f"cycle{cycle}"
            cycle_dir.mkdir()
            log = cycle_dir / "model.log"
            log.write_text("")
            # A harness per cycle: a fresh report server, state dir and worker, all stopped at its end;
            # the worker's MODEL_LOG is the cycle's own log (the load line is written there below).
            with Harness(cycle_dir, worker_python, pubkey) as cycle_harness:
                reports = cycle_harness.reports
                served = cycle_harness.worker("vllm", Engine(engine.port, log), MODEL_NAME=MODEL)
                port, worker = served.port, served.worker
                worker.wait_for("HTTP servers started", timeout=60)
                t0 = time.perf_counter()
                with open(log, "a") as out:
                    out.write(LOAD_LINE)
                ready = reported = None
                deadline = t0 + 60
                while (ready is None or reported is None) and time.perf_counter() < deadline:
                    if ready is None and SDK_READY in worker.text:
                        ready = time.perf_counter() - t0
                    if reported is None and any(s.get("loadtime", 0) > 0 and s.get("max_perf", 0) > 0
                                                for s in reports.statuses()):
                        reported = time.perf_counter() - t0
                    time.sleep(0.01)
                if ready is not None:
                    to_ready.append(ready)
                if reported is not None:
                    to_report.append(reported)
                results: list[Timing] = []
                started = threading.Barrier(5)
                threads = [threading.Thread(target=held_answer, args=(port, envelope(payload, i + 1), started, results))
                           for i in range(4)]
                for thread in threads:
                    thread.start()
                started.wait(30)
                os.kill(worker.popen.pid, signal.SIGTERM)
                worker.wait_for("draining", timeout=10)
                late = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                late.request("POST", "/v1/completions", body=envelope({"prompt": "late"}, 99),
                             headers={"Content-Type": "application/json"})
                refused += late.getresponse().status == 503
                late.close()
                for thread in threads:
                    thread.join(30)
                worker.wait_exit(20)
                in_flight += len(threads)
                lost += sum(1 for t in results if t.status != 200 or not t.done) + len(threads) - len(results)
        say(f"  drain: {lost} of {in_flight} answers in flight lost across {stops} stops; "
            f"{refused}/{stops} requests sent after the signal got 503")
        if report:
            say(f"  engine load line -> worker ready (SDK line) p50 {p50(to_ready):.2f} s "
                f"(min {min(to_ready):.2f}, max {max(to_ready):.2f}); -> loaded status report p50 "
                f"{p50(to_report):.2f} s (min {min(to_report):.2f}, max {max(to_report):.2f}), {len(to_report)} runs")


def part_routable(runs: int, worker_python: Path, engines: tuple[str, ...] = ROUTABLE_ENGINES) -> None:
    """Container start -> routable, ours vs the upstream boot path emulated, on each of `engines`' images."""
    import docker
    from boot_bench import Boots, upstream_wheelhouse

    from bakery.bases import make as bases
    from bakery.build.builder import build_image
    from bakery.recipe.render import RenderOptions, render
    from bakery.spec.engine_spec import load_engine

    code = "from Crypto.PublicKey import RSA; print(RSA.generate(2048).export_key().decode())"
    key_pem = subprocess.run([str(worker_python), "-c", code], capture_output=True, check=True).stdout
    wheels = upstream_wheelhouse("3.11")
    client = docker.from_env()
    bases.ensure_base("debian")
    for engine in engines:
        spec = load_engine(engine)
        image = build_image(render(spec, RenderOptions(base_image=bases.ensure_base(spec.base.local))),
                            lambda _m: None).image_id
        boots = Boots(client, image, spec)
        seen: dict[str, list[float]] = {"ours": [], "upstream": []}
        keys: dict[str, list[float]] = {"ours": [], "upstream": []}
        try:
            for run in range(runs):
                for variant in (("ours", "upstream") if run % 2 == 0 else ("upstream", "ours")):
                    idle = cpu_idle()
                    result = boots.routable(variant, key_pem=key_pem, wheels=wheels)
                    for note in result.notes:
                        say(note)
                    say(f"routable {engine} {variant} run {run + 1}: start -> key {result.start_to_key} s, "
                        f"-> routable {result.start_to_routable} s (idle before {idle:.0%})")
                    if result.start_to_routable is not None:
                        seen[variant].append(result.start_to_routable)
                    if result.start_to_key is not None:
                        keys[variant].append(result.start_to_key)
        finally:
            boots.close()
        ours, up = p50(seen["ours"]), p50(seen["upstream"])
        say(f"routable {engine}: container start -> routable p50 ours {ours:.2f} s "
            f"[{min(seen['ours'], default=float('nan')):.2f}, {max(seen['ours'], default=float('nan')):.2f}] "
            f"({len(seen['ours'])}/{runs}), upstream emulated {up:.2f} s "
            f"[{min(seen['upstream'], default=float('nan')):.2f}, {max(seen['upstream'], default=float('nan')):.2f}] "
            f"({len(seen['upstream'])}/{runs}); ratio upstream / ours {up / ours:.1f}x; "
            f"start -> key served p50 ours {p50(keys['ours']):.2f} s, upstream {p50(keys['upstream']):.2f} s")


# --------------------------------------------------------------------------- scale: N streams at once


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (state, ppid, ...), None if the pid is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def process_tree(root: int) -> list[int]:
    """`root` and every descendant of it (from each process's ppid in /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(int(entry))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def cpu_times(pids: list[int]) -> dict[int, tuple[float, float]]:
    """Each live pid's (utime, stime) in seconds (a pid gone is left out)."""
    seen = {}
    for pid in pids:
        if (fields := _stat_fields(pid)) is not None:
            seen[pid] = (int(fields[11]) / CLOCK_TICK, int(fields[12]) / CLOCK_TICK)
    return seen


def process_role(pid: int, root: int) -> str:
    """What a process of the worker's tree is: "worker" (the root), "relay" (a bakery-relay), "front"
    (another Python process of the tree: a front process), or "other"."""
    if pid == root:
        return "worker"
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "other"
    return "relay" if comm.startswith("bakery-relay") else "front" if comm.startswith("python") else "other"


def rss_kib(pids: list[int]) -> int:
    """The summed VmRSS of `pids` (KiB; a pid gone counts 0)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
                    break
        except OSError:
            continue
    return total


class Watch:
    """A worker's CPU time and RSS peak over one round: every process of its tree, RSS every 50 ms."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.pids = process_tree(root)
        self.rss_before = rss_kib(self.pids)
        self.rss_peak = self.rss_before
        self.times_before = cpu_times(self.pids)
        self.cpu = self.user = self.system = 0.0
        self.roles: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        pids, count = self.pids, 0
        while not self._stop.wait(0.05):
            count += 1
            if count % 20 == 0:  # a process started during the round is seen within a second
                pids = process_tree(self.root)
            self.rss_peak = max(self.rss_peak, rss_kib(pids))

    def stop(self) -> Watch:
        self._stop.set()
        self._thread.join()
        pids = process_tree(self.root)
        self.rss_peak = max(self.rss_peak, rss_kib(pids))
        # A process of the tree that ended during the round takes its CPU time with it (not counted);
        # one started during it counts from 0.
        times = cpu_times(pids)
        before = self.times_before.values()
        self.user = sum(u for u, _ in times.values()) - sum(u for u, _ in before)
        self.system = sum(t for _, t in times.values()) - sum(t for _, t in before)
        self.cpu = self.user + self.system
        for pid, (user, system) in times.items():
            role = process_role(pid, self.root)
            self.roles[role] = self.roles.get(role, 0.0) + user + system - sum(self.times_before.get(pid, (0.0, 0.0)))
        self.pids = sorted(set(self.pids) | set(pids))
        return self

    def per_role(self, count: int, unit: float, label: str) -> str:
        """The round's CPU by role per `count` things ("worker 9.1, relay 10.2 us/event"), or ""."""
        if not count or not self.roles:
            return ""
        parts = [f"{role} {seconds / count * unit:.{3 if unit < 1e6 else 1}f}"
                 for role, seconds in sorted(self.roles.items())]
        return f" ({', '.join(parts)} {label})"


def streamload(port: int, streams: int, payload: dict, timeout: float, envelope_from: int | None) -> dict:
    """Run bench/streamload.py (its own process) against 127.0.0.1:`port`; its JSON result, or one with
    every stream an error when it failed."""
    cmd = [sys.executable, str(STREAMLOAD), "--port", str(port), "--streams", str(streams),
           "--body", json.dumps(payload), "--timeout", str(timeout)]
    if envelope_from is not None:
        cmd += ["--envelope", "--first-idx", str(envelope_from)]
    failed = {"streams": streams, "completed": 0, "errors": streams, "events": 0, "wall_s": None,
              "events_per_s": None, "ttft_p50_ms": None, "ttft_p95_ms": None, "connect_s": None, "timed_out": True}
    try:
        out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        return {**failed, "first_errors": [f"streamload did not stop within {timeout + 60:g} s"]}
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {**failed, "first_errors": [f"streamload exited {out.returncode}: {out.stderr.strip()[-500:]}"]}


def _num(value: float | None, spec: str = ".1f") -> str:
    return "n/a" if value is None or value != value else format(value, spec)


def _outcome(result: dict) -> str:
    """"256/256 done, 0 errors" plus the first error texts and the timeout, if any."""
    text = f"{result['completed']}/{result['streams']} done, {result['errors']} errors"
    if result.get("timed_out"):
        text += " (timed out)"
    if result["errors"]:
        text += f" [{'; '.join(result.get('first_errors') or [])[:400]}]"
    return text


def _added(worker: float | None, direct: float | None) -> float | None:
    return None if worker is None or direct is None else worker - direct


def alternating_rounds(n: int, runs: int) -> Iterator[tuple[int, tuple[str, str]]]:
    """Each round's index and its two sides in order, "direct" first in even rounds so neither side
    always meets the machine the other one warmed; says which round starts."""
    for i in range(runs):
        sides = ("direct", "worker") if i % 2 == 0 else ("worker", "direct")
        say(f"  {n} streams, round {i + 1} of {runs} ({sides[0]} first)")
        yield i, sides


def stream_counts(text: str) -> list[int] | None:
    """--streams ("256,1024") as positive integers, or None when it is not that."""
    try:
        counts = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        return None
    return counts if counts and min(counts) >= 1 else None


def requests_round(pid: int, load: Callable[[], dict],
                   per_request: list[float]) -> tuple[dict, float | None, float, Watch]:
    """One round of non-streamed requests (`load()` sends them): its result, the CPU per completed
    request of the process tree at `pid` (ms, None when none completed; else also appended to
    `per_request`), the idle share before, the watch."""
    idle = cpu_idle()
    watch = Watch(pid)
    result = load()
    watch.stop()
    ms = watch.cpu / result["completed"] * 1000 if result["completed"] else None
    if ms is not None:
        per_request.append(ms)
    return result, ms, idle, watch


def relay_line(log: str) -> str:
    """The worker's start lines that say what moves its streamed bodies (native_relay.py) and what it
    keeps of its engine connections (engine_warm.py)."""
    said = [line.strip() for line in log.splitlines()
            if "streamed bodies after their head:" in line or "idle engine connections:" in line]
    return "; ".join(said[-2:]) if said else "the worker did not say what relays its streams"


def worker_knobs(args: argparse.Namespace) -> dict[str, str]:
    """The worker variables `--event-loop`, `--front`, `--relay` and each `--worker-env NAME=VALUE` set
    (unset: the worker's defaults)."""
    chosen = {"BAKERY_EVENT_LOOP": args.event_loop, "BAKERY_FRONT": args.front, "BAKERY_RELAY": args.relay}
    chosen.update(dict(item.split("=", 1) for item in getattr(args, "worker_env", None) or []))
    return {name: value for name, value in chosen.items() if value is not None}


def worker_env_item(text: str) -> str:
    """argparse type of --worker-env: NAME=VALUE with a BAKERY_ name (a worker setting to compare)."""
    name, sep, _ = text.partition("=")
    if not sep or not name.startswith("BAKERY_") or not name.replace("_", "").isalnum():
        raise argparse.ArgumentTypeError(f"--worker-env takes BAKERY_NAME=VALUE, got {text!r}")
    return text


def part_scale(tmp: Path, counts: list[int], runs: int, timeout: float, worker_python: Path, pubkey: str,
               engine_kind: str = "c", knobs: dict[str, str] | None = None) -> None:
    """N streams at once, direct and through the worker (see the module docstring, "scale")."""
    with Harness(tmp, worker_python, pubkey) as harness:
        # 64 tokens at 20 ms per token from either engine.
        engine = engine_floor(harness, tmp, MODEL) if engine_kind == "c" else harness.standin("vllm", **SCALE_STANDIN)
        loop_env = dict(knobs or {})
        say(f"  engine: {'bench/engine_floor.c' if engine_kind == 'c' else 'the vLLM stand-in'}; the worker's "
            f"settings: {' '.join(f'{k}={v}' for k, v in loop_env.items()) or 'its defaults'}")
        payload = {"model": MODEL, "prompt": "scale", "stream": True}
        single = {"model": MODEL, "prompt": "scale", "stream": False, "max_tokens": 1}
        for n in counts:
            # A fresh worker for each N: Python keeps the memory a round grew, so on a worker that already
            # carried N streams the next round's RSS grows by little or nothing.
            (tmp / f"worker-{n}").mkdir()
            with Harness(tmp / f"worker-{n}", worker_python, pubkey) as per_n:
                part_scale_n(engine, per_n.serve("vllm", engine, MODEL_NAME=MODEL, **loop_env), n, runs, timeout,
                             payload, single)


def part_scale_n(engine: Engine, served: Served, n: int, runs: int, timeout: float, payload: dict,
                 single: dict) -> None:
    """The rounds of one N against `engine`, direct and through `served`."""
    worker_pid = served.worker.popen.pid  # start_server.sh execs python: the tree is usually this pid
    say(f"  {n} streams: 20 ms per token, 64 tokens; a fresh worker, its processes "
        f"{process_tree(worker_pid)}; {relay_line(served.worker.output.read_text())}")
    idx = 1
    rows: dict[str, list[float]] = {key: [] for key in (
        "direct_eps", "worker_eps", "ratio", "added_p50", "added_p95", "us_event", "kib_stream", "ms_req",
        "cpu_s", "events", "streams")}
    for i, sides in alternating_rounds(n, runs):
        seen: dict[str, dict] = {}
        for side in sides:
            idle = cpu_idle()
            if side == "direct":
                result = streamload(engine.port, n, payload, timeout, None)
                seen[side] = result
                say(f"    direct: idle before {idle:.0%}; {_outcome(result)}; {result['events']} events in "
                    f"{_num(result['wall_s'], '.2f')} s = {_num(result['events_per_s'])} events/s; "
                    f"first token p50 {_num(result['ttft_p50_ms'])} ms, p95 {_num(result['ttft_p95_ms'])} ms; "
                    f"connecting {_num(result['connect_s'], '.2f')} s")
                continue
            watch = Watch(worker_pid)
            result = streamload(served.port, n, payload, timeout, idx)
            watch.stop()
            idx += n
            seen[side] = result
            us_event = watch.cpu / result["events"] * 1e6 if result["events"] else None
            kib_stream = (watch.rss_peak - watch.rss_before) / n
            say(f"    worker: idle before {idle:.0%}; {_outcome(result)}; {result['events']} events in "
                f"{_num(result['wall_s'], '.2f')} s = {_num(result['events_per_s'])} events/s; "
                f"first token p50 {_num(result['ttft_p50_ms'])} ms, p95 {_num(result['ttft_p95_ms'])} ms; "
                f"connecting {_num(result['connect_s'], '.2f')} s; worker CPU {watch.cpu:.2f} s (user "
                f"{watch.user:.2f}, system {watch.system:.2f}) = {_num(us_event)} us/event"
                f"{watch.per_role(result['events'], 1e6, 'us/event')}; "
                f"RSS {watch.rss_before / 1024:.1f} -> peak "
                f"{watch.rss_peak / 1024:.1f} MiB = {kib_stream:+.1f} KiB/stream")
            if us_event is not None:
                rows["us_event"].append(us_event)
                rows["cpu_s"].append(watch.cpu)
                rows["events"].append(result["events"])
                rows["streams"].append(result["completed"])
            rows["kib_stream"].append(kib_stream)
        direct, worker = seen["direct"], seen["worker"]
        ratio = (worker["events_per_s"] / direct["events_per_s"]
                 if worker["events_per_s"] and direct["events_per_s"] else None)
        added_p50 = _added(worker["ttft_p50_ms"], direct["ttft_p50_ms"])
        added_p95 = _added(worker["ttft_p95_ms"], direct["ttft_p95_ms"])
        say(f"    round {i + 1}: events/s worker/direct {_num(ratio, '.3f')}x; first token added "
            f"p50 {_num(added_p50, '+.1f')} ms, p95 {_num(added_p95, '+.1f')} ms")
        for key, value in (("direct_eps", direct["events_per_s"]), ("worker_eps", worker["events_per_s"]),
                           ("ratio", ratio), ("added_p50", added_p50), ("added_p95", added_p95)):
            if value is not None:
                rows[key].append(value)
        # CPU per request: N non-streamed answers of one token through the worker.
        result, ms_req, idle, watch = requests_round(
            worker_pid, lambda: streamload(served.port, n, single, timeout, idx), rows["ms_req"])  # noqa: B023
        idx += n
        say(f"    requests: idle before {idle:.0%}; {n} non-streamed (max_tokens 1) through the worker: "
            f"{_outcome(result)} in {_num(result['wall_s'], '.2f')} s; worker CPU {watch.cpu:.2f} s = "
            f"{_num(ms_req, '.2f')} ms/request{watch.per_role(result['completed'], 1e3, 'ms/request')}")
    # A streamed answer costs one request's setup plus its events: the events' own share is what is
    # left of the round's CPU after the per-request cost measured on 1-token answers.
    if rows["ms_req"] and rows["cpu_s"]:
        per_request = p50(rows["ms_req"]) / 1000
        net = [(cpu - streams * per_request) / events * 1e6
               for cpu, streams, events in zip(rows["cpu_s"], rows["streams"], rows["events"], strict=True) if events]
        say(f"  {n} streams: worker CPU per event net of the per-request cost ({p50(rows['ms_req']):.2f} ms): "
            f"{_num(p50(net))} us (by round: {', '.join(format(x, '.1f') for x in net)})")
    say(f"  {n} streams at once, medians over {runs} round(s): events/s direct "
        f"{_num(p50(rows['direct_eps']))}, worker {_num(p50(rows['worker_eps']))}, worker/direct "
        f"{_num(p50(rows['ratio']), '.3f')}x; first token added p50 {_num(p50(rows['added_p50']), '+.1f')} ms, "
        f"p95 {_num(p50(rows['added_p95']), '+.1f')} ms; worker CPU {_num(p50(rows['us_event']))} us/event, "
        f"{_num(p50(rows['ms_req']), '.2f')} ms/request (non-streamed, 1 token); RSS "
        f"{_num(p50(rows['kib_stream']), '+.1f')} KiB/open stream (by round: "
        f"{', '.join(format(k, '+.1f') for k in rows['kib_stream'])}; after the first, a round reuses "
        f"the memory the first one grew)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(PARTS))
    parser.add_argument("--runs", type=int, default=None, help="runs (rounds) of each part (default 5; scale: 3)")
    parser.add_argument("--drain-stops", type=int, default=20)
    parser.add_argument("--routable-engines", default=",".join(ROUTABLE_ENGINES),
                        help="routable: the engines whose images boot, comma-separated (default: %(default)s)")
    parser.add_argument("--streams", default="256,1024", help="scale: the stream counts, comma-separated")
    parser.add_argument("--scale-timeout", type=float, default=120.0,
                        help="scale: a load round stops after this many seconds (bench/streamload.py --timeout)")
    parser.add_argument("--scale-engine", choices=("c", "standin"), default="c",
                        help="scale: bench/engine_floor.c (default: leaves the cores to the worker) or the "
                             "Python vLLM stand-in")
    parser.add_argument("--event-loop", choices=("uvloop", "asyncio"), default=None,
                        help="scale: the worker's BAKERY_EVENT_LOOP (default: unset, the worker's default)")
    parser.add_argument("--front", choices=("wire", "aiohttp"), default=None,
                        help="scale: the worker's BAKERY_FRONT (default: unset, the worker's default: wire)")
    parser.add_argument("--relay", choices=("native", "python"), default=None,
                        help="scale: the worker's BAKERY_RELAY (default: unset, the worker's default: native)")
    parser.add_argument("--worker-env", action="append", type=worker_env_item, default=None, metavar="NAME=VALUE",
                        help="scale: a BAKERY_ worker setting for this run (repeatable), e.g. "
                             "BAKERY_ENGINE_READY_CONNECTIONS=0 to compare against the default")
    parser.add_argument("--worker-python", default=None,
                        help="the worker's Python (default: the lean worker venv of worker/requirements.txt)")
    args = parser.parse_args()
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        print(f"serving_bench: unknown part(s) {', '.join(sorted(unknown))}; known: {', '.join(PARTS)}",
              file=sys.stderr)
        return 2
    counts = stream_counts(args.streams)
    if counts is None:
        print(f"serving_bench: --streams must be positive integers, comma-separated, got {args.streams!r}",
              file=sys.stderr)
        return 2
    routable_engines = tuple(e.strip() for e in args.routable_engines.split(",") if e.strip())
    if not routable_engines or set(routable_engines) - set(ROUTABLE_ENGINES):
        print(f"serving_bench: --routable-engines takes some of {', '.join(ROUTABLE_ENGINES)}, comma-separated, "
              f"got {args.routable_engines!r}", file=sys.stderr)
        return 2
    runs = args.runs or 5
    say(f"CPU: {cpu_model()}; {raise_open_files()}")
    worker_python = Path(args.worker_python) if args.worker_python else downloads.host_worker_venv() / "bin" / "python"
    say(f"worker venv: {worker_python.parent.parent}")
    code = "from Crypto.PublicKey import RSA; print(RSA.generate(1024).publickey().export_key().decode())"
    pubkey = subprocess.run([str(worker_python), "-c", code], capture_output=True, text=True, check=True).stdout
    with tempfile.TemporaryDirectory(prefix="bk-serve-bench-") as root:
        for part in parts:
            if part == "report" and "drain" in parts:
                continue  # measured inside the drain cycles
            tmp = Path(root) / part
            tmp.mkdir()
            say(f"{part}: idle CPU share before: {cpu_idle():.0%} (load average {os.getloadavg()[0]:.2f})")
            if part == "stream_llama":
                part_stream_llama(tmp, runs, worker_python, pubkey)
            elif part == "stream_standin":
                part_stream_standin(tmp, runs, worker_python, pubkey)
            elif part == "latency":
                part_latency(tmp, runs, worker_python, pubkey)
            elif part == "routable":
                part_routable(runs, worker_python, routable_engines)
            elif part == "scale":
                part_scale(tmp, counts, args.runs or 3, args.scale_timeout, worker_python, pubkey,
                           args.scale_engine, worker_knobs(args))
            elif part in ("drain", "report"):
                part_drain(tmp, args.drain_stops if part == "drain" else 5, worker_python, pubkey,
                           report="report" in parts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
