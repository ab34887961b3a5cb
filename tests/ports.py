"""Loopback ports for the servers tests start: each handed out once per process, none the kernel hands out.

Asking the kernel for a free port (bind to 0, close) races twice: the next such request in the same
process can get the same port back before the first server has bound it (a worker once got its own
engine's port), and the port is in the ephemeral range, which the kernel also gives to outgoing
connections' source ports. So ports come from below that range (`EPHEMERAL_LOW`), from a block of
their own per pytest-xdist worker (`PYTEST_XDIST_WORKER`, else the process id), in turn, never one
of the last RECENT pairs handed out, and only when it can be bound right now.
"""

from __future__ import annotations

import itertools
import os
import socket
from collections import deque
from collections.abc import Iterator
from pathlib import Path

RESERVED = {3000, 3001, 18000}  # what containers and images listen on
LOW = 10000
BLOCK = 2000  # ports per process; 11 blocks fit below the ephemeral range
RECENT = 300  # pairs handed out that are never handed again (their servers may not have bound yet)


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 unless configured)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _block_start() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else os.getpid()
    blocks = max((ephemeral_low() - LOW) // BLOCK, 1)
    return LOW + (index % blocks) * BLOCK


def _candidates() -> Iterator[int]:
    start = _block_start()
    offset = 2 * (os.getpid() % (BLOCK // 2))  # even, so a pair's P+1 stays in the block; two suites start apart
    for step in itertools.count():
        yield start + (offset + 2 * step) % BLOCK


_NEXT = _candidates()
_RECENT: deque[int] = deque(maxlen=RECENT)


def bindable(port: int) -> bool:
    """Whether `port` can be bound on every interface right now (the SDK binds 0.0.0.0)."""
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))  # noqa: S104 - a check, closed at once
        except OSError:
            return False
    return True


def free_port_pair() -> int:
    """A port P, with P+1, not among this process's last RECENT pairs, that can be bound now (the SDK
    binds WORKER_PORT and WORKER_PORT+1). Pairs start at even offsets in the block, so two never overlap."""
    for _ in range(BLOCK):
        port = next(_NEXT)
        if port in _RECENT or {port, port + 1} & RESERVED or not (bindable(port) and bindable(port + 1)):
            continue
        _RECENT.append(port)
        return port
    raise RuntimeError(f"no free port pair left in this process's block from {_block_start()}")


def free_port() -> int:
    """One port, as free_port_pair gives."""
    return free_port_pair()
