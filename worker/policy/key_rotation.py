"""Key rotation: the worker follows the autoscaler's public key without a restart.

The SDK fetches the key once at start. Once it is loaded, this fetches it again every BAKERY_PUBKEY_REFRESH
seconds and after FAILURE_RUN signature failures in a row, never sooner than BAKERY_PUBKEY_REFETCH_MIN after
the last fetch. One key is trusted at a time; a failed fetch keeps it. See docs/security.md, "Key rotation".
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from config import request_path

FAILURE_RUN = 3  # signature failures in a row that ask for a re-fetch (one forged request does not)

log = logging.getLogger("bakery.key_rotation")


async def fetch_key(url: str, timeout: float) -> Any:
    """The RSA public key served at `url` (one GET of at most `timeout` seconds); raises on any failure."""
    import aiohttp
    from Crypto.PublicKey import RSA

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as client, \
            client.get(url) as response:
        response.raise_for_status()
        return RSA.import_key(await response.text())


def fingerprint(key: Any) -> str:
    """A short name of an RSA public key for the log (SHA-256 of its modulus)."""
    n = int(key.n)
    return hashlib.sha256(n.to_bytes((n.bit_length() + 7) // 8, "big")).hexdigest()[:12]


def same_key(a: Any, b: Any) -> bool:
    """Whether two RSA public keys are the same key."""
    return (int(a.n), int(a.e)) == (int(b.n), int(b.e))


def next_fetch(last: float, refresh: float, min_gap: float, asked: bool) -> float:
    """When the next fetch is due (on the clock of `last`, the start of the previous fetch): `refresh`
    after it, or `min_gap` after it when a fetch is asked for (a run of failures, a failed fetch)."""
    return last + (min(refresh, min_gap) if asked else refresh)


class Rotation:
    """Re-fetches the public key periodically and on a run of signature failures (see the module).

    `fetch()` returns a key or raises; `current()` is the key the signature check uses, `install(key)`
    replaces it. `record(valid)` is called with each signature verdict; `run()` is the fetch loop.
    """

    def __init__(self, url: str, refresh: float, min_gap: float, fetch: Callable[[], Awaitable[Any]],
                 current: Callable[[], Any], install: Callable[[Any], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url, self.refresh, self.min_gap = url, refresh, min_gap
        self.fetch, self.current, self.install, self.clock = fetch, current, install, clock
        self.failures = 0  # signature failures in a row
        self.asked: str | None = None  # why a fetch is wanted before the periodic one (failures, a retry)
        self.last = clock()  # when the previous fetch started
        self.fetches = 0
        self.failing = False  # the previous fetch failed (its warning is printed once per phase)
        self.wake = asyncio.Event()

    def record(self, valid: bool) -> None:
        """One signature verdict: a run of FAILURE_RUN failures asks for a fetch (the loop rate-limits it)."""
        if valid:
            self.failures = 0
            return
        self.failures += 1
        if self.failures >= FAILURE_RUN and self.asked is None:
            self.asked = f"after {FAILURE_RUN} signature failures in a row"
            self.wake.set()

    async def fetch_once(self, why: str) -> None:
        """One fetch; the key is replaced when the autoscaler serves another one."""
        self.last, self.asked, self.failures = self.clock(), None, 0
        self.fetches += 1
        try:
            key = await self.fetch()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 (any failure keeps the current key; retried min_gap later)
            self.asked = "a retry of a failed fetch"
            if not self.failing:
                log.warning("the public key could not be fetched again from %s (%s); the current key stays "
                            "until a fetch succeeds (retried every %g s)", self.url, type(exc).__name__, self.min_gap)
            self.failing = True
            return
        if self.failing:
            log.warning("the public key is fetched from %s again", self.url)
        self.failing = False
        old = self.current()
        if old is not None and same_key(old, key):
            return
        self.install(key)
        log.warning("the public key at %s changed (%s -> %s; %s): signatures by the previous key are refused "
                    "from now on", self.url, fingerprint(old) if old is not None else "none", fingerprint(key), why)

    async def run(self) -> None:
        """Fetch when due, for the worker's lifetime (ends when cancelled); each pass of the loop waits
        until the next fetch is due or a run of failures asks for one, so it never spins. Called once
        the first key is loaded: that fetch counts as the previous one."""
        self.last = self.clock()
        while True:
            wait = next_fetch(self.last, self.refresh, self.min_gap, self.asked is not None) - self.clock()
            if wait > 0:
                self.wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), wait)
                continue
            await self.fetch_once(self.asked or f"the periodic check every {self.refresh:g} s")


def counting(check: Callable[[Any], bool], rotation: Rotation, keyed: Callable[[], bool]) -> Callable[[Any], bool]:
    """The signature check `check`, each verdict recorded in `rotation` while `keyed()` (a key is loaded
    and signatures are checked at all)."""
    def check_signature(auth_data: Any) -> bool:
        valid = check(auth_data)
        if keyed():
            rotation.record(bool(valid))
        return valid

    return request_path.layer("pubkey_retry", check_signature, check)
