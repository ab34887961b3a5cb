"""The gate's time-to-ready split (tests/image/stages.py) on boundaries given by hand: what the gate's
stage check and build.py's report rely on. The stage lines themselves: tests/worker/test_stages.py."""

from __future__ import annotations

import pytest

from bakery.build.verify import describe_split
from tests.image import stages

FULL = {"run": 100.0, "started": 100.5, "engine_spawned": 100.6, "load_begins": 101.0, "weights_loaded": 103.0,
        "engine_ready": 104.0, "benchmark_begins": 104.3, "benchmark_done": 106.0, "ready_report": 106.1,
        "first_sent": 120.0, "first_answer": 120.4}


def test_every_stage_in_order_and_the_gates_wait_left_out() -> None:
    split = stages.split(FULL, "llama-serverless")
    assert [stage["to"] for stage in split["stages"]] == [name for name, _ in stages.BOUNDARIES][1:]
    assert [stage["seconds"] for stage in split["stages"]] == [0.5, 0.1, 0.4, 2.0, 1.0, 0.3, 1.7, 0.1, 0.4]
    # 13.9 s from the ready report to the gate's request is the gate's pace, not the image's.
    assert split["idle"] == pytest.approx(13.9) and split["total"] == pytest.approx(6.5)
    assert split["sum"] == pytest.approx(split["total"]) and split["missing"] == []
    # The boot before the engine, the worker's wait to act on the load line, the report.
    assert split["bakery_seconds"] == pytest.approx(0.1 + 0.3 + 0.1)


def test_a_stage_not_seen_is_named_and_folded_into_the_next() -> None:
    found = {key: value for key, value in FULL.items() if key not in ("load_begins", "weights_loaded")}
    split = stages.split(found, "zeta-serverless")
    assert split["missing"] == ["load_begins", "weights_loaded"]
    assert split["stages"][2] == {"from": "engine_spawned", "to": "engine_ready",
                                  "stage": "engine process started -> engine ready (load line)", "seconds": 3.4}
    assert "not seen: load_begins, weights_loaded" in describe_split(split)


def test_a_load_line_the_worker_read_first_is_the_engines_ready_time() -> None:
    # The entry point polls every 20 ms, the SDK's tail every 100 ms: either may read the line first.
    split = stages.split({**FULL, "weights_loaded": 104.34, "engine_ready": 104.35}, "llama-serverless")
    seconds = {stage["to"]: stage["seconds"] for stage in split["stages"]}
    assert seconds["benchmark_begins"] == 0.0 and seconds["engine_ready"] == 0.0, split
    assert seconds["weights_loaded"] == pytest.approx(3.3) and split["bakery_seconds"] == pytest.approx(0.2)
    assert split["sum"] == pytest.approx(split["total"])


def test_a_launch_never_asked_ends_at_its_ready_report() -> None:
    found = {key: value for key, value in FULL.items() if key not in ("first_sent", "first_answer")}
    split = stages.split(found, "llama-route")
    assert split["to"] == "ready_report" and split["idle"] == 0 and split["total"] == pytest.approx(6.1)


@pytest.mark.parametrize(("text", "seconds"), [
    ("2026-12-02T13:50:01.123456789Z", 1796219401.123456),
    ("2026-12-02T13:50:01Z", 1796219401.0),
    ("2026-12-02T13:50:01.5Z", 1796219401.5),
])
def test_docker_times(text: str, seconds: float) -> None:
    assert stages.docker_time(text) == pytest.approx(seconds)
