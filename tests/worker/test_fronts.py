"""front/processes.py and front_process.py: connections given to a front process are answered as the worker
alone answers them, their outcomes reach the platform's reports, the drain counts their requests,
and a front process that dies leaves a worker that serves.

Differential, as test_wire.py: two secured workers in front of one guard engine, one with
BAKERY_FRONT_PROCESSES=1, one with 0 (the wire front alone). The worker with a front process keeps
every second connection and gives the others to it, so each exchange below is sent on several
connections in turn (both processes answer some).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.worker.helpers import SDK_READY, Harness, Served, secured, start_engine
from tests.worker.test_wire import (
    LIMITS,
    Pair,
    answers,
    exchange,
    head,
    pair_on,
    test_a_signed_answer_to_a_client_that_reads_nothing_ends_at_the_send_bound,
    test_a_stream_that_breaks_is_answered_alike,
    test_keep_alive_and_pipelined_requests,
    test_served_answers_are_aiohttps,
    test_signed_requests_are_answered_alike,
    test_what_the_front_hands_to_aiohttp_is_answered_as_before,
)

pytestmark = pytest.mark.slow
# The differential tests of test_wire.py, here against a worker with a front process: each runs on
# the worker's own connections and on the front process's (the round robin alternates per connection).
__all__ = ["test_a_signed_answer_to_a_client_that_reads_nothing_ends_at_the_send_bound",
           "test_a_stream_that_breaks_is_answered_alike", "test_keep_alive_and_pipelined_requests",
           "test_served_answers_are_aiohttps", "test_signed_requests_are_answered_alike",
           "test_what_the_front_hands_to_aiohttp_is_answered_as_before"]
READY = re.compile(r"front process 1 \(pid (\d+)\) ready")


def front_pid(served: Served, timeout: float = 60.0) -> int:
    """The front process's pid, once the worker said it is ready."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = READY.search(served.worker.output.read_text())
        if found:
            return int(found.group(1))
        time.sleep(0.1)
    raise AssertionError(f"no front process ready within {timeout} s:\n{served.worker.output.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, worker_python: Path) -> Iterator[Pair]:
    with pair_on(tmp_path_factory, worker_python, "BAKERY_FRONT_PROCESSES", ("1", "0"), LIMITS) as made:
        front_pid(made.wire)
        yield made


def served_by_fronts(served: Served) -> int:
    said = re.findall(r"front processes: \d+ of \d+ running, (\d+) request\(s\) served by them",
                      served.worker.output.read_text())
    assert len(said) == 1, served.worker.output.read_text()[-3000:]
    return int(said[0])


def signed_exchange(pair: Pair, idx: int, payload: dict[str, Any]) -> list[tuple[str, dict[str, str], bytes]]:
    return answers(exchange(pair.wire.port, [head("/v1/completions", pair.body(pair.wire, payload, idx),
                                                  "Connection: close")]))


def test_a_connection_given_back_keeps_its_answers_whole_and_in_order(pair: Pair) -> None:
    """A signed request with a large answer, and behind it on the same connection one the front process
    gives back (unsigned: the primary answers 401). The client reads nothing for a while, so the first
    answer is still being written when the second request is read: the primary must not answer it
    before that answer is all out (a 401 status line once appeared inside the large body). Several
    connections: the worker gives every second one to its front process."""
    size = 2 * 1024 * 1024  # over what the sockets take at once
    for idx in range(4):
        signed = head("/v1/completions", pair.body(pair.wire, {"prompt": f"big {size}"}, 60 + idx))
        forged = json.loads(pair.body(pair.wire, {"prompt": "late"}, 70 + idx))
        forged["auth_data"]["signature"] = "A" * 344
        unsigned = head("/v1/completions", json.dumps(forged).encode(), "Connection: close")
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
            sock.settimeout(10)
            sock.connect(("127.0.0.1", pair.wire.port))
            sock.sendall(signed + unsigned)
            time.sleep(0.5)  # both requests are read; the first answer waits for this client
            raw = b""
            while chunk := sock.recv(65536):
                raw += chunk
        got = answers(raw)
        assert [status for status, _, _ in got] == ["HTTP/1.1 200 OK", "HTTP/1.1 401 Unauthorized"], raw[:300]
        assert json.loads(got[0][2])["choices"][0]["text"] == "x" * size


def test_outcomes_of_a_front_processs_requests_reach_the_reports(pair: Pair) -> None:
    """Every request's outcome is posted to the autoscaler (/delete_requests/), whichever process
    served it; after the drain the worker says how many the front process served (about half)."""
    wanted = set(range(200, 212))
    for idx in sorted(wanted):
        got = signed_exchange(pair, idx, {"prompt": "n", "stream": idx % 2 == 0})
        assert got[0][0] == "HTTP/1.1 200 OK", got
    assert pair.wire.reports is not None
    pair.wire.reports.wait_outcomes(wanted)
    pair.wire.worker.popen.send_signal(signal.SIGTERM)
    assert pair.wire.worker.popen.wait(timeout=30) == 0
    assert served_by_fronts(pair.wire) >= 4  # every second connection: six of these twelve, less the first


def test_the_drain_waits_for_a_front_processs_stream(tmp_path_factory: pytest.TempPathFactory,
                                                     worker_python: Path) -> None:
    """SIGTERM while streams are in flight on both processes: every stream ends whole, a request
    after it gets the drain's 503, and the worker exits 0 once both processes' streams ended."""
    with pair_on(tmp_path_factory, worker_python, "BAKERY_FRONT_PROCESSES", ("1", "0"), LIMITS) as fresh:
        front_pid(fresh.wire)
        signed_exchange(fresh, 1, {"prompt": "hi"})  # the memo learns the pair
        time.sleep(0.2)  # the pair reaches the front process (sent every 50 ms)
        socks = []
        for idx in range(2, 6):  # four connections: two of them the front process's
            sock = socket.create_connection(("127.0.0.1", fresh.wire.port), timeout=10)
            sock.sendall(head("/v1/completions", fresh.body(fresh.wire, {"prompt": "trickle 4 0.5", "stream": True},
                                                             idx), "Connection: close"))
            socks.append(sock)
        time.sleep(0.5)
        fresh.wire.worker.popen.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        late = signed_exchange(fresh, 9, {"prompt": "late"})
        assert late[0][0].startswith("HTTP/1.1 503"), late
        for sock in socks:
            raw = b""
            while chunk := sock.recv(65536):
                raw += chunk
            sock.close()
            got = answers(raw)
            assert got[0][0] == "HTTP/1.1 200 OK" and got[0][2].count(b"part") == 4, raw
        assert fresh.wire.worker.popen.wait(timeout=30) == 0
        output = fresh.wire.worker.output.read_text()
        assert "request(s) still in flight are cut" not in output, output[-3000:]
        assert served_by_fronts(fresh.wire) >= 2, output[-3000:]


def test_a_front_process_that_dies_is_replaced_and_the_worker_serves_meanwhile(
        tmp_path_factory: pytest.TempPathFactory, worker_python: Path) -> None:
    """The front process killed: the worker says so, reports its request in flight as failed (an
    outcome is posted) and answers the next connections itself; a second front process starts after
    a second's pause and serves its share of the connections after that (the drain line counts it)."""
    with pair_on(tmp_path_factory, worker_python, "BAKERY_FRONT_PROCESSES", ("1", "0"), LIMITS) as fresh:
        pid = front_pid(fresh.wire)
        signed_exchange(fresh, 1, {"prompt": "hi"})
        time.sleep(0.2)
        held = []
        for idx in (2, 3):  # one of the two is the front process's
            sock = socket.create_connection(("127.0.0.1", fresh.wire.port), timeout=10)
            sock.sendall(head("/v1/completions", fresh.body(fresh.wire, {"prompt": "trickle 3 1.0", "stream": True},
                                                             idx), "Connection: close"))
            held.append(sock)
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while "front process 1 ended" not in fresh.wire.worker.output.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        output = fresh.wire.worker.output.read_text()
        assert ("front process 1 ended (killed by signal 9); 1 request(s) it was serving failed" in output
                and "the worker serves without it until a new one starts in 1 s" in output), output[-3000:]
        for sock in held:
            sock.close()
        for idx in range(10, 16):  # within the pause: the worker alone
            got = signed_exchange(fresh, idx, {"prompt": "after"})
            assert got[0][0] == "HTTP/1.1 200 OK", got
            assert json.loads(got[0][2])["choices"][0]["text"] == "echo:after"
        deadline = time.monotonic() + 60
        while len(READY.findall(fresh.wire.worker.output.read_text())) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        output = fresh.wire.worker.output.read_text()
        pids = [int(found) for found in READY.findall(output)]
        assert len(pids) == 2 and pids[1] != pid, output[-3000:]
        assert "front process 1 started again in place of the one that ended" in output, output[-3000:]
        for idx in range(20, 26):  # every second connection is the new front process's
            got = signed_exchange(fresh, idx, {"prompt": "again"})
            assert got[0][0] == "HTTP/1.1 200 OK", got
            assert json.loads(got[0][2])["choices"][0]["text"] == "echo:again"
        assert fresh.wire.reports is not None
        fresh.wire.reports.wait_outcomes({2, 3, *range(10, 16), *range(20, 26)})
        # The new one ends within a minute of its start too: the pause doubles. The drain begins
        # within it: no third one starts.
        os.kill(pids[1], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while output.count("front process 1 ended") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
            output = fresh.wire.worker.output.read_text()
        assert "front process 1 ended (killed by signal 9); 0 request(s) it was serving failed, 0 connection(s) " \
               "it held closed; the worker serves without it until a new one starts in 2 s" in output, output[-3000:]
        fresh.wire.worker.popen.send_signal(signal.SIGTERM)
        assert fresh.wire.worker.popen.wait(timeout=30) == 0
        output = fresh.wire.worker.output.read_text()
        # The first served one at most (the stream it failed); three of 20-25 are the new one's.
        assert served_by_fronts(fresh.wire) >= 4, output[-3000:]
        assert "front processes: 0 of 1 running" in output, output[-3000:]
        assert "; 1 started again in place of one that ended" in output, output[-3000:]
        assert len(READY.findall(output)) == 2, output[-3000:]


def test_the_connection_cap_counts_the_front_processs_connections(harness: Harness) -> None:
    """BAKERY_MAX_CONNECTIONS=4 with a front process: four idle connections (two of them given to it)
    fill the cap and a fifth gets the cap's 503 at once; once the four close, four fit again (the
    front process said its two closed)."""
    served = secured(harness, start_engine(harness), BAKERY_FRONT_PROCESSES="1", BAKERY_MAX_CONNECTIONS="4",
                     BAKERY_HEADER_TIMEOUT="20")
    served.worker.wait_for(SDK_READY, timeout=90)
    front_pid(served)
    for attempt in range(2):
        held = [socket.create_connection(("127.0.0.1", served.port), timeout=5) for _ in range(4)]
        time.sleep(0.5)
        for sock in held:  # admitted: nothing is written to an idle connection
            sock.settimeout(0.2)
            with pytest.raises(TimeoutError):
                sock.recv(1)
        with socket.create_connection(("127.0.0.1", served.port), timeout=5) as fifth:
            refused = fifth.recv(4096)
        assert refused.startswith(b"HTTP/1.1 503 ") and b"BAKERY_MAX_CONNECTIONS" in refused, (attempt, refused)
        for sock in held:
            sock.close()
        time.sleep(1.0)  # their ends reach both processes' counts
    output = served.worker.output.read_text()
    assert "front process 1 ended" not in output, output[-3000:]
