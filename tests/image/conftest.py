"""Fixtures of the verification gate: which image, and the containers launched from it.

Two modes. Gate mode (build.py): `--bakery-image ID --bakery-engine NAME` verifies that exact image.
Suite mode (plain pytest): every engine's image is built on its local base first, then verified.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors
import pytest

from bakery.build.verify import GATE_BASE_VAR
from bakery.model.manifest import PATH_LABEL
from bakery.recipe.render import baked_env
from bakery.spec import engine_facts
from bakery.spec.cuda import VERSION_LABEL
from bakery.spec.engine_spec import EngineSpec, available_engines, load_engine
from tests.image import stages
from tests.image.launch import (
    BAKED_MODEL_VAR,
    HEALTH_COMMAND,
    WORKER_PYTHON,
    Launched,
    baked_model,
    gate_model,
    is_ready_report,
    launch,
    launch_options,
    offline_env,
    on_local_base,
    remove_leftovers,
    serverless_env,
)

# How long a worker may take from container start to ready. The stand-ins and SmolLM2 are ready in
# seconds; the bound only matters when something is broken (then every check reports, none hangs),
# or when the machine is oversubscribed: beside one CPU-bound process, llama.cpp's two threads made
# SmolLM2's one-request benchmark take 73 s and the worker ready after 153 s (a fresh-machine run).
READY_TIMEOUT = float(os.environ.get("BAKERY_GATE_READY_TIMEOUT", "300"))
# The suite's test tag; set BAKERY_SUITE_TAG per checkout when two checkouts run the suite on one
# engine at once, so neither replaces (and removes) the other's image.
SUITE_TAG = os.environ.get("BAKERY_SUITE_TAG", "suite")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("bakery gate")
    group.addoption("--bakery-image", help="verify this image id (build.py's gate mode)")
    group.addoption("--bakery-engine", help="the engine of --bakery-image")


def pytest_configure(config: pytest.Config) -> None:
    """Gate mode: when the image under test bakes a model (its ai.bakery.model.path label), every launch
    leaves the model variable unset (launch.BAKED_MODEL_VAR), so the checks run the baked default."""
    given = config.getoption("--bakery-image", default=None)
    if not given:
        return
    try:
        labels = docker.from_env().images.get(given).attrs["Config"].get("Labels") or {}
    except docker.errors.DockerException:
        return  # the checks' docker_client fixture names the missing engine or image
    if labels.get(PATH_LABEL):
        os.environ[BAKED_MODEL_VAR] = labels[PATH_LABEL]


# Printed at the end of a run that had to remove containers its checks left behind (a fixture that
# failed to remove its own); tests/image/test_planted.py fails a gate run that prints it.
LEFTOVER_NOTE = "bakery gate: removed containers a check left behind:"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove every container this run started that is still there, and say so: the backstop that
    leaves nothing behind on any path (a check interrupted, a fixture that raised)."""
    try:
        removed = remove_leftovers(docker.from_env())
    except docker.errors.DockerException:
        return
    if removed:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        line = f"{LEFTOVER_NOTE} {', '.join(sorted(removed))}"
        reporter.write_line(line) if reporter else print(line)


NO_MODEL_REASON = ("not run: this check needs the model the base serves; name it with build.py --base-model MODEL "
                   "(the value of the engine's model variable on that base)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a team's own base whose model is not named, the checks that need the engine to serve are
    reported as not run (skipped with the reason), never as errors."""
    if os.environ.get(GATE_BASE_VAR) != "custom":
        return
    given = config.getoption("--bakery-engine")
    if given and gate_model(load_engine(given)) is None:
        for item in items:
            if item.get_closest_marker("serve"):
                item.add_marker(pytest.mark.skip(reason=NO_MODEL_REASON))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "engine" in metafunc.fixturenames:
        given = metafunc.config.getoption("--bakery-engine")
        metafunc.parametrize("engine", [given] if given else available_engines(), scope="session")


@pytest.fixture(scope="session")
def docker_client() -> docker.DockerClient:
    """The Docker engine; its absence fails under CI=true and skips elsewhere."""
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Docker is required under CI=true and is not reachable: {exc}")
        pytest.skip(f"Docker is not reachable: {exc}")
    return client


@dataclass(frozen=True)
class ImageUnderTest:
    """The image the gate verifies and what its spec says it must carry."""

    engine: str
    spec: EngineSpec
    image_id: str
    expected_env: dict[str, str]


_BUILT: dict[str, str] = {}


def build_local_image(spec: EngineSpec) -> str:
    """Suite mode: build the engine's image on its local base (Docker's layer cache makes repeats cheap)."""
    if spec.name not in _BUILT:
        from bakery.bases import make as bases
        from bakery.build.builder import build_image
        from bakery.recipe.render import RenderOptions, render

        bases.ensure_base("debian")
        base = bases.ensure_base(spec.base.local)
        image_id = build_image(render(spec, RenderOptions(base_image=base)), lambda _m: None).image_id
        _replace_suite_tag(f"bakery-test/{spec.name}:{SUITE_TAG}", image_id)
        _BUILT[spec.name] = image_id
    return _BUILT[spec.name]


def _replace_suite_tag(ref: str, image_id: str) -> None:
    """Tag the suite's build (a test tag, never a release tag) and drop the previous run's image, so
    repeated runs on one machine do not pile up untagged images. Shared cached layers stay."""
    client = docker.from_env()
    try:
        previous = client.images.get(ref).id
    except docker.errors.ImageNotFound:
        previous = None
    repo, _, tag = ref.rpartition(":")
    client.images.get(image_id).tag(repo, tag)
    if previous and previous != image_id:
        with contextlib.suppress(docker.errors.APIError):
            client.images.remove(previous)


@pytest.fixture(scope="session")
def image(engine: str, request: pytest.FixtureRequest, docker_client: docker.DockerClient) -> ImageUnderTest:
    """The image under test: the given id in gate mode, a fresh local build in suite mode."""
    spec = load_engine(engine)
    image_id = request.config.getoption("--bakery-image") or build_local_image(spec)
    # The image of a CUDA line bakes that line's floor: expect the line its label names (none: the default).
    labels = docker_client.images.get(image_id).attrs["Config"].get("Labels") or {}
    expected = baked_env(spec, cuda=labels.get(VERSION_LABEL))
    if baked_model():  # the model variable's baked default (the model checks hold it to the manifest)
        expected[spec.engine.model_var] = baked_model() or ""
    return ImageUnderTest(engine=engine, spec=spec, image_id=image_id, expected_env=expected)


@pytest.fixture(scope="session")
def image_attrs(image: ImageUnderTest, docker_client: docker.DockerClient) -> dict:
    """`docker inspect` of the image, read from the host (not from inside a container)."""
    return docker_client.images.get(image.image_id).attrs


# The gate containers of this process that still run, oldest first, and those of them that may be
# removed early to make room (side launches: started again if a later check asks for one). A heavy
# local base (base.local_launches: the real vLLM, ~4 GB and two busy cores each) bounds how many run at
# once; the others start as many as their checks want.
_LIVE: list[Launched] = []
_SPARE: dict[int, Callable[[], None]] = {}


def _make_room(limit: int) -> None:
    """Remove spare side launches, oldest first, until fewer than `limit` gate containers run (as far
    as spares allow: the shared serverless launch and a check's own container always stay)."""
    while len(_LIVE) >= limit:
        spare = next((item for item in _LIVE if id(item) in _SPARE), None)
        if spare is None:
            return
        _SPARE.pop(id(spare))()


def _forget(launched: Launched) -> None:
    _SPARE.pop(id(launched), None)
    with contextlib.suppress(ValueError):
        _LIVE.remove(launched)


def _keep_stages(launched: Launched) -> None:
    """Keep a launch's time to ready by stage ($BAKERY_GATE_STAGES, read by build.py) when it reported
    ready; never fails a teardown (the split is a report, test_time_to_ready_by_stage its check)."""
    if not os.environ.get(stages.STAGES_FILE_VAR) or not launched.controlplane or not launched._ready:
        return
    try:
        result = stages.split(stages.boundaries(launched, launched.program, is_ready_report), launched.container.name)
    except Exception as exc:  # noqa: BLE001 - a container gone early, logs unreadable: no split, no failure
        print(f"time to ready of {launched.container.name}: not read ({type(exc).__name__}: {exc})")
        return
    stages.keep(result)


class Containers:
    """Every container the gate starts, removed at the end of the session."""

    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client
        self.started: list[Launched] = []

    def launch(self, image: ImageUnderTest, env: dict[str, str], label: str, *, controlplane: bool = True,
               withhold_fetches: int | None = None, hold: bool = False,
               run_options: dict[str, Any] | None = None) -> Launched:
        """Launch `image` (with the control-plane stand-in inside unless `controlplane` is False), with
        the docker run options its base needs (and `run_options`, e.g. a bind mount), within its base's
        bound on containers at once."""
        limit = engine_facts.facts(image.spec).max_launches
        if limit and on_local_base():
            _make_room(limit)
        launched = launch(self.client, image.image_id, env, f"{image.engine}-{label}", controlplane=controlplane,
                          withhold_fetches=withhold_fetches, hold=hold,
                          run_options={**launch_options(image.spec), **(run_options or {})})
        launched.program = engine_facts.facts(image.spec).program
        self.started.append(launched)
        _LIVE.append(launched)
        return launched

    def remove(self, launched: Launched) -> None:
        """Remove one container this registry started (its time to ready kept first, when it got ready)."""
        _keep_stages(launched)
        _forget(launched)
        with contextlib.suppress(ValueError):
            self.started.remove(launched)
        with contextlib.suppress(docker.errors.DockerException):
            launched.container.remove(force=True)

    def remove_all(self) -> None:
        for launched in list(self.started):
            self.remove(launched)


@pytest.fixture
def containers(docker_client: docker.DockerClient):
    """Containers of one check, removed when it ends (idle engines would slow every later check)."""
    registry = Containers(docker_client)
    yield registry
    registry.remove_all()


@pytest.fixture(scope="session")
def serverless(image: ImageUnderTest, docker_client: docker.DockerClient, side: SideLaunches):
    """A serverless launch as the platform makes it (security on, the control-plane stand-in inside),
    with nothing baked passed in, shared by one engine's checks and removed before the next engine's.
    Checks that need the worker ready wait for its ready report (once, remembered);
    resolution checks on a GPU-engine base never wait for a readiness that can't come. The side
    launches of the selected checks start right after it, so their waits overlap the shared checks."""
    registry = Containers(docker_client)
    launched = registry.launch(image, serverless_env(image.spec), "serverless")
    side.start_all()
    yield launched
    registry.remove_all()


# Launches that mostly wait (an engine that fails and the grace after it, a key withheld past the
# SDK's retries, an offline worker getting ready) start together when the first check needing one
# runs, so their waits overlap instead of adding up. Only the launches of selected checks start.
SIDE_USERS = {
    "loadfail": {"test_engine_load_failure_reported"},
    "latekey": {"test_requests_get_503_until_ready", "test_key_served_late_is_picked_up"},
    "unsecured": {"test_unsecured_offline_serves_unsigned"},
    "route": {"test_local_route_served_signed"},
    "drain": {"test_docker_stop_drains_on_the_signed_path"},
}


SDK_PUBKEY_TRIES = 5  # vastai 1.9.1 MAX_PUBKEY_FETCH_ATTEMPTS
# The key stays held until the probe was sent, so waiting longer costs only the late-key check's own
# time: a fresh CI run whose machine was building the real vLLM base saw the first report after 30 s.
EARLY_PROBE_TIMEOUT = 120.0


def probe_before_ready(launched: Launched) -> dict[str, Any]:
    """One signed request as soon as the worker has reported (so it is reachable and its URL is
    known), long before it can be ready: its key is withheld. The hold is lifted on every path: a
    probe that could not be sent must not leave the key withheld for good (the late-key check would
    then see 503 forever, as a loaded fresh CI run did)."""
    try:
        if not launched.wait_for(lambda: bool(launched.reports()), EARLY_PROBE_TIMEOUT, 0.3):
            return {"status": None, "error": f"no /worker_status/ report within {EARLY_PROBE_TIMEOUT:.0f} s"}
        if not launched.wait_for(lambda: launched.host.socket("tcp://0.0.0.0:3000").is_listening, 30, 0.3):
            return {"status": None, "error": "nothing listens on :3000"}
        result = launched.probe([{"name": "before ready", "request_idx": 801}])["before ready"]
        result["key_fetches_before"] = [r.get("status") for r in launched.records("/pubkey/")]
        health = launched.host.run(f"{WORKER_PYTHON} {HEALTH_COMMAND}")  # the image's HEALTHCHECK, by hand
        result["health_before"] = {"rc": health.rc, "output": (health.stdout + health.stderr).strip()}
        return result
    finally:
        if launched.running():
            launched.lift_hold()  # the key held back until now, however late a busy machine got here


LOADFAIL = "loadfail"


def loadfail_names(spec: EngineSpec) -> list[str]:
    """The side launches of the load-failure check: one per way base.local_fail_load names."""
    return [f"{LOADFAIL}-{index}" for index in range(1, len(engine_facts.facts(spec).fail_load_envs) + 1)]


def side_launch(spec: EngineSpec, name: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The environment and launch options of one side launch."""
    if name.startswith(f"{LOADFAIL}-"):
        # A model that cannot load (the spec's base.local_fail_load: the stand-ins' switch, a missing
        # or corrupt model for a real engine). The errored status is sent as soon as the SDK marks the
        # worker errored (report_soon), but the control-plane stand-in starts by `docker exec` after
        # the container does: on a busy machine a real engine failed and 5 s of grace ran out before
        # the stand-in listened (a fresh run beside a CPU-bound process), so no report could land.
        # 20 s outlasts that start; the platform's control plane, unlike ours, is up before the boot.
        fail_env = engine_facts.facts(spec).fail_load_envs[int(name.removeprefix(f"{LOADFAIL}-")) - 1]
        return serverless_env(spec, **fail_env, BAKERY_EXIT_GRACE="20"), {}
    if name == "latekey":
        # The SDK fetches the key 5 times (~15 s), then never again: the stand-in withholds it from
        # exactly those, so only a worker that keeps asking ever gets it.
        # Backoff capped at 4 s (test sizing): the 6th fetch comes ~15 s after the first, not ~31 s.
        # Held back also until the probe before ready was sent (probe_before_ready lifts the hold), so
        # on a busy machine the probe never comes after the key.
        return serverless_env(spec, BAKERY_PUBKEY_BACKOFF_MAX="4"), {"withhold_fetches": SDK_PUBKEY_TRIES,
                                                                     "hold": True}
    if name == "unsecured":
        return offline_env(spec), {"controlplane": False}
    if name == "route":
        # Only the spec's non-default route (base.local_route), served and benchmarked, with the
        # launch variables it needs: readiness then proves the engine serves it.
        return serverless_env(spec, **engine_facts.facts(spec).route_env()), {}
    if name == "drain":
        # The launch variables that make the spec's long answer long (base.local_long_answer).
        long_answer = engine_facts.facts(spec).long_answer
        return serverless_env(spec, **(long_answer.env if long_answer else {})), {}
    raise KeyError(name)


class SideLaunches:
    """The side launches of one engine, all started at the first request for any of them; on a base
    that bounds its containers at once (base.local_launches), each only when a check asks for it."""

    def __init__(self, registry: Containers, image: ImageUnderTest, wanted: set[str]) -> None:
        self.registry, self.image, self.wanted = registry, image, wanted
        self.started: dict[str, Launched] = {}
        self.early_probe: dict[str, Any] = {}  # the latekey launch's request before ready
        self.bounded = bool(engine_facts.facts(image.spec).max_launches) and on_local_base()

    def start_all(self, also: str | None = None) -> None:
        """Start every wanted side launch (and `also`) not started yet (only `also` on a bounded base)."""
        names = set() if self.bounded else set(self.wanted)
        if also:
            names.add(also)
        for name in sorted(names):
            if name not in self.started:
                env, options = side_launch(self.image.spec, name)
                launched = self.registry.launch(self.image, env, name, **options)
                self.started[name] = launched
                _SPARE[id(launched)] = lambda name=name: self.drop(name)
        if "latekey" in self.started and not self.early_probe:
            self.early_probe = probe_before_ready(self.started["latekey"])

    def drop(self, name: str) -> None:
        """Remove the side launch `name` (to make room); a later get(name) starts it again."""
        launched = self.started.pop(name)
        self.registry.remove(launched)
        if name == "latekey":
            self.early_probe = {}

    def get(self, name: str) -> Launched:
        """The side launch `name` (started now with every other wanted one, if not yet)."""
        self.start_all(also=name)
        return self.started[name]


@pytest.fixture(scope="session")
def side(image: ImageUnderTest, docker_client: docker.DockerClient, request: pytest.FixtureRequest):
    """This engine's side launches (see SIDE_USERS), removed before the next engine's."""
    selected = {getattr(item, "originalname", item.name) for item in request.session.items
                if not item.get_closest_marker("skip")}
    wanted = {name for name, users in SIDE_USERS.items() if users & selected}
    engine = engine_facts.facts(image.spec)
    if engine.local_route is None:
        wanted.discard("route")  # nothing to launch: its check skips
    if LOADFAIL in wanted:  # one launch per way of failing; none on a team's own base that names none
        wanted.discard(LOADFAIL)
        wanted.update(loadfail_names(image.spec))
    if engine.long_answer is None:
        wanted.discard("drain")
    registry = Containers(docker_client)
    yield SideLaunches(registry, image, wanted)
    registry.remove_all()
