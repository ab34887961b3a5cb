"""Keep the work that ends while a status report is on its way: it goes in the next report.

vastai 1.9.1 resets its counters after a report's POST, wiping what requests added during the await, so the
autoscaler saw less served load than there was. Each send is wrapped so its reset keeps what was added after
the report was built. Installed before report_soon, which sends through it. Standard library only.
"""

from __future__ import annotations

import contextvars
from typing import Any

# The counters the SDK's ModelMetrics.reset() sets to 0 after a report went through.
COUNTERS = ("workload_served", "workload_received", "workload_cancelled", "workload_errored",
            "workload_rejected")
_SENT: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar("report_keep_sent", default=None)


def install(ctx: Any) -> None:
    """Wrap the SDK's status-report send and its counters' reset (ctx.sdk, the ControlPlane)."""
    plane = ctx.sdk
    model = plane.counters()

    def reset_keeping() -> None:
        sent = _SENT.get()
        now = {name: getattr(model, name) for name in COUNTERS}
        sdk_reset()
        if sent is None:  # a reset outside a send (none in 1.9.1): as the SDK does
            return
        kept = False
        for name in COUNTERS:
            left = now[name] - sent[name]
            if left:
                setattr(model, name, left)
                kept = True
        if kept:  # the SDK clears update_pending just before the reset: ask for the next tick again
            plane.ask_report()

    def send_keeping(send: Any) -> Any:
        async def send_and_keep(*args: Any, **kwargs: Any) -> Any:
            # No await between this read and the SDK building its report from the same counters.
            token = _SENT.set({name: getattr(model, name) for name in COUNTERS})
            try:
                return await send(*args, **kwargs)
            finally:
                _SENT.reset(token)

        return send_and_keep

    sdk_reset = plane.replace_counters_reset(reset_keeping)
    plane.wrap_report(send_keeping)
