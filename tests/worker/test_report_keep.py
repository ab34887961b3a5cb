"""report_keep: work that ends while a status report is on its way reaches the next report.

vastai 1.9.1 builds a status report, awaits its POST, then zeroes the counters it was built from:
a request that ends during that await loses its served workload for good (seen as a failed
test_routes_sdk.py check in a fresh-machine run on a loaded machine). Provoked here on purpose with
the real SDK: the report server holds each /worker_status/ answer for 3 s, and a request is in
flight when a report leaves (the request itself asks for one), so it ends while that report waits.
"""

from __future__ import annotations

import threading

import pytest

from tests.worker.helpers import Harness, post_enveloped

pytestmark = pytest.mark.slow
MODEL = "standin-model"
SLOW_ANSWER = {"STANDIN_TOKEN_DELAY": "0.6"}  # 4 tokens: ~2.4 s
REQUEST = 7101  # this test's request_idx: the reports that name it are about it


def test_a_request_that_ends_during_a_report_is_counted_in_the_next(harness: Harness) -> None:
    # 4 tokens at 0.6 s: the answer takes ~2.4 s; the SDK's 1 s loop sends a report while it runs.
    engine = harness.standin("vllm", **SLOW_ANSWER)
    served = harness.serve("vllm", engine, MODEL_NAME=MODEL)
    reports = harness.reports
    reports.status_delay = 3.0
    with reports._lock:
        reports.reports.clear()
    answers: list[int] = []
    thread = threading.Thread(target=lambda: answers.append(post_enveloped(
        served.port, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 4}, reqnum=REQUEST)[0]))
    thread.start()
    thread.join(30)
    assert answers == [200]
    # The race was provoked: a report left while the request was working and carried none of its work.
    during = [s for s in reports.statuses() if s.get("working_request_idxs") == [REQUEST]]
    assert during and all(s.get("cur_perf") == 0 for s in during), reports.statuses()
    # BENCHMARK_MAX_TOKENS=8: max_tokens 4 is 4 units, and they reach a later report.
    reports.wait_status(lambda s: s.get("cur_perf") == pytest.approx(4.0), timeout=30)
