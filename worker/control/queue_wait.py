"""The SDK's queue estimate, kept as requests come and go instead of summed on every request.

vastai 1.9.1's `ModelMetrics.wait_time` sums the workload of every request in flight: O(N^2) per burst. Here
`requests_working` keeps that sum exactly as entries come and go; a non-finite workload, or a dict this module
did not make, is summed the SDK's way. Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

MIN_THROUGHPUT = 0.00001  # the SDK's floor under the measured throughput (vastai 1.9.1's wait_time)
SCALE = 1 << 1074  # UNIT = 1 / SCALE = 2**-1074, the smallest float: every finite float is a whole number of them
_MISSING = object()  # pop() without a default


class Working(dict):
    """The SDK's requests in flight (reqnum -> RequestMetrics) with the sum of their workloads kept:
    each entry's workload as it was added, in units of 2**-1074 (every finite float is a whole number
    of them, so the integer sum is exact; a session counts 0, as the SDK's sum skips sessions)."""

    def __init__(self, items: Iterable[tuple[Any, Any]] = ()) -> None:
        super().__init__()
        self.units = 0  # the exact sum of the workloads, in UNIT
        self.added: dict[Any, int | None] = {}  # each entry's share, None when not a finite number
        self.unsummable = 0  # entries whose workload is not a finite number: summed the SDK's way then
        for key, request in dict(items).items():
            self[key] = request

    def __setitem__(self, key: Any, request: Any) -> None:
        if key in self:
            self._forget(key)
        super().__setitem__(key, request)
        share = units(request)
        if share is None:
            self.unsummable += 1
        else:
            self.units += share
        self.added[key] = share

    def _forget(self, key: Any) -> None:
        share = self.added.pop(key)
        if share is None:
            self.unsummable -= 1
        else:
            self.units -= share

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key)
        self._forget(key)

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        if key not in self:
            if default is _MISSING:
                raise KeyError(key)
            return default
        request = super().pop(key)
        self._forget(key)
        return request

    def popitem(self) -> tuple[Any, Any]:
        key, request = super().popitem()
        self._forget(key)
        return key, request

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, request in dict(*args, **kwargs).items():
            self[key] = request

    def __ior__(self, other: Any) -> Working:
        self.update(other)
        return self

    def clear(self) -> None:
        super().clear()
        self.added.clear()
        self.units = 0
        self.unsummable = 0

    def total(self) -> float | None:
        """The workloads' sum, correctly rounded (int / int is); None when one is not a finite number."""
        if self.unsummable:
            return None
        try:
            return self.units / SCALE
        except OverflowError:  # beyond a float: let the SDK's own sum say so
            return None


def units(request: Any) -> int | None:
    """What `request` adds to the estimate, in UNIT: its workload, 0 for a session, None if its
    workload is not a finite number."""
    if getattr(request, "is_session", False):
        return 0
    workload = getattr(request, "workload", None)
    if type(workload) is not float:
        if not isinstance(workload, (int, float)) or isinstance(workload, bool):
            return None
        workload = float(workload)
    if not math.isfinite(workload):
        return None
    numerator, denominator = workload.as_integer_ratio()  # the denominator is a power of two <= SCALE
    return numerator * (SCALE // denominator)


def estimate(original: Callable[[Any], float]) -> Callable[[Any], float]:
    """A `wait_time` getter that reads a Working's sum and falls back to `original` otherwise."""
    def wait_time(metrics: Any) -> float:
        working = metrics.requests_working
        if type(working) is Working:
            if not working:
                return 0.0
            total = working.total()
            if total is not None:
                return total / max(metrics.max_throughput, MIN_THROUGHPUT)
        return original(metrics)

    wait_time.bakery_kept = True  # type: ignore[attr-defined]
    wait_time.original = original  # type: ignore[attr-defined]
    return wait_time


def install(plane: Any) -> bool:
    """Keep the queue estimate of the SDK's Metrics as requests come and go (`plane`, the ControlPlane).
    False, touching nothing, when either point is gone (a changed SDK: its own sum is used)."""
    return plane.keep_queue_estimate(lambda current: current if type(current) is Working else Working(current.items()),
                                     estimate)
