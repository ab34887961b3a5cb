"""processes.py's rules without the SDK: the body budget counted across processes, the link's messages
with a descriptor, each process's share of the engine connections opened at load, the setting."""

from __future__ import annotations

import asyncio
import os
import socket
import types
from typing import Any

import pytest

from app import front_process, worker_config
from config import table
from front import processes
from policy import admission, guards, signature
from tests.worker import helpers  # noqa: F401 (puts worker/ on sys.path first)
from tests.worker.helpers import baked_facts


def test_the_body_budget_counts_every_processs_bytes() -> None:
    slots = processes.Slots(2)
    primary, front = admission.Budget(100), admission.Budget(100)
    primary.share(slots, 0)
    front.share(processes.Slots(2, slots.fd), 1)  # the front process maps the same memory by its descriptor
    assert primary.reserve(60)
    assert not front.take(50) and front.held == 0  # 60 + 50 > 100: the front process gives it back
    assert front.take(40) and slots.view[1] == 40
    assert not primary.reserve(1) and primary.refused == 1
    front.release(40)
    assert primary.reserve(40) and primary.held == 100 and slots.others(0) == 0


def test_an_unshared_budget_counts_its_own_bytes_only() -> None:
    budget = admission.Budget(10)
    assert budget.take(10) and not budget.take(1)
    budget.release(10)
    assert budget.reserve(10)


def test_a_link_carries_messages_and_a_descriptor() -> None:
    ours, theirs = processes.make_link()
    carried, kept = socket.socketpair()
    try:
        processes.send(ours, ("c", 7), [carried.fileno()], wait=False)
        processes.send(ours, [("s", 1, 2, 3, 4.0, 5.0, 6.0), ("o",)])
        got = processes.receive(theirs)
        assert got is not None
        assert [message for message, _ in got] == [("c", 7), [("s", 1, 2, 3, 4.0, 5.0, 6.0), ("o",)]]
        assert len(got[0][1]) == 1 and got[1][1] == []
        fd = got[0][1][0]
        with socket.socket(fileno=fd) as received:  # the same connection, by another descriptor
            received.sendall(b"through")
            assert kept.recv(16) == b"through"
        assert processes.receive(theirs) == []  # nothing more waiting
        big = b"x" * (400 * 1024)  # a hand-back's bytes can be this large
        processes.send(ours, ("h", 1, big))
        assert processes.receive(theirs) == [(("h", 1, big), [])]
        ours.close()
        assert processes.receive(theirs) is None  # the other end is gone
    finally:
        for sock in (theirs, carried, kept):
            sock.close()


def test_a_turns_connections_go_in_one_message() -> None:
    ours, theirs = processes.make_link()
    pairs = [socket.socketpair() for _ in range(processes.MAX_FDS)]
    try:
        processes.send(ours, ("c", list(range(len(pairs))), [b""] * len(pairs)), [a.fileno() for a, _ in pairs])
        got = processes.receive(theirs)
        assert got is not None and len(got) == 1 and len(got[0][1]) == processes.MAX_FDS
        for fd, (_, other) in zip(got[0][1], pairs, strict=True):
            with socket.socket(fileno=fd) as received:
                received.sendall(b"!")
                assert other.recv(1) == b"!"
    finally:
        for a, b in pairs:
            a.close()
            b.close()
        ours.close()
        theirs.close()


def test_a_primary_that_cannot_send_now_is_told_at_once() -> None:
    ours, theirs = processes.make_link()
    try:
        with pytest.raises(BlockingIOError):
            for _ in range(100000):  # never read: the link fills
                processes.send(ours, ("s", "x" * 60000), wait=False)
    finally:
        ours.close()
        theirs.close()


@pytest.mark.parametrize(("ready", "count", "share"), [(256, 0, 256), (256, 1, 128), (256, 2, 86), (0, 1, 0),
                                                        (1, 3, 1)])
def test_each_process_opens_its_share_of_the_ready_connections(ready: int, count: int, share: int) -> None:
    assert processes.ready_share(ready, count) == share


@pytest.mark.parametrize(("raw", "cpus", "count", "warned"), [
    (None, 2, 1, False), (None, 64, 1, False), (None, 1, 0, False), ("", 4, 1, False), ("0", 8, 0, False),
    ("2", 1, 2, False), (" 1 ", 2, 1, False), ("two", 2, 1, True), ("-1", 1, 0, True), ("5000", 2, 1, True)])
def test_the_setting(raw: str | None, cpus: int, count: int, warned: bool) -> None:
    """Unset: one front process with two CPUs or more to run on; a bad value warns and takes that."""
    env = {} if raw is None else {processes.PROCESSES_VAR: raw}
    warnings: list[str] = []
    assert processes.count(env, warnings, cpus=cpus) == count
    assert bool(warnings) == warned and all(processes.PROCESSES_VAR in line for line in warnings)
    assert table.BY_NAME[processes.PROCESSES_VAR].default is None  # the CPUs decide (processes.default_count)


def test_each_engine_has_its_own_front_processes() -> None:
    """vLLM and SGLang (bursts of hundreds of streams): one front process with two CPUs or more;
    llama.cpp (a few streams at once, where the second process only adds ~2 ms to a single stream on
    a CPU engine) and a generic engine: none, unless asked."""
    from workers.llama.worker import DEFAULTS as LLAMA
    from workers.openai import generic
    from workers.sglang.worker import DEFAULTS as SGLANG
    from workers.vllm.worker import DEFAULTS as VLLM

    env = {"CONTAINER_ID": "5", "REPORT_ADDR": "http://127.0.0.1:9", "WORKER_PORT": "3000",
           "PUBLIC_IPADDR": "203.0.113.7", "VAST_TCP_PORT_3000": "41000", **baked_facts("vllm")}
    baked = {"BACKEND": "mine", "BAKERY_ENGINE_PROGRAM": "mine", "MODEL_LOG": "/var/log/mine.log",
             "MODEL_LOAD_LOG_MSG": '["up"]', "MODEL_ERROR_LOG_MSGS": '["down"]'}
    generic_defaults = generic.defaults_from_env({**env, **baked})
    assert (VLLM.front_processes, SGLANG.front_processes, LLAMA.front_processes,
            generic_defaults.front_processes) == (None, None, 0, 0)
    cpus = processes.default_count()
    for engine, expected in ((VLLM, cpus), (SGLANG, cpus), (LLAMA, 0), (generic_defaults, 0)):
        assert worker_config.load_settings(engine, env).front_processes == expected, engine.engine
    assert worker_config.load_settings(LLAMA, {**env, processes.PROCESSES_VAR: "1"}).front_processes == 1
    warnings: list[str] = []
    assert worker_config.front_processes({processes.PROCESSES_VAR: "1"}, "aiohttp", warnings) == 0
    assert warnings and "BAKERY_FRONT=wire" in warnings[0]


def test_a_front_process_ends_when_its_parent_is_gone() -> None:
    pid = os.fork()
    if pid == 0:  # the child: its parent is not the pid given, so it ends at once
        processes.die_with_parent(os.getppid() + 1_000_000)
        os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_front_process_serves_no_pair_of_a_key_the_primary_replaced() -> None:
    """The pairs a front process was sent hold only under the key generation they were sent with,
    read in shared memory per request: a new key is seen the moment the primary loads it."""
    slots = processes.Slots(2)
    state = front_process.State(processes.Slots(2, slots.fd))  # the front process's own mapping
    state.pairs, state.generation = frozenset({("http://w:1", "sig")}), slots.generation
    assert state.knows("http://w:1", "sig") and not state.knows("http://w:1", "other")
    slots.bump()  # Fleet.key_changed, in the step key rotation loads the new key
    assert not state.knows("http://w:1", "sig")
    state.generation = slots.generation  # the primary's next state: its pairs under the new key
    assert state.knows("http://w:1", "sig")


def test_key_rotation_tells_its_listeners_once_the_new_key_is_loaded() -> None:
    platform = signature.Trust(unsecured=False)
    platform.set_pubkey("old")
    ctx = guards.Context(sdk=None, limits=None, routes=(), http_port=0, report_addr="", platform=platform,
                         outcomes=None, check_signature=lambda _auth: False, call_engine=None)  # type: ignore[arg-type]
    seen: list[Any] = []
    ctx.key_changed.append(lambda: seen.append(platform.pubkey()))
    guards.new_key(ctx, "new")
    assert seen == ["new"] and platform.pubkey() == "new"


def bare_fleet(members: list[processes.Member]) -> processes.Fleet:
    """A Fleet with what its drain hold and state messages use (no SDK, no processes started)."""
    fleet = object.__new__(processes.Fleet)
    fleet.__dict__.update(members=members, drain=types.SimpleNamespace(draining=True), knows=lambda *_: False,
                          platform=types.SimpleNamespace(unsecured=False),
                          outcomes=types.SimpleNamespace(loaded=lambda: True, wait_time=lambda: 0.0),
                          slots=processes.Slots(len(members) + 1), state=None, unseen=set(), seen=None)
    return fleet


@pytest.mark.parametrize("told_by_the_tick", [False, True])
def test_the_drain_hold_ends_once_every_front_process_saw_the_drain(told_by_the_tick: bool) -> None:
    """The hold sends the drain's state and ends once each running front process answered or ended;
    one the 50 ms state tick told first (its answer already in) is not waited for again."""
    links = [processes.make_link() for _ in range(2)]
    first, second = (processes.Member(i + 1, types.SimpleNamespace(pid=0), ours, ready=True)
                     for i, (ours, _) in enumerate(links))
    fleet = bare_fleet([first, second])

    async def scenario() -> None:
        if told_by_the_tick:
            fleet._send_state()  # the tick ran before the drain's hold
            fleet._apply(first, ("drain seen",), None)
            fleet._apply(second, ("drain seen",), None)
            await asyncio.wait_for(fleet.hold(), 1)
            return
        held = asyncio.get_running_loop().create_task(fleet.hold())
        await asyncio.sleep(0.01)
        assert not held.done()
        for _, theirs in links:  # each was told: the state with the drain on
            [(message, _fds)] = processes.receive(theirs)
            assert message[0] == "s" and message[1][3] is True
        fleet._apply(first, ("drain seen",), None)
        await asyncio.sleep(0.01)
        assert not held.done()  # the second has not answered
        fleet._saw_drain(second)  # as _ended does for one that ended
        await asyncio.wait_for(held, 1)

    try:
        asyncio.run(scenario())
    finally:
        for pair in links:
            for sock in pair:
                sock.close()
