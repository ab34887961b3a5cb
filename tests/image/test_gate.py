"""The verification gate: what every engine image must show before it gets a release tag.

Each test is one named check; build.py reports the names of the ones that fail.
"""

from __future__ import annotations

import json
import re

import pytest

from bakery.spec import engine_facts
from bakery.spec.secrets import secret_reason
from tests.image.conftest import READY_TIMEOUT, Containers, ImageUnderTest, SideLaunches, loadfail_names
from tests.image.launch import (
    BENCHMARK_FILE,
    HEALTH_COMMAND,
    HEALTH_WAIT,
    WORKER_PYTHON,
    Launched,
    is_ready_report,
    serverless_env,
)

REQUIRED_LABELS = (
    "org.opencontainers.image.title", "org.opencontainers.image.source", "org.opencontainers.image.revision",
    "org.opencontainers.image.version", "org.opencontainers.image.created", "org.opencontainers.image.base.name",
    "ai.bakery.backend",
)


def config_env(attrs: dict) -> dict[str, str]:
    """Config.Env as a mapping (split on the first '=')."""
    return dict(item.split("=", 1) for item in attrs["Config"]["Env"] or [])


# ---- image configuration (docker inspect from the host) ---------------------------------------


@pytest.mark.config
def test_baked_env_is_exact(image: ImageUnderTest, image_attrs: dict) -> None:
    env = config_env(image_attrs)
    missing = [name for name in image.expected_env if name not in env]
    assert not missing, f"not baked: {missing}"
    wrong = {name: (env[name], want) for name, want in image.expected_env.items() if env[name] != want}
    assert not wrong, f"baked values differ (got, want): {wrong}"


@pytest.mark.config
def test_worker_port_exposed(image_attrs: dict) -> None:
    assert "3000/tcp" in (image_attrs["Config"].get("ExposedPorts") or {}), "EXPOSE 3000 is missing"


@pytest.mark.config
def test_labels_present(image: ImageUnderTest, image_attrs: dict) -> None:
    labels = image_attrs["Config"].get("Labels") or {}
    missing = [name for name in REQUIRED_LABELS if not labels.get(name)]
    assert not missing, f"labels missing or empty: {missing}"
    assert labels["ai.bakery.backend"] == image.expected_env["BACKEND"]


@pytest.mark.config
def test_no_secret_in_env_or_history(image: ImageUnderTest, image_attrs: dict, docker_client) -> None:
    secret_env = [name for name in config_env(image_attrs) if secret_reason(name)]
    assert not secret_env, f"credential-like variables baked into the image: {secret_env}"
    history = docker_client.images.get(image.image_id).history()
    assignments = {m.group(1) for step in history for m in re.finditer(r"\b([A-Za-z_][A-Za-z0-9_]*)=\S",
                                                                           step.get("CreatedBy") or "")}
    leaked = sorted(name for name in assignments if secret_reason(name))
    assert not leaked, f"credential-like assignments in docker history: {leaked}"


# ---- the baked BACKEND resolves to a running worker --------------------------------------------


@pytest.mark.resolution
def test_backend_resolves_to_worker(image: ImageUnderTest, serverless: Launched) -> None:
    backend = image.expected_env["BACKEND"]
    adapter = f"/opt/bakery/worker/workers/{backend}/worker.py"
    generic = "/opt/bakery/worker/workers/openai/generic.py"  # an engine without its own adapter
    assert serverless.host.file(adapter).exists or (
        backend == image.expected_env["BAKERY_ENGINE_PROGRAM"] and serverless.host.file(generic).exists), \
        f"neither {adapter} nor, for the image's own program, {generic} is in the image"
    banner = f"Using worker backend: {image.spec.name}"
    assert serverless.wait_for(lambda: banner in serverless.logs(), 30), \
        f"no '{banner}' in the container's output:\n{serverless.logs()[-2000:]}"


@pytest.mark.resolution
def test_worker_listens_on_3000(serverless: Launched) -> None:
    ok = serverless.wait_for(lambda: serverless.host.socket("tcp://0.0.0.0:3000").is_listening, 30)
    assert ok, f"nothing listens on 0.0.0.0:3000:\n{serverless.logs()[-2000:]}"


# ---- the engine serves through the worker (local bases) ----------------------------------------


@pytest.mark.serve
def test_engine_listens_on_18000(serverless: Launched) -> None:
    ok = serverless.wait_for(lambda: serverless.host.socket("tcp://127.0.0.1:18000").is_listening, READY_TIMEOUT)
    assert ok, "the engine does not listen on 127.0.0.1:18000"


@pytest.mark.serve
def test_load_line_in_model_log(image: ImageUnderTest, serverless: Launched) -> None:
    log = image.expected_env["MODEL_LOG"]
    lines = json.loads(image.expected_env["MODEL_LOAD_LOG_MSG"])
    ok = serverless.wait_for(lambda: any(line in serverless.file_text(log) for line in lines), READY_TIMEOUT)
    assert ok, f"no load line {lines} in {log}:\n{serverless.file_text(log)[-2000:]}"


@pytest.mark.serve
def test_worker_reports_ready(serverless: Launched) -> None:
    # Ready is what the platform routes on: a /worker_status/ report with loadtime > 0 and
    # max_perf > 0 (docs/sdk.md "The signed path"), not a file inside the container.
    assert serverless.ready(READY_TIMEOUT), \
        f"no ready report (loadtime > 0, max_perf > 0, no error) reached the control plane:\n" \
        f"{serverless.reports()[-3:]}\n{serverless.logs()[-3000:]}"
    report = next(r for r in serverless.reports() if is_ready_report(r))
    benchmark = serverless.file_text(BENCHMARK_FILE).strip()
    assert benchmark, f"ready reported but no benchmark result in {BENCHMARK_FILE}"
    assert float(report["max_perf"]) == pytest.approx(float(benchmark)), \
        f"max_perf {report['max_perf']} is not the benchmark's result {benchmark}"


@pytest.mark.config
def test_healthcheck_runs_the_health_command(image_attrs: dict) -> None:
    test = (image_attrs["Config"].get("Healthcheck") or {}).get("Test") or []
    assert test[:1] == ["CMD"] and HEALTH_COMMAND in test, f"the image's HEALTHCHECK is not bakery's: {test}"


@pytest.mark.serve
def test_docker_health_follows_the_worker(serverless: Launched) -> None:
    # Outside serverless tooling, Docker's own health is what people watch: under SERVERLESS=true it
    # is the worker's readiness (docs/image.md, "Health check"). Before ready it is refused: see
    # test_requests_get_503_until_ready, which runs the same command on a worker whose key is withheld.
    assert serverless.ready(READY_TIMEOUT), f"not ready:\n{serverless.logs()[-2000:]}"
    assert serverless.wait_for(lambda: serverless.health()[0] == "healthy", HEALTH_WAIT, 1), \
        f"Docker's health of a ready worker: {serverless.health()}"
    assert "the worker is ready" in serverless.health()[1], serverless.health()


@pytest.mark.serve
def test_launch_template_override_wins(image: ImageUnderTest, containers: Containers) -> None:
    override = "/tmp/override/engine.log"
    launched = containers.launch(image, serverless_env(image.spec, MODEL_LOG=override), "override")
    assert launched.ready(READY_TIMEOUT), \
        f"not ready with MODEL_LOG overridden:\n{launched.logs()[-2000:]}"
    lines = json.loads(image.expected_env["MODEL_LOAD_LOG_MSG"])
    assert any(line in launched.file_text(override) for line in lines), "the engine did not log to the override"
    assert not launched.host.file(image.expected_env["MODEL_LOG"]).exists, "the baked MODEL_LOG was still used"


@pytest.mark.resolution
def test_empty_backend_fails_loudly(image: ImageUnderTest, containers: Containers) -> None:
    launched = containers.launch(image, serverless_env(image.spec, BACKEND=""), "nobackend", controlplane=False)
    assert launched.wait_for(lambda: not launched.running(), 60), "the container kept running with BACKEND=''"
    assert launched.exit_code() != 0
    # The message names the variable and the valid backends, the image's own among them.
    own = image.expected_env["BACKEND"]
    assert "BACKEND" in launched.logs() and re.search(rf"one of .*\b{re.escape(own)}\b", launched.logs()), \
        f"no loud message naming BACKEND and the valid backends (with {own}):\n{launched.logs()[-2000:]}"


@pytest.mark.serve
def test_engine_load_failure_reported(image: ImageUnderTest, side: SideLaunches) -> None:
    # A model that cannot load (conftest.side_launch: the spec's base.local_fail_load).
    if not engine_facts.facts(image.spec).fail_load_env:  # a team's own base: nothing says how to fail it
        pytest.skip(f"not run: images/{image.engine}.yaml sets no base.local_fail_load (how loading fails there)")
    errors = json.loads(image.expected_env["MODEL_ERROR_LOG_MSGS"])
    for name, fail_env in zip(loadfail_names(image.spec), engine_facts.facts(image.spec).fail_load_envs, strict=True):
        launched = side.get(name)

        def reported(launched: Launched = launched) -> bool:
            return any(err in str(r.get("error_msg") or "") for r in launched.reports() for err in errors)

        # What the platform sees: a status whose error_msg carries one of the baked error lines (not the
        # public-key failure, nor a ready report). A real engine may take its whole load to fail (vLLM
        # on a corrupt file: ~75 s here), so the bound is the one a load gets.
        assert launched.wait_for(reported, READY_TIMEOUT, 0.5), \
            f"{fail_env}: no report with an error_msg from {errors} reached the control plane: " \
            f"{[r.get('error_msg') for r in launched.reports()]}\n{launched.logs()[-3000:]}"
        assert not any(is_ready_report(r) for r in launched.reports()), \
            f"{fail_env}: a worker whose engine failed reported ready"
        assert launched.wait_for(lambda launched=launched: not launched.running(), 60), \
            f"{fail_env}: the container kept running after the engine died"
        assert launched.exit_code() != 0, f"{fail_env}: the container exited 0 after the engine failed"


@pytest.mark.resolution
def test_second_entry_point_is_refused(serverless: Launched) -> None:
    # One engine and one worker per container: a second boot (e.g. a template's onstart running the
    # entry point again, upstream's double-worker incident) must refuse rather than bind :3000 twice.
    result = serverless.host.run(f"{WORKER_PYTHON} /opt/bakery/worker/boot/entrypoint.py")
    assert result.rc == 2, result.stdout + result.stderr
    assert "already running" in result.stderr


@pytest.mark.serve
def test_engine_runs_alone_without_serverless(image: ImageUnderTest, containers: Containers) -> None:
    env = serverless_env(image.spec)
    env.pop("SERVERLESS")
    launched = containers.launch(image, env, "ondemand", controlplane=False)
    # READY_TIMEOUT: vLLM binds its port only once its model is loaded (~60 s here, more when busy).
    assert launched.wait_for(lambda: launched.host.socket("tcp://127.0.0.1:18000").is_listening, READY_TIMEOUT), \
        f"the engine did not start without SERVERLESS:\n{launched.logs()[-2000:]}"
    assert not launched.host.socket("tcp://0.0.0.0:3000").is_listening, "a worker started without SERVERLESS=true"
    assert "Using worker backend" not in launched.logs()
    # Docker's health follows the engine's own health endpoint when no worker runs.
    assert launched.wait_for(lambda: launched.health()[0] == "healthy", HEALTH_WAIT, 1), \
        f"Docker's health of the engine alone: {launched.health()}"
    assert "the engine answers 200" in launched.health()[1], launched.health()


@pytest.mark.serve
def test_sigterm_stops_both_and_reboot_rotates_model_log(image: ImageUnderTest, containers: Containers) -> None:
    launched = containers.launch(image, serverless_env(image.spec), "reboot")
    assert launched.ready(READY_TIMEOUT), f"not ready:\n{launched.logs()[-2000:]}"
    launched.container.stop(timeout=30)  # SIGTERM, then SIGKILL after 30 s
    launched.container.reload()
    state = launched.container.attrs["State"]
    assert state["ExitCode"] == 0, f"SIGTERM did not end the container cleanly: {state}"
    logs = launched.logs()
    assert "stopped: worker" in logs and f"stopped: {image.spec.name}" in logs, logs[-2000:]
    # Second boot: the first boot's load line must not be in the log the worker reads.
    launched.container.start()
    launched.start_controlplane()  # exec'd processes do not survive a restart
    launched._ready = None
    log = image.expected_env["MODEL_LOG"]
    load_lines = json.loads(image.expected_env["MODEL_LOAD_LOG_MSG"])
    assert launched.wait_for(lambda: any(line in launched.file_text(log) for line in load_lines), READY_TIMEOUT)
    previous = launched.file_text(log + ".1")
    assert any(line in previous for line in load_lines), "the previous boot's log was not kept as MODEL_LOG.1"
    current = launched.file_text(log)
    assert sum(current.count(line) for line in load_lines) == 1, "the log the worker reads holds an old load line"
