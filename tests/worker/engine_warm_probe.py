"""Run inside the worker venv (PYTHONPATH=worker/): forward.Pool's idle connections renewed between
bursts by engine_warm.Keeper, against a loopback engine that drops a connection idle for too long.

    <venv>/bin/python engine_warm_probe.py

Prints one JSON object; tests/worker/test_engine_warm.py asserts it. Times are scaled down: the
pool hands out no connection idle for KEEPALIVE s, the engine drops one idle for ENGINE_IDLE s, the
keeper looks every TICK s and renews LEAD s before KEEPALIVE, for WARM s after the last request.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from typing import Any

from forward_probe import finish  # this script's directory is first on sys.path

from engine import engine_warm, forward

KEEPALIVE, ENGINE_IDLE, TICK, LEAD, WARM, QUIET = 0.8, 1.0, 0.05, 0.4, 2.5, 0.2
BUSY_TRIES = 3  # busy phases run at most (one whose requests came QUIET apart proves nothing)
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class Engine:
    """Answers every request with OK; drops a connection ENGINE_IDLE s after its last request (as
    uvicorn does after 5 s); counts the connections it accepted and those open at once."""

    def __init__(self) -> None:
        self.accepted = 0
        self.open = 0
        self.most_open = 0
        self.server: asyncio.base_events.Server | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while True:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), ENGINE_IDLE)
                await reader.readexactly(int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]))
                writer.write(OK)
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, asyncio.CancelledError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()

    async def start(self, port: int = 0) -> int:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", port)
        return self.server.sockets[0].getsockname()[1]


async def burst(pool: forward.Pool, n: int) -> list[str]:
    answers = await asyncio.gather(*(pool.post("/v1/x", {"i": i}) for i in range(n)))
    return [(await answer.read()).decode() for answer in answers]


def young(pool: forward.Pool) -> int:
    """Idle connections the pool would hand out now."""
    now = asyncio.get_running_loop().time()
    return sum(1 for conn in pool.idle if not conn.lost and now - conn.idle_since < pool.keepalive)


async def warm_case(warm: float) -> dict[str, Any]:
    engine = Engine()
    port = await engine.start()
    pool = forward.Pool("127.0.0.1", port, 5, 5, KEEPALIVE)
    if warm > 0:
        pool.keeper = engine_warm.Keeper(pool, warm, tick=TICK, per_tick=4, lead=LEAD, quiet=QUIET)
    bodies = await burst(pool, 6)
    after_burst = engine.accepted
    await asyncio.sleep(1.6)  # twice the pool's keep-alive: without renewal, nothing is young
    quiet = {"young": young(pool), "accepted": engine.accepted - after_burst, "most_open": engine.most_open}
    before = engine.accepted
    again = await burst(pool, 6)  # a second burst, 1.6 s after the first
    quiet["second_burst_opened"] = engine.accepted - before
    await asyncio.sleep(WARM + 1.2)  # past the warm window: renewal stops, the connections age out
    settled = engine.accepted
    await asyncio.sleep(0.6)
    report = {"bodies": bodies + again, "quiet": quiet, "after_window": {
        "young": young(pool), "opened_meanwhile": engine.accepted - settled}}
    if pool.keeper is not None:
        report["renewed"] = pool.keeper.renewed
    pool.close()
    assert engine.server is not None
    engine.server.close()
    return report


async def engine_gone() -> dict[str, Any]:
    """The engine stops listening while the pool is warm: renewal stops at the first refusal."""
    engine = Engine()
    port = await engine.start()
    pool = forward.Pool("127.0.0.1", port, 5, 5, KEEPALIVE)
    pool.keeper = engine_warm.Keeper(pool, WARM, tick=TICK, per_tick=4, lead=LEAD, quiet=QUIET)
    await burst(pool, 4)
    assert engine.server is not None
    engine.server.close()
    await engine.server.wait_closed()
    await asyncio.sleep(1.5)
    report = {"failed": pool.keeper.failed, "timer": pool.keeper.timer is not None,
              "opening": pool.keeper.opening}
    # The engine back on the same port: the next request connects, and renewal goes on after it.
    await engine.start(port)
    report["body"] = (await burst(pool, 1))[0]
    report["failed_after_request"] = pool.keeper.failed
    pool.close()
    engine.server.close()
    return report


async def ready_case() -> dict[str, Any]:
    """Connections opened before the first request (engine_warm.open_ready), and a burst after them;
    then the same against a port nobody listens on."""
    engine = Engine()
    port = await engine.start()
    pool = forward.Pool("127.0.0.1", port, 5, 5, KEEPALIVE)
    pool.keeper = engine_warm.Keeper(pool, WARM, tick=TICK, per_tick=4, lead=LEAD, quiet=QUIET)
    opened = await engine_warm.open_ready(pool, 6, step=4)
    report = {"opened": opened, "accepted": engine.accepted, "young": young(pool)}
    await asyncio.sleep(1.2)  # past the pool's keep-alive: renewal keeps them young from the opening on
    report["young_later"] = young(pool)
    before = engine.accepted
    report["bodies"] = await burst(pool, 6)
    report["burst_opened"] = engine.accepted - before
    report["most_open"] = engine.most_open
    pool.close()
    assert engine.server is not None
    engine.server.close()
    await engine.server.wait_closed()
    nobody = forward.Pool("127.0.0.1", port, 5, 5, KEEPALIVE)
    report["refused"] = await engine_warm.open_ready(nobody, 6, step=4)
    return report


async def busy_case() -> dict[str, Any]:
    """Requests keep coming (one every TICK) while six idle connections are due: none is renewed
    until QUIET after the last request. On a busy machine two requests may come QUIET or more apart,
    and then a renewal between them is right: such a phase is run again (BUSY_TRIES at most), and the
    largest gap of the phase reported is given with it."""
    engine = Engine()
    port = await engine.start()
    pool = forward.Pool("127.0.0.1", port, 5, 5, KEEPALIVE)
    pool.keeper = engine_warm.Keeper(pool, WARM, tick=TICK, per_tick=4, lead=LEAD, quiet=QUIET)
    tries = 0
    while tries < BUSY_TRIES:
        tries += 1
        await burst(pool, 6)
        await asyncio.sleep(LEAD + 0.05)  # all six due for renewal (idle >= KEEPALIVE - LEAD)
        renewed_before = pool.keeper.renewed
        starts = []
        for _ in range(10):  # one request every TICK for 0.5 s: the same (newest) connection each time
            await burst(pool, 1)
            starts.append(pool.last_request)
            await asyncio.sleep(TICK)
        gap = max(later - earlier for earlier, later in itertools.pairwise(starts))
        if gap < QUIET:
            break
    report = {"renewed_while_busy": pool.keeper.renewed - renewed_before, "busy_gap": gap, "busy_tries": tries}
    await asyncio.sleep(QUIET + 0.3)
    report["renewed_after"] = pool.keeper.renewed - renewed_before
    pool.keeper.stopping = lambda: True  # the worker drains: six due again, none renewed
    await asyncio.sleep(LEAD + 0.3)
    stopped_at = pool.keeper.renewed
    await asyncio.sleep(0.5)
    report["renewed_while_draining"] = pool.keeper.renewed - stopped_at
    pool.close()
    assert engine.server is not None
    engine.server.close()
    return report


async def main_async() -> dict[str, Any]:
    return {"warm": await warm_case(WARM), "off": await warm_case(0), "engine_gone": await engine_gone(),
            "ready": await ready_case(), "busy": await busy_case(),
            "describe": [engine_warm.describe(60, 256), engine_warm.describe(0)]}


def main() -> int:
    loop = asyncio.new_event_loop()
    return finish(loop, loop.run_until_complete(main_async()))


if __name__ == "__main__":
    sys.exit(main())
