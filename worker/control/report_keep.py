"""Keep the work that ends while a status report is on its way: it goes in the next report.

vastai 1.9.1 builds a status report from its counters (workload served, received, cancelled,
errored, rejected), awaits the POST to the control plane, and on success resets the counters to 0.
Whatever a request added to them during that await (a request that ended while the report was
in flight) is wiped with the rest and never reported: the autoscaler sees less served load than
there was. Seen in a fresh-machine run on a loaded machine (tests/worker/test_routes_sdk.py: a
request's workload never reached `cur_perf`). Here each send is wrapped so that the reset after it
keeps, per counter, what was added after the report was built (the report is built before the
send's first await, from the values the wrapper reads just before it); a report that carried
nothing new leaves nothing behind, and the SDK's next tick is asked for when something was kept.

Installed before report_soon, which sends through the wrapped send. This module imports only the
standard library at import time.
"""

from __future__ import annotations

import contextvars
from typing import Any

from control import sdk_seam

WHO = "report_keep.py"
# The counters the SDK's ModelMetrics.reset() sets to 0 after a report went through.
COUNTERS = ("workload_served", "workload_received", "workload_cancelled", "workload_errored",
            "workload_rejected")
_SENT: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar("report_keep_sent", default=None)


def install(ctx: Any) -> None:
    """Wrap the SDK's status-report send and its counters' reset (sdk_seam hooks "send_report",
    "model_metrics_reset")."""
    metrics = sdk_seam.find(ctx.backend, "metrics", WHO)
    model = sdk_seam.find(metrics, "model_metrics", WHO)
    reset = sdk_seam.find(metrics, "model_metrics_reset", WHO)

    def reset_keeping() -> None:
        sent = _SENT.get()
        now = {name: getattr(model, name) for name in COUNTERS}
        reset()
        if sent is None:  # a reset outside a send (none in 1.9.1): as the SDK does
            return
        kept = False
        for name in COUNTERS:
            left = now[name] - sent[name]
            if left:
                setattr(model, name, left)
                kept = True
        if kept:  # the SDK clears update_pending just before the reset: ask for the next tick again
            metrics.update_pending = True

    def send_keeping(send: Any) -> Any:
        async def send_and_keep(*args: Any, **kwargs: Any) -> Any:
            # No await between this read and the SDK building its report from the same counters.
            token = _SENT.set({name: getattr(model, name) for name in COUNTERS})
            try:
                return await send(*args, **kwargs)
            finally:
                _SENT.reset(token)

        return send_and_keep

    sdk_seam.put(metrics, "model_metrics_reset", reset_keeping)
    sdk_seam.wrap(metrics, "send_report", WHO, send_keeping)
