"""Key rotation (policy/key_rotation.py): the worker follows the autoscaler's public key.

The rules on the host (the rate limit of the fetch loop, with a stand-in fetch), then the real SDK:
a secured worker whose report server switches the key it serves at /pubkey/ (helpers.ReportServer's
`pubkey`), with the documented times made short by the variables.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
import types
from pathlib import Path

import pytest

from policy import guards, key_rotation
from tests.worker.helpers import SDK_READY, Harness, SigningKey, make_signing_key, secured, send, start_engine

# --------------------------------------------------------------------------- the rules


def _key(n: int) -> types.SimpleNamespace:
    return types.SimpleNamespace(n=n, e=65537)


def _rotation(served: list[types.SimpleNamespace], refresh: float,
              min_gap: float) -> tuple[key_rotation.Rotation, list]:
    """A Rotation whose fetch returns served[-1] (and counts), and the key it holds ([current])."""
    held = [served[-1]]

    async def fetch() -> types.SimpleNamespace:
        fetches.append(time.monotonic())
        return served[-1]

    fetches: list[float] = []
    rotation = key_rotation.Rotation("http://127.0.0.1:9/pubkey/", refresh, min_gap, fetch, lambda: held[0],
                                     lambda key: held.__setitem__(0, key))
    return rotation, [held, fetches]


def test_a_flood_of_failures_fetches_at_most_once_per_min_gap() -> None:
    """1.2 s of nothing but failed signatures, with a 0.3 s minimum gap: at most 1.2/0.3 + 1 fetches
    (and some: the failures do ask), whatever the number of failures."""
    served = [_key(11)]
    rotation, (_held, fetches) = _rotation(served, refresh=300.0, min_gap=0.3)

    async def flood() -> int:
        task = asyncio.ensure_future(rotation.run())
        count, end = 0, time.monotonic() + 1.2
        while time.monotonic() < end:
            rotation.record(False)
            count += 1
            await asyncio.sleep(0.0005)
        task.cancel()
        return count

    failures = asyncio.run(flood())
    assert failures > 500
    assert 2 <= len(fetches) <= 1.2 / 0.3 + 1, fetches
    gaps = [b - a for a, b in itertools.pairwise(fetches)]
    assert all(gap >= 0.3 - 0.02 for gap in gaps), gaps


def test_fewer_failures_than_a_run_and_successes_ask_for_nothing() -> None:
    served = [_key(11)]
    rotation, (_held, fetches) = _rotation(served, refresh=300.0, min_gap=0.05)

    async def mixed() -> None:
        task = asyncio.ensure_future(rotation.run())
        for _ in range(200):
            for _ in range(key_rotation.FAILURE_RUN - 1):
                rotation.record(False)
            rotation.record(True)
            await asyncio.sleep(0.001)
        task.cancel()

    asyncio.run(mixed())
    assert fetches == []


def test_the_periodic_fetch_replaces_a_rotated_key() -> None:
    served = [_key(11)]
    rotation, (held, fetches) = _rotation(served, refresh=0.2, min_gap=10.0)

    async def rotate() -> None:
        task = asyncio.ensure_future(rotation.run())
        await asyncio.sleep(0.05)
        served.append(_key(13))
        deadline = time.monotonic() + 2
        while held[0].n != 13 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(rotate())
    assert held[0].n == 13 and 1 <= len(fetches) <= 3, (held, fetches)


def test_the_limits_have_defaults_and_variables() -> None:
    limits, errors = guards.load_limits({"BAKERY_PUBKEY_REFRESH": "30", "BAKERY_PUBKEY_REFETCH_MIN": "2.5"})
    assert errors == [] and (limits.pubkey_refresh, limits.pubkey_refetch_min) == (30.0, 2.5)
    assert (guards.Limits().pubkey_refresh, guards.Limits().pubkey_refetch_min) == (300.0, 10.0)
    assert guards.describe((), guards.Limits()).endswith(" pubkey_refresh=300s pubkey_refetch>=10s")
    _, errors = guards.load_limits({"BAKERY_PUBKEY_REFRESH": "0", "BAKERY_PUBKEY_REFETCH_MIN": "soon"})
    assert [e.split("=")[0] for e in errors] == ["BAKERY_PUBKEY_REFRESH", "BAKERY_PUBKEY_REFETCH_MIN"], errors


# --------------------------------------------------------------------------- the real SDK


@pytest.fixture(scope="module")
def keys(worker_python: Path) -> tuple[SigningKey, SigningKey, SigningKey]:
    """Key A (served first), key B (served after the rotation), and a key the autoscaler never serves."""
    return make_signing_key(worker_python), make_signing_key(worker_python), make_signing_key(worker_python)


@functools.lru_cache(maxsize=16)
def _signature(key: SigningKey, url: str) -> str:
    return key.sign(url)  # the same URL, the same signature: made once (pure-Python RSA is slow)


def _status(port: int, key: SigningKey, idx: int) -> int:
    own = f"http://127.0.0.1:{port}"
    auth = {"cost": "8", "endpoint": "t", "reqnum": idx, "request_idx": idx, "signature": _signature(key, own),
            "url": own}
    return send(port, "/v1/completions", {"auth_data": auth, "payload": {"prompt": "k"}})[0]


def _until(port: int, key: SigningKey, wanted: int, seconds: float, first_idx: int) -> tuple[list[int], float]:
    """Send requests signed by `key` until one gets `wanted` (or `seconds` pass): the statuses, and
    the seconds it took."""
    started, statuses = time.monotonic(), []
    while time.monotonic() - started < seconds:
        statuses.append(_status(port, key, first_idx + len(statuses)))
        if statuses[-1] == wanted:
            break
        time.sleep(0.05)
    return statuses, time.monotonic() - started


@pytest.mark.slow
def test_a_key_the_autoscaler_no_longer_serves_is_refused_within_the_refresh(
        harness: Harness, keys: tuple[SigningKey, SigningKey, SigningKey]) -> None:
    """A is served, then B: requests signed by A keep passing (no failure asks for a fetch) until the
    periodic fetch, at most BAKERY_PUBKEY_REFRESH (+ the fetch's own time) after the switch; then A is
    refused and B accepted."""
    key_a, key_b, _ = keys
    reports = harness.report_server(key_a.pem)
    # With a front process (front/processes.py): the connections it is given must not pass A's pair either.
    served = secured(harness, start_engine(harness), reports, BAKERY_PUBKEY_REFRESH="3", BAKERY_FRONT_PROCESSES="1")
    served.worker.wait_for(SDK_READY, timeout=60)
    reports.wait_loaded()
    assert _status(served.port, key_a, 1) == 200
    reports.pubkey = key_b.pem
    statuses, took = _until(served.port, key_a, 401, 3 + 5, 100)
    assert statuses[-1] == 401 and set(statuses[:-1]) <= {200}, statuses
    assert took <= 3 + 1.5, took
    assert _status(served.port, key_b, 2) == 200
    served.worker.wait_for("the periodic check every 3 s", timeout=5)
    assert "signatures by the previous key are refused from now on" in served.worker.text


@pytest.mark.slow
def test_a_run_of_failures_fetches_the_new_key_and_a_flood_is_rate_limited(
        harness: Harness, keys: tuple[SigningKey, SigningKey, SigningKey]) -> None:
    """B signs after the switch: the first requests are refused (401, the platform retries: the one
    whose failure asks for the fetch is not checked again), then B is accepted without waiting for the
    periodic fetch (300 s), and A is refused at once. A flood of signatures by a key never served then
    makes at most one fetch per BAKERY_PUBKEY_REFETCH_MIN."""
    key_a, key_b, never = keys
    reports = harness.report_server(key_a.pem)
    served = secured(harness, start_engine(harness), reports, BAKERY_PUBKEY_REFETCH_MIN="2",
                     BAKERY_FRONT_PROCESSES="1")  # as above
    served.worker.wait_for(SDK_READY, timeout=60)
    reports.wait_loaded()
    port = served.port
    assert _status(port, key_a, 1) == 200
    reports.pubkey = key_b.pem
    statuses, took = _until(port, key_b, 200, 2 + 5, 100)
    assert statuses[-1] == 200 and statuses.count(401) >= key_rotation.FAILURE_RUN, statuses
    assert set(statuses[:-1]) == {401} and took <= 2 + 1.5, (statuses, took)
    assert _status(port, key_a, 2) == 401
    assert "after 3 signature failures in a row" in served.worker.text

    before, started, sent = reports.pubkey_gets, time.monotonic(), 0
    while time.monotonic() - started < 6.0:
        assert _status(port, never, 1000 + sent) == 401
        sent += 1
    fetched = reports.pubkey_gets - before
    assert sent > 100 and 2 <= fetched <= 6.0 / 2 + 1, (sent, fetched)
    assert _status(port, key_b, 3) == 200
