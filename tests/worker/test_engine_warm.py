"""Idle engine connections renewed between bursts (worker/engine/engine_warm.py,
BAKERY_ENGINE_KEEP_WARM): a burst after a quiet spell finds them open; the pool never grows; renewal
ends with its window and at the first refusal. tests/worker/engine_warm_probe.py runs forward.Pool
against a loopback engine that drops idle connections, on scaled-down times, and reports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app import worker_config
from config import table
from engine import engine_warm
from tests.worker.helpers import baked_facts, probe_facts
from workers.vllm.worker import DEFAULTS

HERE = Path(__file__).resolve().parent
ENV = {"CONTAINER_ID": "5", "REPORT_ADDR": "http://127.0.0.1:9", "WORKER_PORT": "3000", "PUBLIC_IPADDR": "203.0.113.7",
       "VAST_TCP_PORT_3000": "41234", **baked_facts("vllm")}


@pytest.fixture(scope="module")
def report(worker_python: Path) -> dict[str, Any]:
    return probe_facts(worker_python, str(HERE / "engine_warm_probe.py"))


def test_a_burst_after_a_quiet_spell_finds_its_connections_open(report: dict[str, Any]) -> None:
    warm = report["warm"]
    assert warm["bodies"] == ["{}"] * 12
    quiet = warm["quiet"]
    # After twice the pool's keep-alive without a request, all six are young (renewed) and the second
    # burst opens none; without renewal it opens six (the "off" case below).
    assert quiet["young"] == 6 and quiet["second_burst_opened"] == 0, quiet
    assert quiet["accepted"] >= 6 and quiet["most_open"] == 6, quiet  # renewed one for one, never more
    assert warm["renewed"] >= 6


def test_without_renewal_the_connections_age_out(report: dict[str, Any]) -> None:
    off = report["off"]
    assert off["bodies"] == ["{}"] * 12
    assert off["quiet"] == {"young": 0, "accepted": 0, "most_open": 6, "second_burst_opened": 6}


def test_renewal_ends_with_its_window(report: dict[str, Any]) -> None:
    assert report["warm"]["after_window"] == {"young": 0, "opened_meanwhile": 0}


def test_a_refused_renewal_stops_renewing_until_the_next_request(report: dict[str, Any]) -> None:
    gone = report["engine_gone"]
    assert gone["failed"] is True and gone["timer"] is False and gone["opening"] == 0, gone
    assert gone["body"] == "{}" and gone["failed_after_request"] is False, gone


@pytest.mark.parametrize(("given", "seconds", "warned"), [
    (None, 60.0, False), ("0", 0.0, False), (" 15 ", 15.0, False), ("-1", 60.0, True), ("soon", 60.0, True),
    ("7200", 60.0, True),
])
def test_the_setting(given: str | None, seconds: float, warned: bool) -> None:
    warnings: list[str] = []
    env = {} if given is None else {"BAKERY_ENGINE_KEEP_WARM": given}
    assert table.read(env, "BAKERY_ENGINE_KEEP_WARM", warnings=warnings) == seconds
    assert [w.split("=")[0] for w in warnings] == (["BAKERY_ENGINE_KEEP_WARM"] if warned else [])
    assert table.BY_NAME["BAKERY_ENGINE_KEEP_WARM"].default == engine_warm.DEFAULT


def test_the_worker_settings_carry_it() -> None:
    assert worker_config.load_settings(DEFAULTS, {**ENV, "BAKERY_ENGINE_KEEP_WARM": "15"}).engine_keep_warm == 15.0
    assert worker_config.load_settings(DEFAULTS, ENV).engine_keep_warm == engine_warm.DEFAULT


def test_the_startup_line_says_it(report: dict[str, Any]) -> None:
    assert report["describe"] == [
        "idle engine connections: renewed for 60 s after the last request; 256 opened when the model is "
        "loaded (BAKERY_ENGINE_READY_CONNECTIONS)",
        "idle engine connections: not renewed (BAKERY_ENGINE_KEEP_WARM=0); none opened before the first "
        "request (BAKERY_ENGINE_READY_CONNECTIONS=0)"]


def test_connections_opened_before_the_first_request_serve_its_burst(report: dict[str, Any]) -> None:
    ready = report["ready"]
    assert ready["opened"] == 6 and ready["accepted"] == 6 and ready["young"] == 6, ready
    # Renewed like any idle connection (the window counts from the opening), so a burst after the
    # pool's keep-alive still finds all six, and opens none; the pool never held more than six.
    assert ready["young_later"] == 6 and ready["burst_opened"] == 0 and ready["most_open"] == 6, ready
    assert ready["bodies"] == ["{}"] * 6


def test_nothing_is_renewed_while_requests_come(report: dict[str, Any]) -> None:
    busy = report["busy"]
    assert busy["busy_gap"] < 0.2, f"no busy phase kept its requests under QUIET apart: {busy}"
    assert busy["renewed_while_busy"] == 0 and busy["renewed_after"] >= 5, busy


def test_nothing_is_renewed_once_the_worker_drains(report: dict[str, Any]) -> None:
    assert report["busy"]["renewed_while_draining"] == 0, report["busy"]


def test_opening_stops_at_an_engine_that_refuses(report: dict[str, Any]) -> None:
    assert report["ready"]["refused"] == 0


@pytest.mark.parametrize(("given", "count", "warned"), [
    (None, 256, False), ("0", 0, False), (" 64 ", 64, False), ("-1", 256, True), ("many", 256, True),
    ("4097", 256, True), ("1e3", 256, True),
])
def test_the_ready_connections_setting(given: str | None, count: int, warned: bool) -> None:
    env = {**ENV} if given is None else {**ENV, "BAKERY_ENGINE_READY_CONNECTIONS": given}
    settings = worker_config.load_settings(DEFAULTS, env)
    assert settings.engine_ready_connections == count
    said = [w.split("=")[0] for w in settings.warnings if "BAKERY_ENGINE_READY_CONNECTIONS" in w]
    assert said == (["BAKERY_ENGINE_READY_CONNECTIONS"] if warned else [])


def test_each_engine_has_its_own_ready_connections() -> None:
    """vLLM and SGLang open 256 (uvicorn holds an idle connection cheaply); llama.cpp none (its
    server gives each open connection one of its HTTP threads)."""
    from workers.llama.worker import DEFAULTS as LLAMA
    from workers.sglang.worker import DEFAULTS as SGLANG

    assert (DEFAULTS.ready_connections, SGLANG.ready_connections, LLAMA.ready_connections) == (256, 256, 0)
    assert worker_config.load_settings(LLAMA, ENV).engine_ready_connections == 0
    assert table.BY_NAME["BAKERY_ENGINE_READY_CONNECTIONS"].default is None  # the engine's own
