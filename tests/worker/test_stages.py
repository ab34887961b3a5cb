"""The worker's stage lines (workers/openai/stages.py): on lines given by hand, and with the real SDK in
front of the vLLM stand-in, whose log carries vLLM's load lines."""

from __future__ import annotations

from workers.openai import stages as worker_stages

from tests.image import stages
from tests.worker.helpers import Harness

MODEL = "standin-model"


def test_the_worker_says_each_stage_once_in_the_order_reached() -> None:
    said: list[str] = []
    clock = iter([10.0, 11.0, 12.0, 13.0, 14.0])
    timeline = worker_stages.Stages({"load_begins": ("Starting to load model",),
                                     "weights_loaded": ("Loading weights took", "Model loading took"),
                                     "engine_ready": ("Application startup complete.",)},
                                    said.append, clock=lambda: next(clock))
    for line in ["INFO Starting to load model /models/x...", "INFO Starting to load model again",
                 "INFO Model loading took 0.26 GiB", "INFO Loading weights took 0.1 seconds",
                 "INFO Application startup complete."]:
        timeline.seen(line)
    timeline.mark("benchmark_done")
    timeline.mark("ready_report_sent")
    timeline.mark("benchmark_done")
    assert [line.split(":")[1].split()[1] for line in said] == list(worker_stages.STAGES)
    assert said[0] == "bakery-worker: stage load_begins at 10.000: INFO Starting to load model /models/x..."
    parsed = [stages.STAGE_LINE.search(line) for line in said]
    assert [(m.group(1), float(m.group(2))) for m in parsed if m] == list(zip(worker_stages.STAGES,
                                                                           [10.0, 11.0, 12.0, 13.0, 14.0], strict=True))


def test_an_engines_line_is_shown_escaped_and_cut() -> None:
    said: list[str] = []
    timeline = worker_stages.Stages({"engine_ready": ("ready",)}, said.append, clock=lambda: 1.0)
    timeline.seen("ready \x1b[31m" + "x" * 500)
    assert "\x1b" not in said[0] and "\\x1b" in said[0] and len(said[0]) < 300, said


def test_a_worker_says_every_stage_of_its_load(harness: Harness) -> None:
    engine = harness.standin("vllm", load_seconds=1)
    served = harness.serve("vllm", engine, MODEL_NAME=MODEL,
                           BAKERY_LOAD_BEGIN_LOG_MSGS='["Starting to load model"]',
                           BAKERY_WEIGHTS_LOADED_LOG_MSGS='["Loading weights took", "Model loading took"]')
    text = served.worker.wait_for("stage ready_report_sent", timeout=30)
    seen = [(m.group(1), float(m.group(2))) for m in stages.STAGE_LINE.finditer(text)]
    assert [name for name, _ in seen] == list(worker_stages.STAGES), text[-3000:]
    times = [at for _, at in seen]
    assert times == sorted(times), seen
    assert times[2] - times[0] >= 0.9, f"the stand-in loads for 1 s between its load lines: {seen}"


def test_a_watcher_that_raises_never_ends_the_log_tail() -> None:
    # The watchers run inside the SDK's tail loop, which must keep reading the load and error lines.
    from workers.openai import serving

    seen: list[str] = []

    def broken(_line: str) -> None:
        raise ValueError("a bug in a report")

    each = serving._each([broken, seen.append])
    each("a line")
    each("another")
    assert seen == ["a line", "another"]
