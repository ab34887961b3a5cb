"""Start containers the way a launch template does, and wait on them without fixed sleeps."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import docker
import docker.errors
import testinfra

from bakery.spec import EngineSpec

# What the platform sets at a real serverless launch (REFERENCE.md §1), offline-safe values.
# UNSECURED and USE_SSL are the offline switches: without UNSECURED every request gets 401 because
# the autoscaler's public key never loads here.
PLATFORM_ENV = {
    "CONTAINER_ID": "1",
    "REPORT_ADDR": "http://127.0.0.1:9",
    "PUBLIC_IPADDR": "127.0.0.1",
    "WORKER_PORT": "3000",
    "VAST_TCP_PORT_3000": "3000",
    "UNSECURED": "true",
    "USE_SSL": "false",
}
# Test sizing, not configuration: a one-request benchmark so a CPU model is ready in seconds.
BENCHMARK_ENV = {"BENCHMARK_RUNS": "1", "BENCHMARK_CONCURRENCY": "1", "BENCHMARK_MAX_TOKENS": "8"}
# When the engine dies the container stops after this grace; on a production base without a GPU the
# engine dies at once, and the resolution checks need the worker up meanwhile.
GRACE_ENV = {"BAKERY_EXIT_GRACE": "60"}
# The model each local base serves (the real SmolLM2 file in the llama.cpp base; any id for stand-ins).
LOCAL_MODELS = {"llama": "/models/SmolLM2-135M-Instruct.Q4_1.gguf"}
STANDIN_MODEL = "standin/tiny-chat"
BENCHMARK_FILE = "/var/lib/bakery/worker/.has_benchmark"
WORKER_PYTHON = "/opt/bakery/venv/bin/python"
CLIENT = "/opt/bakery/worker/workers/openai/client.py"


def serverless_env(spec: EngineSpec, **overrides: str) -> dict[str, str]:
    """A serverless launch: SERVERLESS, the model variable and the platform's variables, nothing baked."""
    env = {"SERVERLESS": "true", spec.engine.model_var: LOCAL_MODELS.get(spec.name, STANDIN_MODEL),
           **PLATFORM_ENV, **BENCHMARK_ENV, **GRACE_ENV}
    env.update(overrides)
    return env


@dataclass
class Launched:
    """A running container and a testinfra host on it."""

    container: docker.models.containers.Container
    host: testinfra.host.Host
    started: float = field(default_factory=time.monotonic)
    _ready: bool | None = None

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
        """Whether the worker became ready (benchmark written); waited for once, then remembered,
        so checks sharing a container that never gets ready do not each wait the full timeout."""
        if self._ready is None:
            self._ready = self.wait_for(lambda: self.host.file(BENCHMARK_FILE).exists, timeout)
        return self._ready

    def file_text(self, path: str) -> str:
        """A file's content inside the container ('' when absent)."""
        f = self.host.file(path)
        return f.content_string if f.exists else ""


def launch(client: docker.DockerClient, image_id: str, env: dict[str, str], label: str) -> Launched:
    """Start `image_id` detached with `env`; the caller removes it (see conftest's registry)."""
    container = client.containers.run(
        image_id, detach=True, environment=env, name=f"bakery-gate-{label}-{uuid.uuid4().hex[:8]}",
        labels={"ai.bakery.test": "1"},
    )
    return Launched(container=container, host=testinfra.get_host(f"docker://{container.id}"))
