"""let_go: a large request lets the loop go between its steps, and its parse step runs without the
cyclic collector, which comes back on at the loop's next callback and gets everything back at thaw()."""

from __future__ import annotations

import asyncio
import gc

from engine import let_go


def test_a_pause_lets_other_callbacks_run_for_a_large_request_only() -> None:
    async def run(size: int) -> int:
        token = let_go.mark(size)
        ran = 0

        def other(left: int) -> None:  # a request that needs several loop iterations
            nonlocal ran
            ran += 1
            if left:
                asyncio.get_running_loop().call_soon(other, left - 1)

        asyncio.get_running_loop().call_soon(other, 3)
        await let_go.pause()
        let_go.reset(token)
        return ran

    assert asyncio.run(run(let_go.LARGE_BODY)) == 4
    assert asyncio.run(run(let_go.LARGE_BODY - 1)) == 0


def test_the_collector_is_off_for_one_step_then_frozen_out_until_thaw() -> None:
    async def run() -> tuple[bool, bool, int, int]:
        token = let_go.mark(let_go.LARGE_BODY)
        let_go.quiet_collector()
        during = gc.isenabled()
        await asyncio.sleep(0)
        after, frozen = gc.isenabled(), gc.get_freeze_count()
        let_go.thaw()
        let_go.reset(token)
        return during, after, frozen, gc.get_freeze_count()

    assert gc.isenabled()
    during, after, frozen, thawed = asyncio.run(run())
    assert (during, after) == (False, True)
    assert frozen > 0 and thawed == 0
    # a small request leaves the collector alone
    async def small() -> bool:
        token = let_go.mark(10)
        let_go.quiet_collector()
        on = gc.isenabled()
        let_go.reset(token)
        return on

    assert asyncio.run(small())
