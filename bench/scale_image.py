#!/usr/bin/env python3
"""The worker at GPU concurrency through an image's port 3000 (issue 24), measured on this host.

    python3 bench/scale_image.py [--engine sglang] [--streams 256,1024] [--runs 3] [--scale-timeout 120]
                                 [--scale-engine c|standin] [--event-loop uvloop|asyncio]

serving_bench.py's `scale` part measures the worker on the host (UNSECURED=true). This one measures it
as it ships: the engine's image, built on its local base (the SGLang image: its stand-in engine at 20 ms
per token, 64 tokens a stream), launched as the platform launches it (security on; the control-plane
stand-in of tests/controlplane inside the container serves the key and signs). For each N of
--streams, N streamed completions at once, the order alternating across --runs rounds:

- direct: straight to the engine inside the container (127.0.0.1:18000, where the image binds it);
- through :3000: every request in the platform's signed envelope (auth_data.url the worker's own URL,
  as its report names it, signed by the control plane's key; the worker verifies every signature).

The load is bench/streamload.py run inside the container with the image's Python (a process of its
own; the engine listens on the container's loopback only, and both sides go the same way). The
worker's CPU (user + system of its process, from the host's /proc) per streamed event and its RSS at
the round's peak per open stream, and the machine's busy share during each side (near 100 %, the two
cores are the limit: the load, the engine and the worker share them); then N non-streamed one-token
requests through :3000: CPU per request, signature check included. The idle share before each
round, the CPU model once; nothing is asserted, it reports. Every container it starts is removed
when it ends.

The engine answering is bench/engine_floor.c (`--scale-engine c`, the default since 2026-12-04; the
older spelling `--c-engine` still works): compiled statically here, copied into the container and
started there on 127.0.0.1:18001 before the worker is ready, MODEL_SERVER_URL pointing the worker
at it (as a launch template may), and "direct" goes to it too: the stand-in's answers at its pace
from C (tests/bases/test_engine_floor.py), the cores left to the worker as a GPU engine leaves them.
The image's own engine still starts and writes the ready line the worker waits for; it then idles.
`--scale-engine standin` forwards to the image's own stand-in, as the figures before that date: it
is Python and takes most of the two cores at 256 streams, so the worker's CPU is taken from it and
the ratio reads the stand-in's ceiling. `--event-loop` launches the worker with that
BAKERY_EVENT_LOOP (uvloop is its default; asyncio to compare), `--front` with that BAKERY_FRONT
(wire is its default; aiohttp to compare), `--relay` with that BAKERY_RELAY (native is its default;
python to compare).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from c_parts import build_c  # noqa: E402
from serving_bench import (  # noqa: E402
    Watch,
    _added,
    _num,
    _outcome,
    alternating_rounds,
    cpu_idle,
    cpu_model,
    p50,
    relay_line,
    requests_round,
    say,
    stream_counts,
    worker_env_item,
    worker_knobs,
)

from tests.image import launch as gate  # noqa: E402

TOKENS = 64
STANDIN = {"STANDIN_TOKEN_DELAY": "0.02", "STANDIN_REPLY_TOKENS": str(TOKENS)}
LOAD_DIR = "/tmp/bakery-scale"
ENGINE_PORT = 18000  # where images/<engine>.yaml's command binds the engine, inside the container
C_ENGINE_PORT = 18001  # where --scale-engine c starts bench/engine_floor.c, inside the container
C_ENGINE_DIR = "/tmp/bakery-floor"


def cpu_counters() -> tuple[int, int]:
    """(idle, total) jiffies of the whole machine, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return fields[3] + fields[4], sum(fields)


def busy_since(before: tuple[int, int]) -> float:
    """The machine's busy share since `before` (cpu_counters()): near 1.0, the load, the engine and the
    worker together use both cores, and a ratio below 1 is the cores' limit, not the worker's."""
    idle, total = cpu_counters()
    return 1 - (idle - before[0]) / max(1, total - before[1])


def arguments() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="sglang", help="an engine whose local base is a stand-in (default: sglang)")
    parser.add_argument("--streams", default="256,1024", help="the stream counts, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scale-timeout", type=float, default=120.0, help="a load round stops after this (s)")
    parser.add_argument("--scale-engine", choices=("c", "standin"), default="c",
                        help="bench/engine_floor.c inside the container (default) or the image's own stand-in")
    parser.add_argument("--c-engine", dest="scale_engine", action="store_const", const="c",
                        help="the same as --scale-engine c (the default)")
    parser.add_argument("--event-loop", choices=("uvloop", "asyncio"), default=None,
                        help="the worker's BAKERY_EVENT_LOOP, set at launch as a template may (default: unset)")
    parser.add_argument("--front", choices=("wire", "aiohttp"), default=None,
                        help="the worker's BAKERY_FRONT, set at launch as a template may (default: unset, wire)")
    parser.add_argument("--relay", choices=("native", "python"), default=None,
                        help="the worker's BAKERY_RELAY, set at launch as a template may (default: unset, native)")
    parser.add_argument("--worker-env", action="append", type=worker_env_item, default=None, metavar="NAME=VALUE",
                        help="a BAKERY_ worker setting set at launch (repeatable), e.g. "
                             "BAKERY_ENGINE_READY_CONNECTIONS=0 to compare against the default")
    return parser.parse_args()


def load_archive() -> bytes:
    """bench/streamload.py and the loadgen module it imports, as a tar rooted at bakery-scale/."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("streamload.py", "loadgen.py"):
            data = (BENCH / name).read_bytes()
            info = tarfile.TarInfo(f"bakery-scale/{name}")
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def host_pid(container: object, pid_in_container: int) -> int:
    """The host's pid of the container's process `pid_in_container` (the last NSpid of /proc/<pid>/status)."""
    top = container.top()  # type: ignore[attr-defined]
    column = top["Titles"].index("PID")
    for row in top["Processes"]:
        pid = int(row[column])
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:") and int(line.split()[-1]) == pid_in_container:
                return pid
    raise RuntimeError(f"no process of the container has pid {pid_in_container} in it")


def streamload(launched: gate.Launched, port: int, n: int, payload: dict, timeout: float,
               signed: tuple[str, str, int] | None) -> dict:
    """streamload.py inside the container against 127.0.0.1:`port`; with `signed` (url, signature,
    first idx) each body in the signed envelope. Its JSON result, or every stream an error."""
    cmd = [gate.WORKER_PYTHON, f"{LOAD_DIR}/streamload.py", "--port", str(port), "--streams", str(n),
           "--body", json.dumps(payload), "--timeout", str(timeout)]
    if signed is not None:
        url, signature, first = signed
        cmd += ["--envelope", "--first-idx", str(first), "--url", url, "--signature", signature]
    result = launched.container.exec_run(cmd, demux=True)
    out = (result.output[0] or b"").decode(errors="replace").strip()
    try:
        return json.loads(out.splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        err = (result.output[1] or b"").decode(errors="replace").strip()[-400:]
        return {"streams": n, "completed": 0, "errors": n, "first_errors": [f"streamload failed: {err}"],
                "events": 0, "wall_s": None, "events_per_s": None, "ttft_p50_ms": None, "ttft_p95_ms": None,
                "connect_s": None, "timed_out": False}


def worker_url(launched: gate.Launched) -> str:
    """The worker's own URL, as its latest /worker_status/ report names it."""
    for report in reversed(launched.reports()):
        if report.get("url"):
            return str(report["url"])
    raise RuntimeError("no status report names the worker's URL")


def start_c_engine(launched: gate.Launched, binary: bytes, model: str) -> None:
    """Copy `binary` (engine_floor, static) into the container and start it on C_ENGINE_PORT, 64 tokens
    at 20 ms; it stops with the container (or by itself 600 s after its last connection)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(f"{C_ENGINE_DIR.rsplit('/', 1)[1]}/engine_floor")
        info.size, info.mode, info.mtime = len(binary), 0o755, int(time.time())
        tar.addfile(info, io.BytesIO(binary))
    launched.container.put_archive("/tmp", buf.getvalue())
    launched.container.exec_run([f"{C_ENGINE_DIR}/engine_floor", str(C_ENGINE_PORT), f"{C_ENGINE_DIR}/engine.log",
                                 model, str(TOKENS), "20", "600"], detach=True)


def scale_n(launched: gate.Launched, worker: int, signed: tuple[str, str], n: int, runs: int,
            timeout: float, model: str, first_idx: int, engine_port: int = ENGINE_PORT) -> None:
    """The rounds of one N, through `launched` (its worker's host pid `worker`); "direct" to `engine_port`."""
    payload = {"model": model, "prompt": "scale", "stream": True}
    single = {"model": model, "prompt": "scale", "stream": False, "max_tokens": 1}
    idx = first_idx
    rows: dict[str, list[float]] = {key: [] for key in (
        "direct_eps", "worker_eps", "ratio", "added_p50", "added_p95", "us_event", "user", "system",
        "kib_stream", "ms_req", "busy_direct", "busy_worker")}
    for i, sides in alternating_rounds(n, runs):
        seen: dict[str, dict] = {}
        for side in sides:
            idle = cpu_idle()
            counters = cpu_counters()
            if side == "direct":
                result = seen[side] = streamload(launched, engine_port, n, payload, timeout, None)
                rows["busy_direct"].append(busy_since(counters))
                say(f"    direct: idle before {idle:.0%}; machine busy {rows['busy_direct'][-1]:.0%} during; "
                    f"{_outcome(result)}; {result['events']} events = "
                    f"{_num(result['events_per_s'])} events/s; first token p50 {_num(result['ttft_p50_ms'])} ms, "
                    f"p95 {_num(result['ttft_p95_ms'])} ms")
                continue
            watch = Watch(worker)
            result = seen[side] = streamload(launched, 3000, n, payload, timeout, (*signed, idx))
            watch.stop()
            rows["busy_worker"].append(busy_since(counters))
            idx += n
            events = result["events"]
            line = (f"    :3000: idle before {idle:.0%}; machine busy {rows['busy_worker'][-1]:.0%} during; "
                    f"{_outcome(result)}; {events} events = "
                    f"{_num(result['events_per_s'])} events/s; first token p50 {_num(result['ttft_p50_ms'])} ms, "
                    f"p95 {_num(result['ttft_p95_ms'])} ms")
            if events:
                for key, value in (("us_event", watch.cpu), ("user", watch.user), ("system", watch.system)):
                    rows[key].append(value / events * 1e6)
                line += (f"; worker CPU {watch.cpu:.2f} s (user {watch.user:.2f}, system {watch.system:.2f}) = "
                         f"{watch.cpu / events * 1e6:.1f} us/event{watch.per_role(events, 1e6, 'us/event')}")
            kib = (watch.rss_peak - watch.rss_before) / n
            rows["kib_stream"].append(kib)
            say(f"{line}; RSS {watch.rss_before / 1024:.1f} -> peak {watch.rss_peak / 1024:.1f} MiB = "
                f"{kib:+.1f} KiB/stream")
        direct, through = seen["direct"], seen["worker"]
        ratio = (through["events_per_s"] / direct["events_per_s"]
                 if through["events_per_s"] and direct["events_per_s"] else None)
        for key, value in (("direct_eps", direct["events_per_s"]), ("worker_eps", through["events_per_s"]),
                           ("ratio", ratio), ("added_p50", _added(through["ttft_p50_ms"], direct["ttft_p50_ms"])),
                           ("added_p95", _added(through["ttft_p95_ms"], direct["ttft_p95_ms"]))):
            if value is not None:
                rows[key].append(value)
        result, ms, idle, watch = requests_round(
            worker, lambda: streamload(launched, 3000, n, single, timeout, (*signed, idx)), rows["ms_req"])  # noqa: B023
        idx += n
        say(f"    round {i + 1}: events/s :3000/direct {_num(ratio, '.3f')}x; requests: idle before {idle:.0%}; "
            f"{n} signed one-token answers: {_outcome(result)}; worker CPU {watch.cpu:.2f} s = "
            f"{_num(ms, '.2f')} ms/request{watch.per_role(result['completed'], 1e3, 'ms/request')}")
    say(f"  {n} streams through the image, medians over {runs} round(s): events/s direct "
        f"{_num(p50(rows['direct_eps']))}, :3000 {_num(p50(rows['worker_eps']))}, ratio "
        f"{_num(p50(rows['ratio']), '.3f')}x [{', '.join(format(r, '.3f') for r in rows['ratio'])}] (machine busy "
        f"{_num(p50(rows['busy_direct']) * 100, '.0f')} % direct, {_num(p50(rows['busy_worker']) * 100, '.0f')} % "
        f"through :3000); first token "
        f"added p50 {_num(p50(rows['added_p50']), '+.1f')} ms, p95 {_num(p50(rows['added_p95']), '+.1f')} ms; "
        f"worker CPU {_num(p50(rows['us_event']))} us/event (user {_num(p50(rows['user']))}, system "
        f"{_num(p50(rows['system']))}), {_num(p50(rows['ms_req']), '.2f')} ms/request signed; RSS per open "
        f"stream {_num(rows['kib_stream'][0] if rows['kib_stream'] else None, '+.1f')} KiB in the first round "
        f"(later rounds reuse what it grew: {', '.join(format(k, '+.1f') for k in rows['kib_stream'][1:])})")


def connections_to(pid: int, port: int) -> int:
    """Established connections in `pid`'s network namespace to 127.0.0.1:`port` (its /proc net/tcp)."""
    far = f"0100007F:{port:04X}"
    rows = [line.split() for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]]
    return sum(1 for row in rows if row[2] == far and row[3] == "01")


def main() -> int:
    args = arguments()
    counts = stream_counts(args.streams)
    if counts is None or args.runs < 1:
        print("scale_image: --streams takes positive integers (e.g. 256,1024) and --runs a positive one",
              file=sys.stderr)
        return 2
    import docker

    from bakery.bases import make as bases
    from bakery.build.builder import build_image
    from bakery.recipe.render import RenderOptions, render
    from bakery.spec.engine_spec import load_engine

    spec = load_engine(args.engine)
    say(f"CPU: {cpu_model()}; load average {os.getloadavg()[0]:.2f}")
    say(f"building the {args.engine} image on its local base {spec.base.local} ...")
    image = build_image(render(spec, RenderOptions(base_image=bases.ensure_base(spec.base.local))),
                        lambda _m: None).image_id
    client = docker.from_env()
    env = gate.serverless_env(spec, **STANDIN)
    model = gate.gate_model(spec) or "standin-model"
    knobs = worker_knobs(args)
    env.update(knobs)
    say(f"the worker's settings: {' '.join(f'{k}={v}' for k, v in knobs.items()) or 'its defaults'}")
    c_engine = None
    if args.scale_engine == "c":
        with tempfile.TemporaryDirectory(prefix="bk-scale-image-") as tmp:
            c_engine = build_c(Path(tmp), "engine_floor", static=True).read_bytes()
        env["MODEL_SERVER_URL"] = f"http://127.0.0.1:{C_ENGINE_PORT}"
        say(f"engine: bench/engine_floor.c inside the container on 127.0.0.1:{C_ENGINE_PORT}")
    for n in counts:
        # A fresh container for each N: Python keeps the memory a round grew, so on a worker that already
        # carried streams the next N's growth per stream would read low.
        launched = gate.launch(client, image, env, "scale", run_options=gate.launch_options(spec))
        try:
            if c_engine is not None:  # before the worker is ready: its load benchmark goes to it
                start_c_engine(launched, c_engine, model)
            if not launched.ready(180):
                state = "the container exited" if not launched.running() else "180 s passed"
                say(f"the worker did not report ready ({state}):\n" + launched.logs()[-2000:])
                return 1
            launched.container.put_archive("/tmp", load_archive())
            url = worker_url(launched)
            signature = launched.controlplane_cli("sign", url).strip()
            worker = host_pid(launched.container, int(launched.file_text(f"{gate.RUN_DIR}/worker.pid").strip()))
            port = C_ENGINE_PORT if c_engine is not None else ENGINE_PORT
            say(f"{args.engine} image {image[:19]}: a fresh container, ready; worker pid {worker} (host), "
                f"signing for {url}; {relay_line(launched.logs())}; engine connections open before the first "
                f"round: {connections_to(worker, port)}")
            scale_n(launched, worker, (url, signature), n, args.runs, args.scale_timeout, model, 1000, port)
        finally:
            launched.container.remove(force=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
