"""The boot's driver check in a real container (issue 54, "A clear refusal at boot"): the llama.cpp image on its
local base (the real llama-server, loaded in seconds), launched with NVIDIA driver version files of several
versions supplied from outside.

How the driver and the floor get in:
- The driver file is a host file bind-mounted read-only into the container, and BAKERY_DRIVER_VERSION_FILE points
  at it. Mounting it at /proc/driver/nvidia/version itself does not work: runc refuses every mount inside /proc
  ("... cannot be mounted because it is inside /proc", docker run exits 125), so the variable is the only way in.
- The floor: the llama.cpp image has no CUDA line. BAKERY_CUDA_VERSION and BAKERY_CUDA_MIN_DRIVER given at
  `docker run` stand for the variables an image of a CUDA line bakes: they are taken from every CUDA line the
  specs carry (CudaVariant.baked_env, i.e. the floors of bakery/spec/cuda.py), not copied here. The entry point
  reads them through the same table either way.

Checked from outside the container: below the floor, without SERVERLESS, exit status 3, the one refusal line on
stderr naming the driver, the floor and the CUDA line, that line and the engine's exit line (a baked error line)
in MODEL_LOG, and no engine (no spawn, no pid file, nothing else in MODEL_LOG); at or above the floor, and with no
driver file at all, the engine starts and loads, and the line says what was found. With SERVERLESS=true below
the floor, the worker reports itself errored to the control-plane stand-in (inside the container, on loopback)
and never ready. Each floor is tried with versions whose string order differs from their numeric order.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bakery.paths import REPO_ROOT
from bakery.recipe.render import baked_env
from bakery.spec import engine_facts
from bakery.spec.cuda import CudaVariant
from bakery.spec.engine_spec import available_engines, load_engine
from tests.image.conftest import READY_TIMEOUT, Containers, ImageUnderTest, build_local_image
from tests.image.launch import RUN_DIR, Launched, is_ready_report, serverless_env
from tests.unit.test_driver_check import OPEN, PROPRIETARY, driver  # the banners, and the boot's own module

sys.path.insert(0, str(REPO_ROOT / "worker"))
from config import table  # the worker's table (stdlib only), by path as the image has it

ENGINE = "llama"  # the cheapest image that runs here: the real llama.cpp, loaded in ~1-2 s
# Every CUDA line the specs carry: its floor is what an image of that line bakes.
LINES = [line for name in available_engines() for line in load_engine(name).base.cuda_variants]
DRIVER_FILE = "/run/bakery-test/nvidia-version"  # where the host's file is bind-mounted (not under /proc)
DEFAULT_DRIVER_FILE = table.BY_NAME["BAKERY_DRIVER_VERSION_FILE"].default  # what the image reads unless told
REFUSED_STATUS = 3  # the entry point's exit status for a refused driver (issue 54)
EXIT_WAIT = 60.0  # a refused boot exits at once; the bound only matters when something is broken
# Under SERVERLESS the worker starts alone to report the refusal; the container stops this long after the
# engine's slot exited. 20 s outlasts the control-plane stand-in's start by `docker exec` on a busy machine
# (conftest.side_launch's load-failure launches use the same grace for the same reason).
SERVERLESS_GRACE = "20"


def versions(floor: int) -> tuple[list[str], list[str]]:
    """(driver versions below `floor`, versions at or above it), chosen so that comparing them as strings
    would get each wrong: 99.1 sorts after 580 as a string, 1000.1 before it."""
    digits = len(str(floor))
    below = [f"{floor - 1}.99.99", f"{10 ** (digits - 1) - 1}.1"]
    at_or_above = [f"{floor}.0", f"{floor}.65.06", f"{10 ** digits}.1"]
    assert max(below) > str(floor) > min(at_or_above), "the versions no longer sort against the floor as strings"
    return below, at_or_above


@pytest.fixture(scope="module")
def image(docker_client) -> ImageUnderTest:
    """The llama.cpp image on its local base (built here when missing: Docker's cache makes repeats cheap)."""
    spec = load_engine(ENGINE)
    return ImageUnderTest(engine=ENGINE, spec=spec, image_id=build_local_image(spec), expected_env=baked_env(spec))


def driver_mount(tmp_path: Path, banner: str | None) -> dict:
    """docker run options that bind-mount a driver version file holding `banner` at DRIVER_FILE (none for None)."""
    if banner is None:
        return {}
    tmp_path.mkdir(parents=True, exist_ok=True)
    source = tmp_path / "nvidia-version"
    source.write_text(banner, encoding="utf-8")
    source.chmod(0o644)
    return {"volumes": {str(source): {"bind": DRIVER_FILE, "mode": "ro"}}}


def boot(containers: Containers, image: ImageUnderTest, tmp_path: Path, line: CudaVariant, banner: str | None,
         label: str, *, serverless: bool) -> Launched:
    """Launch the image as one of `line` (its baked floor given at docker run) with `banner` as the host's driver
    file (None: no file, the image reads its default path); with SERVERLESS=true and the stand-in inside when
    `serverless`, else the engine alone."""
    env = serverless_env(image.spec, **line.baked_env())
    if banner is not None:
        env["BAKERY_DRIVER_VERSION_FILE"] = DRIVER_FILE
    if serverless:
        env["BAKERY_EXIT_GRACE"] = SERVERLESS_GRACE
    else:
        env.pop("SERVERLESS")
    return containers.launch(image, env, label, controlplane=serverless, run_options=driver_mount(tmp_path, banner))


def stream(launched: Launched, *, stderr: bool) -> list[str]:
    """The container's stderr (or stdout) lines."""
    return launched.container.logs(stdout=not stderr, stderr=stderr).decode("utf-8", "replace").splitlines()


def refusal_of(launched: Launched, version: str, line: CudaVariant) -> str:
    """The one refusal line on the container's stderr (none on stdout), checked to name the driver, the floor
    and the CUDA line, and to be the line the boot's own decision gives."""
    refusals = [entry for entry in stream(launched, stderr=True) if entry.startswith("bakery: refused:")]
    assert len(refusals) == 1, f"not one refusal line on stderr:\n{launched.logs()[-3000:]}"
    refusal = refusals[0]
    assert f"NVIDIA driver {version} " in refusal and str(line.min_driver) in refusal \
        and f"CUDA {line.cuda} " in refusal, refusal
    found = f"NVIDIA driver {version} ({DRIVER_FILE})"
    assert refusal == driver.decide(version, found, line.cuda, line.min_driver).line
    assert not any("refused" in entry for entry in stream(launched, stderr=False)), launched.logs()[-3000:]
    return refusal


def engine_program(image: ImageUnderTest) -> str:
    return engine_facts.facts(image.spec).program


def assert_engine_never_started(launched: Launched, image: ImageUnderTest, log: list[str], refusal: str) -> None:
    """MODEL_LOG holds only the refusal and the engine's exit line (a baked error line, what makes the worker
    report itself errored); nothing of llama-server, and the entry point never said it started it."""
    program = engine_program(image)
    errors = json.loads(image.expected_env["MODEL_ERROR_LOG_MSGS"])
    assert log[0] == refusal, log
    assert log[1:] and all(entry.startswith(f"INFO exited: {program} (exit status {REFUSED_STATUS};")
                           for entry in log[1:]), f"MODEL_LOG holds more than the refusal and the exit line: {log}"
    assert any(error in log[1] for error in errors), f"the exit line is none of the baked error lines {errors}"
    loaded = json.loads(image.expected_env["MODEL_LOAD_LOG_MSG"])
    assert not any(entry in launched.logs() for entry in loaded), launched.logs()[-3000:]


@pytest.mark.parametrize("line", LINES, ids=[f"cuda{line.cuda}" for line in LINES])
def test_below_the_floor_the_engine_is_refused(image: ImageUnderTest, containers: Containers, tmp_path: Path,
                                               line: CudaVariant) -> None:
    below, _ = versions(line.min_driver)
    for index, (version, banner) in enumerate(zip(below, [PROPRIETARY, OPEN], strict=True)):
        launched = boot(containers, image, tmp_path / str(index), line, banner.format(v=version), f"below{index}",
                        serverless=False)
        assert launched.wait_for(lambda launched=launched: not launched.running(), EXIT_WAIT), \
            f"driver {version}: the container kept running below the floor {line.min_driver}"
        assert launched.exit_code() == REFUSED_STATUS, f"driver {version}:\n{launched.logs()[-3000:]}"
        refusal = refusal_of(launched, version, line)
        log_text = launched.archived_text(image.expected_env["MODEL_LOG"])
        assert log_text is not None, "no MODEL_LOG written"
        assert_engine_never_started(launched, image, log_text.splitlines(), refusal)
        assert "bakery: spawned:" not in launched.logs() and "bakery: starting" not in launched.logs()
        assert launched.archived_text(f"{RUN_DIR}/{engine_program(image)}.pid") is None, "an engine pid was written"
        containers.remove(launched)


def wait_loaded(launched: Launched, image: ImageUnderTest) -> None:
    """Bounded wait for the engine's baked load line in MODEL_LOG: the engine started and loaded."""
    loaded = json.loads(image.expected_env["MODEL_LOAD_LOG_MSG"])
    log = image.expected_env["MODEL_LOG"]
    assert launched.wait_for(lambda: any(entry in launched.file_text(log) for entry in loaded), READY_TIMEOUT), \
        f"the engine did not load:\n{launched.logs()[-3000:]}\n{(launched.archived_text(log) or '')[-2000:]}"
    assert f"bakery: spawned: '{engine_program(image)}'" in launched.logs()
    assert not any("refused" in entry for entry in launched.logs().splitlines())


@pytest.mark.parametrize("line", LINES, ids=[f"cuda{line.cuda}" for line in LINES])
def test_at_or_above_the_floor_the_engine_starts(image: ImageUnderTest, containers: Containers, tmp_path: Path,
                                                 line: CudaVariant) -> None:
    _, at_or_above = versions(line.min_driver)
    for index, version in enumerate(at_or_above):
        banner = (OPEN if index % 2 else PROPRIETARY).format(v=version)
        launched = boot(containers, image, tmp_path / str(index), line, banner, f"at{index}", serverless=False)
        wait_loaded(launched, image)
        said = f"bakery: driver check: NVIDIA driver {version} ({DRIVER_FILE}) meets CUDA {line.cuda}'s minimum " \
               f"{line.min_driver}"
        assert said in stream(launched, stderr=False), f"driver {version}:\n{launched.logs()[-3000:]}"
        containers.remove(launched)


@pytest.mark.parametrize("line", LINES, ids=[f"cuda{line.cuda}" for line in LINES])
def test_no_driver_file_is_never_refused(image: ImageUnderTest, containers: Containers, tmp_path: Path,
                                         line: CudaVariant) -> None:
    # No GPU given to the container: the image reads its default path, which is absent, and starts the engine.
    launched = boot(containers, image, tmp_path, line, None, "nodriver", serverless=False)
    wait_loaded(launched, image)
    said = [entry for entry in stream(launched, stderr=False) if entry.startswith("bakery: driver check:")]
    assert len(said) == 1 and f"no {DEFAULT_DRIVER_FILE} " in said[0] and "not checked" in said[0] \
        and f"CUDA {line.cuda} needs a driver >= {line.min_driver}" in said[0], launched.logs()[-3000:]


def test_serverless_below_the_floor_reports_errored(image: ImageUnderTest, containers: Containers,
                                                    tmp_path: Path) -> None:
    line = next(line for line in LINES if line.default)  # the line a template gets by default
    version = versions(line.min_driver)[0][0]
    launched = boot(containers, image, tmp_path, line, PROPRIETARY.format(v=version), "serverless-below",
                    serverless=True)
    errors = json.loads(image.expected_env["MODEL_ERROR_LOG_MSGS"])

    def errored() -> bool:
        return any(err in str(r.get("error_msg") or "") for r in launched.reports() for err in errors)

    # The platform's view: a status whose error_msg carries a baked error line (the engine's exit line).
    assert launched.wait_for(errored, READY_TIMEOUT, 0.5), \
        f"no errored report: {[r.get('error_msg') for r in launched.reports()]}\n{launched.logs()[-3000:]}"
    assert not any(is_ready_report(r) for r in launched.reports()), "a refused worker reported ready"
    refusal = refusal_of(launched, version, line)
    assert launched.wait_for(lambda: not launched.running(), float(SERVERLESS_GRACE) + EXIT_WAIT), \
        "the container kept running after the refusal"
    assert launched.exit_code() != 0, launched.logs()[-3000:]
    log_text = launched.archived_text(image.expected_env["MODEL_LOG"]) or ""
    assert_engine_never_started(launched, image, log_text.splitlines(), refusal)
