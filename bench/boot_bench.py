"""Container measurements of bench/run.py: cold start, readiness, the upstream boot path, proxy overhead.

Every container is started the way a launch template starts one (tests/image/launch.py's
`serverless_env`: SERVERLESS=true, the platform's variables, a one-request benchmark). Traffic goes
to 127.0.0.1 only: to a port published on the host's loopback (`-p 127.0.0.1::3000`) or, for the load
tests, from inside the container (`docker exec`). Nothing is ever sent to a container's bridge address.

Definitions (seconds, host clock unless said otherwise):
- start -> listening: from just before the `start` API call on an already created container to the
  first HTTP answer (any status) from the worker's port, probed every 5 ms through the published
  loopback port. A refused or reset connection, or a connection the port proxy accepts and closes
  without an answer, is "not yet". Container creation (and pulling) is not counted: the image is
  on the host.
- load line -> ready: from the moment the engine's load line (`Application startup complete.`) is in
  MODEL_LOG (the log directory is bind-mounted and polled every 2 ms from the host) to the SDK's
  `... marking model as loaded` line, stamped by dockerd as it reads the container's output
  (`docker logs --timestamps`). In between: the SDK's log poll (0.1 s), its benchmark (warm-up + 1
  request, BENCHMARK_MAX_TOKENS=8) and the first /health check.
- upstream boot path, emulated offline: the same image and launch, but the worker's Python is a
  wrapper (WORKER_PYTHON) that, at every boot, makes a fresh venv (`python3 -m venv`, with pip) and
  `pip install`s `vastai==1.9.1` with its whole dependency set from a local wheelhouse (no network,
  no `git clone` of the worker: both favour upstream), plus what bakery's worker needs beyond the
  SDK's set (msgspec), then runs the same worker in it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import testinfra

from bakery.host.artifacts import pip_download
from bakery.host.downloads import requirement_lines
from bakery.host.wheelhouse import platform_tags
from bakery.paths import cache_path
from bakery.spec.engine_spec import EngineSpec
from tests.image.launch import Launched, controlplane_archive, is_ready_report, launch_options, serverless_env

BENCH_DIR = Path(__file__).resolve().parent
IN_CONTAINER = "/opt/bakery-bench"  # where bench/ is mounted (read-only) in load-test containers
LOAD_LINE = "Application startup complete."
READY_LINE = "marking model as loaded"  # the SDK's debug line once benchmark and /health passed
LISTEN_LINE = "HTTP servers started"  # the SDK's debug line right after its sites started
SDK_REQUIREMENT = "vastai==1.9.1"
UPSTREAM_REQUIREMENTS = "requirements.txt"  # in the upstream wheelhouse: what each boot installs
UPSTREAM_PYTHON = """#!/bin/sh
# bakery bench: upstream's boot path, offline. At every boot: a fresh venv, then the SDK with its whole
# dependency set from the mounted wheelhouse; then the worker runs in that venv.
set -e
venv=/tmp/upstream-venv
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-index \\
    --find-links {wheels} {requirement}
exec "$venv/bin/python" "$@"
"""


def _dist_name(text: str) -> str:
    """A distribution's normalised name, from a wheel's file name or a `name==version` line."""
    name = re.split(r"[=<>;\s]", text, maxsplit=1)[0] if "==" in text else text.split("-", 1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def worker_extras(wheels: Path, python_version: str) -> list[str]:
    """The worker's locked requirements that the SDK's own dependency set in `wheels` lacks (bakery's
    additions, e.g. msgspec), as `name==version`."""
    brought = {_dist_name(w.name) for w in wheels.glob("*.whl")}
    specs = [line.split(" --hash", 1)[0] for line in requirement_lines(python_version)]
    return [spec for spec in specs if _dist_name(spec) not in brought]


def upstream_wheelhouse(python_version: str = "3.11") -> Path:
    """The SDK's full dependency set, and what bakery's worker adds to it, as wheels for the image's
    Python (downloaded once, cached); `UPSTREAM_REQUIREMENTS` in it lists what a boot installs."""
    dest = cache_path("bench", f"upstream-wheels-{SDK_REQUIREMENT}-cp{python_version.replace('.', '')}")
    done = dest / ".complete"
    if not (done.exists() and (dest / UPSTREAM_REQUIREMENTS).exists()):  # the latter: caches of before
        if dest.exists():
            shutil.rmtree(dest)
        platforms = platform_tags("linux/amd64")
        pip_download([SDK_REQUIREMENT], dest, python_version=python_version, platforms=platforms)
        extras = worker_extras(dest, python_version)
        if extras:
            pip_download(extras, dest, python_version=python_version, platforms=platforms)
        (dest / UPSTREAM_REQUIREMENTS).write_text("\n".join([SDK_REQUIREMENT, *extras]) + "\n")
        done.write_text("ok\n")
    return dest


def upstream_boot(run_dir: Path, wheels: Path, env: dict[str, str], volumes: dict[str, dict[str, str]]) -> None:
    """Make a launch the upstream boot path: the worker's Python becomes UPSTREAM_PYTHON (a fresh venv
    and the SDK from the mounted wheelhouse at every boot); its script is written into `run_dir`."""
    script = run_dir / "upstream-python"
    requirements = (wheels / UPSTREAM_REQUIREMENTS).read_text().split()
    script.write_text(UPSTREAM_PYTHON.format(wheels=f"{IN_CONTAINER}/wheels", requirement=" ".join(requirements)))
    script.chmod(0o755)
    volumes[str(wheels)] = {"bind": f"{IN_CONTAINER}/wheels", "mode": "ro"}
    volumes[str(script)] = {"bind": f"{IN_CONTAINER}/upstream-python", "mode": "ro"}
    env["WORKER_PYTHON"] = f"{IN_CONTAINER}/upstream-python"


def _docker_time(stamp: str) -> float:
    """Epoch seconds of dockerd's RFC 3339 nano timestamp (microsecond precision kept)."""
    head, _, frac = stamp.rstrip("Z").partition(".")
    return dt.datetime.fromisoformat(head).replace(tzinfo=dt.timezone.utc).timestamp() + float("0." + (frac or "0"))


def _http_answers(port: int) -> bool:
    """True when something answers HTTP on 127.0.0.1:port (not merely accepts the connection)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            return sock.recv(5) == b"HTTP/"
    except OSError:
        return False


class LogFollower:
    """Follows a container's output in a thread, keeping (dockerd timestamp, line) pairs."""

    def __init__(self, container: Any) -> None:
        self.lines: list[tuple[float, str]] = []
        self._stream = container.logs(stream=True, follow=True, timestamps=True)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        buffer = b""
        try:
            for chunk in self._stream:
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                for raw in complete:
                    stamp, _, text = raw.decode("utf-8", "replace").partition(" ")
                    self.lines.append((_docker_time(stamp), text))
        except Exception:  # noqa: BLE001,S110 - the container went away: the lines so far stand
            pass

    def first(self, needle: str) -> float | None:
        """dockerd's timestamp of the first line containing `needle`, if seen yet."""
        return next((t for t, text in list(self.lines) if needle in text), None)

    def text(self) -> str:
        return "\n".join(text for _, text in self.lines)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._stream.close()


@dataclass
class BootRun:
    """One boot of a container: what was seen when (None: not seen within the timeout)."""

    variant: str
    start_to_listening: float | None = None
    start_to_ready: float | None = None
    load_to_ready: float | None = None
    listening_before_load: bool | None = None
    phases: dict[str, float] = field(default_factory=dict)  # seconds from the start call, per milestone
    notes: list[str] = field(default_factory=list)


@dataclass
class RoutableRun:
    """One boot as the platform launches it, timed to what the platform routes on (seconds from the
    start call; None: not seen within the timeout)."""

    variant: str
    start_to_key: float | None = None  # the control plane served the public key (the worker asked for it)
    start_to_routable: float | None = None  # the first /worker_status/ report with loadtime > 0, max_perf > 0
    notes: list[str] = field(default_factory=list)


# Milestones of a boot of ours, in order, as (name, a line of the container's output that marks it).
MILESTONES = (
    ("entry point's first line", "bakery: starting"),
    ("the entry point spawns the worker", "spawned: 'worker'"),
    ("the worker's first line", "Using worker backend"),
    ("SDK imported, config built", "bakery-worker: log="),
    ("SDK's HTTP servers started", LISTEN_LINE),
)


class Boots:
    """Starts and measures containers of one image; removes every container it made."""

    def __init__(self, client: docker.DockerClient, image_id: str, spec: EngineSpec) -> None:
        self.client = client
        self.image_id = image_id
        self.spec = spec
        self.tmp = Path(tempfile.mkdtemp(prefix="bakery-bench-boot-"))
        self._containers: list[Any] = []

    # ----------------------------------------------------------------------------- plumbing

    def _create(self, variant: str, env: dict[str, str], volumes: dict[str, dict[str, str]],
                ports: dict[str, Any] | None = None) -> Any:
        # The launch options the local base needs (the real vLLM's /dev/shm: Docker's 64 MiB kills its load).
        container = self.client.containers.create(
            self.image_id, environment=env, volumes=volumes, ports=ports or {}, detach=True,
            name=f"bakery-bench-{variant}-{os.getpid()}-{len(self._containers)}",
            labels={"ai.bakery.bench": "1"}, **launch_options(self.spec))
        self._containers.append(container)
        return container

    def remove(self, container: Any) -> None:
        with contextlib.suppress(docker.errors.DockerException):
            container.reload()
            if container.status == "paused":  # a paused container cannot be killed
                container.unpause()
        with contextlib.suppress(docker.errors.DockerException):
            container.remove(force=True)
        if container in self._containers:
            self._containers.remove(container)

    def close(self) -> None:
        for container in list(self._containers):
            self.remove(container)
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ----------------------------------------------------------------------------- one boot

    def boot(self, variant: str, *, wheels: Path | None = None, load_seconds: float = 4.0,
             timeout: float = 180.0) -> BootRun:
        """Boot one container (`ours`, or `upstream`: the worker installed at boot) and time
        start -> listening -> load line -> ready."""
        run_dir = Path(tempfile.mkdtemp(prefix=f"{variant}-", dir=self.tmp))
        log_dir = run_dir / "log"
        log_dir.mkdir()
        model_log = self.spec.bake.env["MODEL_LOG"]
        assert isinstance(model_log, str)
        env = serverless_env(self.spec, STANDIN_LOAD_SECONDS=f"{load_seconds:g}")
        volumes = {str(log_dir): {"bind": str(Path(model_log).parent), "mode": "rw"}}
        if variant == "upstream":
            assert wheels is not None
            upstream_boot(run_dir, wheels, env, volumes)
        container = self._create(variant, env, volumes, ports={"3000/tcp": ("127.0.0.1", None)})
        result = BootRun(variant)
        logs = None
        try:
            log_file = log_dir / Path(model_log).name
            t0 = time.time()
            container.start()
            container.reload()
            port = int(container.attrs["NetworkSettings"]["Ports"]["3000/tcp"][0]["HostPort"])
            logs = LogFollower(container)
            t_listen = t_load = t_ready = None
            deadline = time.monotonic() + timeout
            next_probe = next_check = 0.0
            while time.monotonic() < deadline and (t_listen is None or t_load is None or t_ready is None):
                now = time.monotonic()
                if t_listen is None and now >= next_probe:
                    if _http_answers(port):
                        t_listen = time.time()
                    next_probe = now + 0.005
                if t_load is None:
                    try:
                        if LOAD_LINE in log_file.read_text(errors="replace"):
                            t_load = time.time()
                    except OSError:
                        pass
                if t_ready is None:
                    t_ready = logs.first(READY_LINE)
                if now >= next_check:  # a container that died early ends the wait
                    container.reload()
                    if container.status == "exited":
                        break
                    next_check = now + 1.0
                time.sleep(0.002)
            started = container.attrs.get("State", {}).get("StartedAt", "")
            if started and not started.startswith("0001"):
                result.phases["container running (dockerd's StartedAt)"] = _docker_time(started) - t0
            for name, needle in MILESTONES:
                seen = logs.first(needle)
                if seen is not None:
                    result.phases[name] = seen - t0
            if t_listen is not None:
                result.phases["first HTTP answer on the published port"] = t_listen - t0
                result.start_to_listening = t_listen - t0
            if t_ready is not None:
                result.start_to_ready = t_ready - t0
                if t_load is not None:
                    result.load_to_ready = t_ready - t_load
            if t_listen is not None and t_load is not None:
                result.listening_before_load = t_listen < t_load
            if None in (t_listen, t_load, t_ready):
                result.notes.append(f"{variant}: not all seen in {timeout:.0f} s (listening={t_listen is not None}, "
                                    f"load line={t_load is not None}, ready={t_ready is not None}); "
                                    f"last output:\n{logs.text()[-1500:]}")
        finally:
            if logs is not None:
                logs.close()
            self.remove(container)
            shutil.rmtree(run_dir, ignore_errors=True)
        return result

    def routable(self, variant: str, *, key_pem: bytes, wheels: Path | None = None,
                 timeout: float = 300.0) -> RoutableRun:
        """Boot one container as the platform launches it (security on; the control-plane stand-in
        inside it, its key made beforehand, as a real control plane's is) and time container start ->
        the first status report that says loaded, as the stand-in recorded it (its own clock: the
        host's). `upstream`: the worker installed at boot, as in boot()."""
        env = serverless_env(self.spec)
        volumes: dict[str, dict[str, str]] = {}
        run_dir = Path(tempfile.mkdtemp(prefix=f"routable-{variant}-", dir=self.tmp))
        if variant == "upstream":
            assert wheels is not None
            upstream_boot(run_dir, wheels, env, volumes)
        container = self._create(f"routable-{variant}", env, volumes)
        container.put_archive("/tmp", controlplane_archive(key_pem))
        result = RoutableRun(variant)
        try:
            launched = Launched(container=container, host=testinfra.get_host(f"docker://{container.id}"))
            t0 = time.time()
            container.start()
            launched.start_controlplane()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                ready = [r for r in launched.records("/worker_status/") if is_ready_report(r.get("body"))]
                if ready:
                    result.start_to_routable = float(ready[0]["time"]) - t0
                    break
                if not launched.running():
                    break
                time.sleep(0.25)
            keys = [r for r in launched.records("/pubkey/") if r.get("status") == 200]
            if keys:
                result.start_to_key = float(keys[0]["time"]) - t0
            if result.start_to_routable is None:
                result.notes.append(f"routable {variant}: no loaded report within {timeout:.0f} s; last output:\n"
                                    f"{launched.logs()[-1500:]}")
        finally:
            self.remove(container)
            shutil.rmtree(run_dir, ignore_errors=True)
        return result

    # ----------------------------------------------------------------------------- proxy overhead

    def overhead_container(self) -> Any:
        """A serverless container with an engine that answers at once, ready, with bench/ mounted."""
        env = serverless_env(self.spec, STANDIN_LOAD_SECONDS="0", STANDIN_TOKEN_DELAY="0")  # noqa: S106
        volumes = {str(BENCH_DIR): {"bind": IN_CONTAINER, "mode": "ro"}}
        container = self._create("overhead", env, volumes)
        container.start()
        logs = LogFollower(container)
        try:
            deadline = time.monotonic() + 120
            while logs.first(READY_LINE) is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the worker did not get ready:\n{logs.text()[-3000:]}")
                time.sleep(0.05)
        finally:
            logs.close()
        return container

    def start_side_worker(self, container: Any, name: str, port: int) -> None:
        """Start a second worker in `container` on `port`, its output in /tmp/<name>.log; wait until ready.

        `bare`: bench/sdk_bare_worker.py (the SDK alone). `direct`: the shipped worker
        (start_server.sh -> workers/<backend>/worker.py) started by hand, output to a file.
        """
        env = {"WORKER_PORT": str(port), f"VAST_TCP_PORT_{port}": str(port), "WORKER_HTTP_PORT": str(port + 1),
               "WORKER_STATE_DIR": f"/tmp/state-{name}"}
        if name == "bare":
            cmd = (f"mkdir -p /tmp/state-bare && cd /tmp/state-bare && exec /opt/bakery/venv/bin/python "
                   f"{IN_CONTAINER}/sdk_bare_worker.py >/tmp/bare.log 2>&1")
        else:
            cmd = f"exec /bin/sh /opt/bakery/worker/start_server.sh >/tmp/{name}.log 2>&1"
        container.exec_run(["/bin/sh", "-c", cmd], environment=env, detach=True)
        wait = (f"for i in $(seq 1 600); do grep -q '{READY_LINE}' /tmp/{name}.log && exit 0; sleep 0.1; done; "
                f"tail -n 40 /tmp/{name}.log; exit 1")
        code, out = container.exec_run(["/bin/sh", "-c", wait])
        if code != 0:
            raise RuntimeError(f"the {name} worker on :{port} did not get ready:\n{out.decode(errors='replace')}")

    @staticmethod
    def load(container: Any, port: int, *, envelope: bool, concurrency: int, seconds: float,
             warmup: float = 0.5, close: bool = False) -> dict[str, Any]:
        """Run bench/loadgen.py inside the container against 127.0.0.1:port; its JSON result."""
        cmd = ["/opt/bakery/venv/bin/python", f"{IN_CONTAINER}/loadgen.py", "--port", str(port),
               "--concurrency", str(concurrency), "--seconds", f"{seconds:g}", "--warmup", f"{warmup:g}"]
        if envelope:
            cmd.append("--envelope")
        if close:
            cmd.append("--close")
        code, out = container.exec_run(cmd)
        text = out.decode(errors="replace").strip()
        if code != 0:
            raise RuntimeError(f"loadgen failed ({code}): {text[-2000:]}")
        result = json.loads(text.splitlines()[-1])
        if result["errors"]:
            raise RuntimeError(f"loadgen against :{port} saw {result['errors']} errors: {result['first_errors']}")
        return result
