"""The stage lines (logs/stages.py): on lines given by hand, the entry point's watch of a
log written in steps, and the worker's own stages with the real SDK in front of the vLLM stand-in."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from logs import stages as worker_stages
from tests.image import stages
from tests.worker.helpers import Harness

MODEL = "standin-model"


def test_each_stage_is_said_once_in_the_order_reached() -> None:
    said: list[str] = []
    clock = iter([10.0, 11.0, 12.0, 13.0, 14.0, 15.0])
    timeline = worker_stages.Stages({"load_begins": ("Starting to load model",),
                                     "weights_loaded": ("Loading weights took", "Model loading took"),
                                     "engine_ready": ("Application startup complete.",),
                                     "benchmark_begins": ("Application startup complete.",)},
                                    said.append, clock=lambda: next(clock), prefix=worker_stages.BOOT_PREFIX)
    for line in ["INFO Starting to load model /models/x...", "INFO Starting to load model again",
                 "INFO Model loading took 0.26 GiB", "INFO Loading weights took 0.1 seconds"]:
        timeline.seen(line)
    assert not timeline.lines_done()
    timeline.seen("INFO Application startup complete.")
    assert timeline.lines_done()
    timeline.mark("benchmark_done")
    timeline.mark("ready_report_sent")
    timeline.mark("benchmark_done")
    assert [line.split(":")[1].split()[1] for line in said] == list(worker_stages.STAGES)
    assert said[0] == "bakery: stage load_begins at 10.000: INFO Starting to load model /models/x..."
    parsed = [stages.STAGE_LINE.search(line) for line in said]
    assert [(m.group(1), float(m.group(2))) for m in parsed if m] == list(
        zip(worker_stages.STAGES, [10.0, 11.0, 12.0, 13.0, 14.0, 15.0], strict=True))


def test_an_engines_line_is_shown_escaped_and_cut() -> None:
    said: list[str] = []
    timeline = worker_stages.Stages({"engine_ready": ("ready",)}, said.append, clock=lambda: 1.0)
    timeline.seen("ready \x1b[31m" + "x" * 500)
    assert "\x1b" not in said[0] and "\\x1b" in said[0] and len(said[0]) < 300, said


def _watching(path: Path) -> tuple[list[tuple[float, str]], threading.Event, threading.Thread]:
    """The entry point's watch on `path`, saying (time said, line) into the returned list."""
    said: list[tuple[float, str]] = []
    timeline = worker_stages.Stages({"load_begins": ("load begins",), "weights_loaded": ("weights in",),
                                     "engine_ready": ("model loaded",)},
                                    lambda line: said.append((time.time(), line)), prefix=worker_stages.BOOT_PREFIX)
    stop = threading.Event()
    thread = threading.Thread(target=worker_stages.watch, args=(path, timeline, stop), daemon=True)
    thread.start()
    return said, stop, thread


def test_the_entry_points_watch_stamps_each_line_when_the_log_shows_it(tmp_path: Path) -> None:
    # Each line is written only after the one before it was stamped: a watch that stamped lines late
    # (or at its end) never gets there. No sleep bounds a stamp, so a busy machine cannot fail it.
    log = tmp_path / "engine.log"
    log.write_bytes(b"")
    said, stop, thread = _watching(log)
    written: dict[str, float] = {}

    def stamped(count: int) -> bool:
        deadline = time.monotonic() + 10
        while len(said) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return len(said) >= count

    with open(log, "ab", buffering=0) as out:
        written["load_begins"] = time.time()
        out.write(b"engine: load begins\n")
        assert stamped(1), "a whole line is stamped while the log is still growing"
        out.write(b"engine: weights")  # half a line: matched only once it is whole
        time.sleep(0.3)
        assert len(said) == 1, said
        written["weights_loaded"] = time.time()
        out.write(b" in\nnoise\n" + b"x" * 70000 + b"\n")  # a line longer than one read
        assert stamped(2), said
        written["engine_ready"] = time.time()
        out.write(b"engine: model loaded\n")
    thread.join(10)
    stop.set()
    assert not thread.is_alive(), "the watch ends once every stage is reached"
    stamps = {}
    for _, line in said:
        match = stages.STAGE_LINE.search(line)
        assert match, line
        stamps[match.group(1)] = float(match.group(2))
    assert list(stamps) == list(worker_stages.ENGINE_STAGES), said
    for stage, stamp in stamps.items():
        # stamped once the line was whole (a stage line gives milliseconds, rounded)
        assert written[stage] - 0.0005 <= stamp, (stage, stamp, written)
    assert stamps["load_begins"] < written["weights_loaded"] < stamps["weights_loaded"] + 0.0005
    assert stamps["weights_loaded"] < written["engine_ready"], (stamps, written)


def test_the_entry_points_watch_stops_when_told_or_when_the_log_is_replaced(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"engine: load begins\n")
    said, stop, thread = _watching(log)
    time.sleep(0.2)
    replaced = tmp_path / "new.log"
    replaced.write_bytes(b"")
    replaced.replace(log)  # a new inode: the boot's log is gone
    thread.join(5)
    assert not thread.is_alive(), "a replaced log ends the watch"
    assert len(said) == 1 and "load_begins" in said[0][1], said
    log.write_bytes(b"")
    said, stop, thread = _watching(log)
    stop.set()
    thread.join(5)
    assert not thread.is_alive(), "the stop event ends the watch"
    assert said == []


def test_a_worker_says_its_own_stages(harness: Harness) -> None:
    # On the host (no entry point): the worker says when its SDK read the load line, when the
    # benchmark was done and when the ready report went; the engine's load stages are the entry point's.
    engine = harness.standin("vllm", load_seconds=1)
    served = harness.serve("vllm", engine, MODEL_NAME=MODEL)
    text = served.worker.wait_for("stage ready_report_sent", timeout=30)
    seen = [(m.group(1), float(m.group(2))) for m in stages.STAGE_LINE.finditer(text)]
    assert [name for name, _ in seen] == list(worker_stages.WORKER_STAGES), text[-3000:]
    times = [at for _, at in seen]
    assert times == sorted(times), seen


def test_a_bad_stage_variable_is_the_workers_warning() -> None:
    warnings: list[str] = []
    # The entry point reads the stage lines silently (a bad value: that stage is not named); the
    # worker, which prints its warnings, names the variable.
    worker_stages.check({"BAKERY_LOAD_BEGIN_LOG_MSGS": "[]"}, warnings)
    assert len(warnings) == 1 and "BAKERY_LOAD_BEGIN_LOG_MSGS" in warnings[0], warnings
    assert worker_stages.load({"BAKERY_LOAD_BEGIN_LOG_MSGS": "[]"}, [])["load_begins"] == ()


def test_a_watcher_that_raises_never_ends_the_log_tail() -> None:
    # The watchers run inside the SDK's tail loop, which must keep reading the load and error lines.
    from app import serving

    seen: list[str] = []

    def broken(_line: str) -> None:
        raise ValueError("a bug in a report")

    each = serving._each([broken, seen.append])
    each("a line")
    each("another")
    assert seen == ["a line", "another"]
