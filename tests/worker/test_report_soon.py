"""report_soon: the "loaded" status report is sent as soon as the model is loaded.

The SDK (vastai 1.9.1) sends a status report from a 1 s loop only when `update_pending` is set or
10 s have passed; report_soon sends it itself, with the SDK's own send, once
`system_metrics.model_is_loaded` turns true, and leaves it to the loop (the flag) when that send did
not go through. Checked here on stand-in objects (no SDK, no clock), and the SDK attributes it uses
are pinned on the real Metrics.
"""

from __future__ import annotations

import asyncio
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from control import report_soon, sdk_seam


@dataclass
class Ctx:
    sdk: Any
    on_startup: list = field(default_factory=list)


class FakeMetrics:
    """The SDK Metrics' four attributes report_soon uses; `send` succeeds (stamps the time) or fails."""

    def __init__(self, delivers: bool) -> None:
        self.system_metrics = SimpleNamespace(model_is_loaded=False)
        self.update_pending = False
        self.last_metric_update = 0.0
        self.sent = 0
        self.delivers = delivers

    async def _Metrics__send_metrics_and_reset(self) -> None:
        self.sent += 1
        if self.delivers:
            self.update_pending = False
            self.last_metric_update = 1.0


def run_until_loaded(delivers: bool) -> tuple[list[int], FakeMetrics]:
    """Install, run both apps' startup hooks, flip model_is_loaded; the send count before and after."""
    metrics = FakeMetrics(delivers)
    ctx = Ctx(sdk=sdk_seam.ControlPlane(SimpleNamespace(metrics=metrics)))
    report_soon.install(ctx)

    async def scenario() -> list[int]:
        for hook in ctx.on_startup:
            await hook(None)
            await hook(None)  # the SDK's second app: still one watcher
        seen = []
        for _ in range(3):
            await asyncio.sleep(report_soon.POLL * 2)
            seen.append(metrics.sent)
        metrics.system_metrics.model_is_loaded = True
        for _ in range(100):
            await asyncio.sleep(report_soon.POLL)
            if metrics.sent:
                break
        await asyncio.sleep(report_soon.POLL * 3)
        seen.append(metrics.sent)
        return seen

    return asyncio.run(scenario()), metrics


def test_the_loaded_report_is_sent_once_the_model_is_loaded() -> None:
    seen, metrics = run_until_loaded(delivers=True)
    assert seen == [0, 0, 0, 1]  # nothing before, exactly one send after
    assert metrics.update_pending is False  # sent: nothing left for the SDK's tick


def test_a_report_that_did_not_go_through_is_left_to_the_sdks_tick() -> None:
    seen, metrics = run_until_loaded(delivers=False)
    assert seen == [0, 0, 0, 1] and metrics.update_pending is True




def test_the_sdk_metrics_have_what_report_soon_uses(worker_python: Path) -> None:
    code = ("import inspect; from vastai.serverless.server.lib.metrics import Metrics; m = Metrics(); "
            "print(type(m.system_metrics.model_is_loaded).__name__, type(m.update_pending).__name__, "
            "type(m.last_metric_update).__name__, "
            f"inspect.iscoroutinefunction(getattr(m, {sdk_seam.hook('send_report').attr!r}, None)))")
    out = subprocess.run([str(worker_python), "-c", code], capture_output=True, text=True, check=True, timeout=60,
                         env={"CONTAINER_ID": "1", "REPORT_ADDR": "http://127.0.0.1:9", "PUBLIC_IPADDR": "127.0.0.1",
                              "WORKER_PORT": "3000", "VAST_TCP_PORT_3000": "3000"})
    assert out.stdout.split() == ["bool", "bool", "float", "True"], out
