"""report_soon: the "loaded" status report is flagged as pending as soon as the model is loaded.

The SDK (vastai 1.9.1) sends a status report from a 1 s loop only when `update_pending` is set or
10 s have passed; report_soon sets the flag once `system_metrics.model_is_loaded` turns true. Checked
here on stand-in objects (no SDK, no clock), and the two SDK attributes are pinned on the real Metrics.
"""

from __future__ import annotations

import asyncio
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from workers.openai import report_soon
from workers.openai.guards import GuardError


@dataclass
class Ctx:
    backend: Any
    on_startup: list = field(default_factory=list)


def fake_ctx() -> Ctx:
    metrics = SimpleNamespace(system_metrics=SimpleNamespace(model_is_loaded=False), update_pending=False)
    return Ctx(backend=SimpleNamespace(metrics=metrics))


def test_the_report_is_flagged_once_the_model_is_loaded() -> None:
    ctx = fake_ctx()
    report_soon.install(ctx)
    metrics = ctx.backend.metrics

    async def scenario() -> list[bool]:
        for hook in ctx.on_startup:
            await hook(None)
            await hook(None)  # the SDK's second app: still one watcher
        seen = []
        for _ in range(3):
            await asyncio.sleep(report_soon.POLL * 2)
            seen.append(metrics.update_pending)
        metrics.system_metrics.model_is_loaded = True
        for _ in range(100):
            await asyncio.sleep(report_soon.POLL)
            if metrics.update_pending:
                break
        seen.append(metrics.update_pending)
        return seen

    assert asyncio.run(scenario()) == [False, False, False, True]


def test_a_changed_sdk_is_refused_by_name() -> None:
    with pytest.raises(GuardError, match=r"report_soon\.py"):
        report_soon.install(Ctx(backend=SimpleNamespace(metrics=SimpleNamespace())))


def test_the_sdk_metrics_have_the_two_attributes(worker_python: Path) -> None:
    code = ("from vastai.serverless.server.lib.metrics import Metrics; m = Metrics(); "
            "print(type(m.system_metrics.model_is_loaded).__name__, type(m.update_pending).__name__)")
    out = subprocess.run([str(worker_python), "-c", code], capture_output=True, text=True, check=True, timeout=60,
                         env={"CONTAINER_ID": "1", "REPORT_ADDR": "http://127.0.0.1:9", "PUBLIC_IPADDR": "127.0.0.1",
                              "WORKER_PORT": "3000", "VAST_TCP_PORT_3000": "3000"})
    assert out.stdout.split() == ["bool", "bool"], out
