"""Start containers the way the platform launches them, and wait on them without fixed sleeps.

A serverless launch runs with the worker's security on (no UNSECURED) against the project's
control-plane stand-in (tests/controlplane), started INSIDE the container under test on
127.0.0.1:18200 right after the container starts: REPORT_ADDR points there, so the worker fetches a
real public key, its status and request reports are recorded, and signed requests reach :3000 from
inside the container. No traffic leaves the container. The stand-in runs on the worker venv's
Python, so it needs nothing from the engine (production bases included).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tarfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import docker
import docker.errors
import testinfra

from bakery.build.verify import GATE_BAKED_MODEL_VAR, GATE_BASE_VAR, GATE_MODEL_VAR
from bakery.spec.engine_facts import facts
from bakery.spec.engine_spec import EngineSpec
from tests.controlplane.launching import (  # noqa: F401 - re-exported: the gate's checks import them from here
    BENCHMARK_ENV,
    CONTROLPLANE_ADDR,
    CONTROLPLANE_PORT,
    CONTROLPLANE_RECORDS,
    CONTROLPLANE_ROOT,
    CONTROLPLANE_SOURCE,
    CONTROLPLANE_STATE,
    PLATFORM_ENV,
    WORKER_PYTHON,
    controlplane_archive,
    is_ready_report,
    parse_records,
)

# Nobody answers here: the offline (UNSECURED=true) launch of the README.
OFFLINE_ADDR = "http://127.0.0.1:9"
# When the engine dies the container stops after this grace; on a production base without a GPU the
# engine dies at once, and the resolution checks need the worker up meanwhile.
GRACE_ENV = {"BAKERY_EXIT_GRACE": "60"}
# The send bound the gate checks on every image (test_gate_platform.py), shorter than its 30 s default
# so that the check takes seconds: a client that reads nothing must lose its slot within it.
SEND_TIMEOUT = 5
BOUNDS_ENV = {"BAKERY_SEND_TIMEOUT": str(SEND_TIMEOUT)}
BENCHMARK_FILE = "/var/lib/bakery/worker/.has_benchmark"
HEALTH_COMMAND = "/opt/bakery/worker/boot/health.py"  # the image's HEALTHCHECK runs it with WORKER_PYTHON
HEALTH_WAIT = 90.0  # Docker runs it every 10 s; a loaded machine delays a run (and so its verdict)
CLIENT = "/opt/bakery/worker/workers/openai/client.py"
RUN_DIR = "/run/bakery"  # the entry point writes <program>.pid here (worker/boot/supervise.py)
# Every container the gate starts carries TEST_LABEL and RUN_LABEL=<this process's run id>, so a run
# removes exactly its own leftovers (conftest's session end) and a test can see that none remain.
# $BAKERY_TEST_RUN names the run (a test that runs the gate sets it); else each process makes its own,
# and a process's id is never inherited by the gate it starts (each sweeps only what it started).
TEST_LABEL = "ai.bakery.test"
RUN_LABEL = "ai.bakery.test.run"
RUN_ID_VAR = "BAKERY_TEST_RUN"
RUN_ID = os.environ.get(RUN_ID_VAR) or uuid.uuid4().hex[:12]


def on_local_base() -> bool:
    """Whether the image under test is built on its spec's local base (suite mode, or build.py --local),
    so the spec's base.local_* launch facts (variables, /dev/shm) apply."""
    return os.environ.get(GATE_BASE_VAR, "local") == "local"


def launch_options(spec: EngineSpec) -> dict[str, Any]:
    """docker run options every launch of this image needs: the local base's /dev/shm (base.local_shm_size)."""
    shm = facts(spec).shm_size if on_local_base() else None
    return {"shm_size": shm} if shm else {}


# The model an image under test bakes (its ai.bakery.model.path label, build.py --model), set by the gate's
# conftest from the image's labels: its launches then leave the model variable unset, so what runs is the
# image's own default, as a launch template that sets none would run it.
BAKED_MODEL_VAR = GATE_BAKED_MODEL_VAR


def baked_model() -> str | None:
    """The path of the model the image under test bakes, or None for a plain image."""
    return os.environ.get(BAKED_MODEL_VAR) or None


def gate_model(spec: EngineSpec) -> str | None:
    """The model the image under test serves: the one it bakes (build.py --model), if any; on a team's own
    base (build.py --base-image) the one --base-model names, if any; on the bases bakery knows,
    images/<engine>.yaml base.local_model."""
    if baked_model():
        return baked_model()
    if os.environ.get(GATE_BASE_VAR) == "custom":
        return os.environ.get(GATE_MODEL_VAR) or None
    return facts(spec).local_model


# The model variable's value on a team's own base whose model is not named: the entry point refuses to
# boot without one (a launch template must set it), and the checks that run there (configuration,
# resolution) need the worker up, not the engine serving, as on a production base without its GPU.
UNNAMED_MODEL = "bakery-gate/model-not-named"


def serverless_env(spec: EngineSpec, **overrides: str) -> dict[str, str]:
    """A serverless launch: SERVERLESS, the model variable (unless the image bakes its model) and the
    platform's variables, nothing baked."""
    engine = facts(spec)
    model = None if baked_model() else (gate_model(spec) or UNNAMED_MODEL)
    env = {"SERVERLESS": "true", **engine.launch_env(model), **PLATFORM_ENV,
           **BENCHMARK_ENV, **GRACE_ENV, **BOUNDS_ENV, **(engine.local_env if on_local_base() else {})}
    env.update(overrides)
    return env


def offline_env(spec: EngineSpec, **overrides: str) -> dict[str, str]:
    """The offline launch the README documents: UNSECURED=true and a REPORT_ADDR nobody answers."""
    return serverless_env(spec, UNSECURED="true", REPORT_ADDR=OFFLINE_ADDR, **overrides)


@dataclass
class Launched:
    """A running container and a testinfra host on it."""

    container: docker.models.containers.Container
    host: testinfra.host.Host
    controlplane: bool = True
    started: float = field(default_factory=time.monotonic)
    _ready: bool | None = None
    run_at: float = 0.0  # wall clock just before `docker run` (create): where time to ready starts
    first_answer: dict[str, Any] | None = None  # the first signed request answered 200 (a probe's result)
    program: str = ""  # the engine's program name (its `spawned:` line starts the engine's stage)

    def logs(self) -> str:
        """The container's stdout and stderr so far."""
        return self.container.logs().decode("utf-8", "replace")

    def running(self) -> bool:
        """True while the container has not exited."""
        self.container.reload()
        return self.container.status == "running"

    def exit_code(self) -> int | None:
        """The exit code once exited, else None."""
        self.container.reload()
        if self.container.status == "running":
            return None
        return int(self.container.attrs["State"]["ExitCode"])

    def health(self) -> tuple[str, str]:
        """Docker's health of the container (the image's HEALTHCHECK): its status ('starting',
        'healthy', 'unhealthy'; '' when the image has none) and the output of its latest run."""
        self.container.reload()
        health = self.container.attrs["State"].get("Health") or {}
        log = health.get("Log") or [{}]
        return str(health.get("Status") or ""), str(log[-1].get("Output") or "").strip()

    def wait_for(self, predicate: Callable[[], bool], timeout: float, interval: float = 0.25) -> bool:
        """Poll `predicate` until true, the container exits, or `timeout` seconds pass."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if predicate():
                    return True
            except Exception:  # noqa: BLE001, S110 - the container may be mid-start or gone
                pass
            if not self.running():
                try:
                    return bool(predicate())
                except Exception:  # noqa: BLE001
                    return False
            time.sleep(interval)
        return False

    def ready(self, timeout: float) -> bool:
        """Whether the worker became ready as the platform sees it: a /worker_status/ report with
        loadtime > 0 and max_perf > 0 reached the control plane (offline launches, which have no
        control plane, fall back to the benchmark file). Waited for once, then remembered, so checks
        sharing a container that never gets ready do not each wait the full timeout."""
        if self._ready is None:
            if self.controlplane:
                self._ready = self.wait_for(lambda: any(is_ready_report(r) for r in self.reports()), timeout, 0.5)
            else:
                self._ready = self.wait_for(lambda: self.host.file(BENCHMARK_FILE).exists, timeout)
        return self._ready

    # ---- the control-plane stand-in inside the container --------------------------------------

    def start_controlplane(self, withhold_fetches: int | None = None, hold: bool = False) -> None:
        """Start the stand-in (again after a container restart) and wait until it listens; with
        `withhold_fetches`, /pubkey/ answers 503 to that many fetches before serving the key (with
        `hold`, also until lift_hold(), however long the worker took to get that far)."""
        address = f"{CONTROLPLANE_STATE}/address"
        self.container.exec_run(["/bin/sh", "-c", f"rm -f {address}"])
        serve = [WORKER_PYTHON, "-m", "controlplane", "--state", CONTROLPLANE_STATE, "serve",
                 "--port", str(CONTROLPLANE_PORT)]
        if withhold_fetches:
            serve += ["--withhold-for", str(withhold_fetches), *(["--hold"] if hold else [])]
        command = " ".join(serve) + f" >>{CONTROLPLANE_ROOT}/serve.log 2>&1"
        self.container.exec_run(["/bin/sh", "-c", command], detach=True,
                                environment={"PYTHONPATH": CONTROLPLANE_ROOT}, workdir="/")
        if not self.wait_for(lambda: self.host.file(address).exists, 60, 0.2) and self.running():
            raise RuntimeError("the control-plane stand-in did not start:\n"
                               + self.file_text(f"{CONTROLPLANE_ROOT}/serve.log")[-2000:])

    def controlplane_cli(self, *args: str) -> str:
        """Run `python -m controlplane ARGS` inside the container; its stdout (fails on exit != 0).
        Bounded by the probe's own per-request timeouts."""
        command = [WORKER_PYTHON, "-m", "controlplane", "--state", CONTROLPLANE_STATE, *args]
        result = self.container.exec_run(command, environment={"PYTHONPATH": CONTROLPLANE_ROOT}, demux=True)
        out, err = (part.decode("utf-8", "replace") if part else "" for part in result.output)
        if result.exit_code != 0:
            raise RuntimeError(f"controlplane {args[0]} exited {result.exit_code}: {err.strip()[-2000:]}")
        return out

    def lift_hold(self) -> None:
        """Let the control plane serve the key (after the fetches it counts), ending a hold."""
        self.controlplane_cli("lift-hold")

    def probe(self, cases: list[dict[str, Any]], timeout: float = 120) -> dict[str, dict[str, Any]]:
        """Send probe cases (tests/controlplane/probe.py) to :3000 from inside; results by case name."""
        out = self.controlplane_cli("probe", json.dumps(cases), "--timeout", str(timeout))
        results = json.loads(out)
        for result in results:
            if result.get("signed") and result.get("status") == 200 and result.get("answered_at") and (
                    self.first_answer is None or result["answered_at"] < self.first_answer["answered_at"]):
                self.first_answer = result
        return {result["name"]: result for result in results}

    def archived_text(self, path: str) -> str | None:
        """A file's content inside the container, None when absent, read with the Docker API so it
        works after the container exited too (file_text needs it running)."""
        try:
            chunks, _ = self.container.get_archive(path)
        except docker.errors.NotFound:
            return None
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            member = tar.next()
            handle = tar.extractfile(member) if member else None
            return handle.read().decode("utf-8", "replace") if handle else ""

    def records(self, path: str | None = None) -> list[dict[str, Any]]:
        """Every request the stand-in recorded (optionally one path), read with the Docker API so it
        works after the container exited too."""
        entries = parse_records(self.archived_text(CONTROLPLANE_RECORDS) or "")
        return [e for e in entries if path is None or e.get("path") == path]

    def reports(self) -> list[dict[str, Any]]:
        """The bodies of the worker's /worker_status/ reports, oldest first."""
        return [e["body"] for e in self.records("/worker_status/") if isinstance(e.get("body"), dict)]

    def deleted_requests(self) -> list[dict[str, Any]]:
        """Every request outcome the worker sent to /delete_requests/, oldest first."""
        return [item for e in self.records("/delete_requests/") if isinstance(e.get("body"), dict)
                for item in e["body"].get("requests") or [] if isinstance(item, dict)]

    def engine_pid(self, program: str) -> int:
        """The engine's process id, from the pid file the entry point writes for its program `program`."""
        text = self.file_text(f"{RUN_DIR}/{program}.pid").strip()
        if not text.isdigit() or int(text) <= 0:
            raise RuntimeError(f"the entry point wrote no pid for {program}: {text!r}")
        return int(text)

    def signal_pid(self, pid: int, signal_name: str) -> None:
        """Send SIG`signal_name` (STOP, CONT) to a process of the container: a check freezes the engine
        to hold an answer in flight without racing it."""
        result = self.container.exec_run(["/bin/sh", "-c", f"kill -{signal_name} {pid}"])
        if result.exit_code != 0:
            raise RuntimeError(f"could not send SIG{signal_name} to {pid}: {result.output.decode(errors='replace')}")

    def file_text(self, path: str) -> str:
        """A file's content inside the container ('' when absent)."""
        f = self.host.file(path)
        return f.content_string if f.exists else ""


def launch(client: docker.DockerClient, image_id: str, env: dict[str, str], label: str, *,
           controlplane: bool = True, withhold_fetches: int | None = None, hold: bool = False,
           run_options: dict[str, Any] | None = None) -> Launched:
    """Start `image_id` detached with `env` (and docker run `run_options`, e.g. shm_size), with the
    control-plane stand-in inside it (unless `controlplane` is False; `withhold_fetches` N: /pubkey/
    answers 503 to the first N fetches); the caller removes the container (see conftest's registry)."""
    run_at = time.time()
    container = client.containers.create(
        image_id, detach=True, environment=env, name=f"bakery-gate-{label}-{uuid.uuid4().hex[:8]}",
        labels={TEST_LABEL: "1", RUN_LABEL: RUN_ID}, **(run_options or {}),
    )
    try:
        if controlplane:
            container.put_archive("/tmp", controlplane_archive())
        container.start()
        launched = Launched(container=container, host=testinfra.get_host(f"docker://{container.id}"),
                            controlplane=controlplane, run_at=run_at)
        if controlplane:
            launched.start_controlplane(withhold_fetches=withhold_fetches, hold=hold)
    except BaseException:
        # Nobody holds this container yet (an image whose entry point exits at once fails here):
        # remove it now rather than leave it behind.
        with contextlib.suppress(docker.errors.DockerException):
            container.remove(force=True)
        raise
    return launched


def leftover_containers(client: docker.DockerClient, run_id: str = RUN_ID) -> list[str]:
    """The names of the containers run `run_id` started that still exist (running or exited)."""
    return [c.name for c in client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_id}"})]


def remove_leftovers(client: docker.DockerClient, run_id: str = RUN_ID) -> list[str]:
    """Remove every container run `run_id` started that still exists; their names."""
    names = []
    for container in client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_id}"}):
        with contextlib.suppress(docker.errors.DockerException):
            container.remove(force=True)
            names.append(container.name)
    return names
