"""The test suite's port allocator (tests/ports.py): distinct, outside the kernel's ephemeral range, bindable."""

from __future__ import annotations

import socket

from tests import ports


def test_pairs_are_distinct_below_the_ephemeral_range_and_bindable() -> None:
    given = [ports.free_port_pair() for _ in range(ports.RECENT)]
    taken = [p for port in given for p in (port, port + 1)]
    assert len(set(taken)) == len(taken), "a port was handed out twice"
    assert all(ports.LOW <= p < ports.ephemeral_low() for p in taken)
    assert not set(taken) & ports.RESERVED


def test_a_port_someone_listens_on_is_skipped() -> None:
    first = ports.free_port_pair()
    with socket.socket() as holder:  # hold the next candidate in the sequence: it must be passed over
        holder.bind(("0.0.0.0", first + 2))  # noqa: S104 - as the SDK binds
        holder.listen()
        assert ports.free_port_pair() not in (first + 1, first + 2)
