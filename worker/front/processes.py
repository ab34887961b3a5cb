"""Front processes: the wire front's work on more than one core, so a burst's first tokens wait less.

The primary accepts every connection (the cap counted in one place) and keeps all the platform sees: the SDK's
reports, the key, the memo, the drain. It passes connections (SCM_RIGHTS) to front processes, which serve
plain signed requests and give back any other with its bytes. See docs/serving.md, "Front processes".
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ctypes
import dataclasses
import logging
import marshal
import mmap
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from config import table

PROCESSES_VAR = "BAKERY_FRONT_PROCESSES"
STATE_EVERY = 0.05  # seconds between the primary's state messages (sent only when the state changed)
LINK_BUFFER = 4 * 1024 * 1024  # each link's socket buffers (a hand-back carries what was read: <= ~330 KiB)
MESSAGE_MAX = 1024 * 1024  # the largest message read
_BUFFER = bytearray(MESSAGE_MAX)
_VIEW = memoryview(_BUFFER)
_FD_SIZE = 4  # a descriptor in SCM_RIGHTS data: a C int
MAX_FDS = 64  # descriptors per message (connections given in one loop turn go together)
START_TIMEOUT = 60.0  # seconds a front process may take to say it is ready before it is stopped
RESTART_FIRST, RESTART_MAX = 1.0, 60.0  # the pause before a front process that ended is replaced
STEADY = 60.0  # a front process that ran this long after its ready is replaced after RESTART_FIRST
FAILED = "the worker's front process ended"  # the error reported for its requests in flight
PR_SET_PDEATHSIG = 1
WORKER_DIR = Path(__file__).resolve().parents[1]  # holds the worker's packages

# Messages, marshalled (data only: loading one runs no object's code, as unpickling can; both ends are
# this worker's own processes, over a socketpair the primary made):
# primary -> front: ("c", conn_ids, datas) with a descriptor each: connections to serve (the bytes read)
#                   ("s", state): pairs, unsecured, loaded, draining, wait_time
# front -> primary: ("ready",); ("drain seen",) once the first state with the drain on arrived, after
#                   every event before it (so every request it had taken is in the drain's count);
#                   a list of events:
#   ("i",) / ("o",)                            a request entered / left (the drain's count)
#   ("s", rid, idx, reqnum, workload, entered, started)  request_start
#   ("e", rid, kind, message)                  success | errored | canceled, then request_end
#   ("r", idx, reqnum, workload, entered)      request_reject
#   ("x", conn_id)                             a connection given to it is closed
#   ("h", conn_id, data) with a descriptor     a connection given back, with the bytes read

log = logging.getLogger("bakery.fronts")


def default_count(cpus: int | None = None) -> int:
    """BAKERY_FRONT_PROCESSES when unset: one front process when the worker may run on two CPUs or
    more (a second process pays only with a core to run on), else none."""
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 1 if cpus >= 2 else 0


def count(env: Any, warnings: list[str] | None = None, cpus: int | None = None, default: int | None = None) -> int:
    """BAKERY_FRONT_PROCESSES (table.VARIABLES), or `default` when unset or bad (None: default_count())."""
    fallback = default_count(cpus) if default is None else default
    return int(table.read(env, PROCESSES_VAR, warnings=warnings, default=fallback))


def ready_share(ready: int, processes: int) -> int:
    """Each process's share of BAKERY_ENGINE_READY_CONNECTIONS: the connections are given in turn, so
    each of the 1 + `processes` serves about as many of a burst's requests."""
    return -(-ready // (processes + 1)) if processes > 0 else ready


def die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when its parent (the primary) ends; exit at once when the
    parent is already gone."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the link's end tells the front process instead
        pass
    if os.getppid() != parent:
        os._exit(0)


class Slots:
    """Counters in shared memory: one per process (each writes its own, reads the sum of the others:
    the body bytes it holds), and the key's generation (the primary bumps it when the platform's key
    changes; a front process serves no pair it was sent under an older one)."""

    def __init__(self, size: int, fd: int | None = None) -> None:
        self.size = size
        self.fd = os.memfd_create("bakery-slots", 0) if fd is None else fd
        if fd is None:
            os.ftruncate(self.fd, 8 * (size + 1))
        self.map = mmap.mmap(self.fd, 8 * (size + 1))
        self.view = memoryview(self.map).cast("q")

    def others(self, mine: int) -> int:
        """The sum of every process's slot but `mine`."""
        view = self.view
        return sum(view[:self.size]) - view[mine]

    @property
    def generation(self) -> int:
        return self.view[self.size]

    def bump(self) -> None:
        """A new key: every pair sent before is stale from now on."""
        self.view[self.size] += 1


def send(link: socket.socket, message: Any, fds: list[int] | None = None, wait: bool = True) -> None:
    """One message on a link, with `fds` (at most MAX_FDS); with `wait` False, BlockingIOError rather
    than waiting for room (the primary never waits for a front process)."""
    data = marshal.dumps(message)
    flags = 0 if wait else socket.MSG_DONTWAIT
    if not fds:
        link.send(data, flags)
    else:
        socket.send_fds(link, [data], fds, flags)


def receive(link: socket.socket) -> list[tuple[Any, list[int]]] | None:
    """The messages waiting on a link, each with its descriptors; None when the other end is gone.
    Read into one buffer kept for the link's largest message (no allocation per message)."""
    got: list[tuple[Any, list[int]]] = []
    space = socket.CMSG_SPACE(MAX_FDS * _FD_SIZE)
    while True:
        try:
            size, ancillary, flags, _addr = link.recvmsg_into([_BUFFER], space, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return got
        except OSError:
            return got or None
        fds = [int.from_bytes(data[i:i + _FD_SIZE], sys.byteorder)
               for level, kind, data in ancillary if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
               for i in range(0, len(data) - len(data) % _FD_SIZE, _FD_SIZE)]
        if not size and not fds:
            return got or None
        if flags & socket.MSG_TRUNC:  # larger than any message this code sends: not ours to read
            for fd in fds:
                os.close(fd)
            continue
        got.append((marshal.loads(_VIEW[:size]), fds))  # noqa: S302 - see Messages above


def make_link() -> tuple[socket.socket, socket.socket]:
    """A socketpair of datagram-like messages with large buffers."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for end in (ours, theirs):
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            end.setsockopt(socket.SOL_SOCKET, option, LINK_BUFFER)
    return ours, theirs


@dataclass
class Member:
    """One front process, as the primary sees it."""

    index: int
    process: subprocess.Popen[bytes]
    link: socket.socket
    ready: bool = False
    alive: bool = True
    given: set[int] = field(default_factory=set)  # ids of connections it holds
    in_flight: int = 0  # its requests in the drain's count
    started: dict[int, Any] = field(default_factory=dict)  # rid -> the SDK's RequestMetrics
    pending: list[Any] = field(default_factory=list)  # wire.Delegate: connections to send it this turn
    served: int = 0
    pause: float = RESTART_FIRST  # before the process that replaces this one, should it end
    ready_at: float | None = None  # loop time it said it was ready
    saw_drain: bool = False  # it said it saw the drain: every request it took is in the drain's count


class Fleet:
    """The primary's side: starts the front processes, gives them connections, applies what they
    send (see the module's docstring)."""

    def __init__(self, processes: int, defaults: Any, platform: Any, outcomes: Any, drain: Any,
                 knows: Callable[[str, str], bool], slots: Slots, released: Callable[[], None],
                 argv_python: str = sys.executable) -> None:
        self.processes = processes
        self.released = released  # a connection given to a front process is closed (the cap's count)
        self.defaults = defaults
        self.platform = platform  # signature.Trust: UNSECURED, for the front processes
        self.outcomes = outcomes  # sdk_seam.Outcomes: where the front processes' outcomes are reported
        self.drain = drain
        self.knows = knows
        self.slots = slots
        self.python = argv_python
        self.members: list[Member] = []
        self.turn = 0
        self.next_id = 0
        self.state: Any = None
        self.take_back: Callable[[socket.socket, bytes], None] | None = None  # wire: a connection given back
        self._timer: asyncio.TimerHandle | None = None
        self.restarted = 0  # front processes started in place of one that ended
        self.unseen: set[int] = set()  # indexes of front processes yet to say they saw the drain
        self.seen: asyncio.Future[None] | None = None  # done once `unseen` is empty
        self.served_before = 0  # requests served by front processes that ended

    # -- starting

    def start(self) -> None:
        """Start the front processes (from the primary's loop, once the server starts)."""
        if self.members:
            return
        self.members = [self._spawn(index) for index in range(1, self.processes + 1)]
        self._timer = asyncio.get_running_loop().call_later(STATE_EVERY, self._tick)

    def _spawn(self, index: int, pause: float = RESTART_FIRST) -> Member:
        """Start front process `index` and watch its link."""
        loop = asyncio.get_running_loop()
        encoded = base64.b64encode(marshal.dumps(dataclasses.astuple(self.defaults))).decode("ascii")
        env = {**table.snapshot()}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(WORKER_DIR), env.get("PYTHONPATH", "")) if p)
        ours, theirs = make_link()
        process = subprocess.Popen(
            [self.python, "-m", "app.front_process", encoded, str(theirs.fileno()),
             str(self.slots.fd), str(index), str(self.processes + 1), str(os.getpid())],
            env=env, pass_fds=(theirs.fileno(), self.slots.fd), stdin=subprocess.DEVNULL)
        theirs.close()
        member = Member(index, process, ours, pause=pause)
        loop.add_reader(ours.fileno(), self._readable, member)
        loop.call_later(START_TIMEOUT, self._late, member)
        return member

    def _replace(self, member: Member) -> None:
        """Start a front process in place of `member`, which ended (not while draining)."""
        if self.drain.draining or member not in self.members:
            return
        # Should this one end soon too, the pause before the next doubles (a crash loop costs little).
        self.members[self.members.index(member)] = self._spawn(member.index, min(RESTART_MAX, member.pause * 2))
        self.restarted += 1
        self.served_before += member.served
        _say(f"bakery-worker: front process {member.index} started again in place of the one that ended")

    def _late(self, member: Member) -> None:
        if member.alive and not member.ready:
            _say(f"bakery-worker: warning: front process {member.index} did not start within "
                 f"{START_TIMEOUT:g} s; stopped, the worker serves without it")
            member.process.kill()

    # -- giving connections

    def pick(self) -> Member | None:
        """The member the next connection goes to, or None (the primary keeps it): round robin over
        the primary and the front processes that are ready; none while draining."""
        if self.drain.draining:
            return None
        ready = [m for m in self.members if m.ready and m.alive]
        if not ready:
            return None
        self.turn = (self.turn + 1) % (len(ready) + 1)
        return None if self.turn == 0 else ready[self.turn - 1]

    def give(self, member: Member, delegate: Any) -> None:
        """Send `delegate`'s connection (wire.Delegate) to `member` at the end of this loop turn, with the
        others given it in the turn (one message)."""
        if not member.pending:
            asyncio.get_running_loop().call_soon(self._send_given, member)
        member.pending.append(delegate)

    def _send_given(self, member: Member) -> None:
        pending, member.pending = member.pending, []
        for _ in [d for d in pending if d.lost]:  # the client left before it went
            self.released()
        pending = [d for d in pending if not d.lost]
        for start in range(0, len(pending), MAX_FDS):
            batch = pending[start:start + MAX_FDS]
            ids = list(range(self.next_id + 1, self.next_id + 1 + len(batch)))
            self.next_id += len(batch)
            try:
                if not member.alive:
                    raise OSError("the front process ended")
                send(member.link, ("c", ids, [d.data for d in batch]), [d.fd for d in batch], wait=False)
            except OSError:
                for delegate in batch:
                    delegate.keep()  # served here
                continue
            member.given.update(ids)
            for delegate in batch:
                delegate.sent()

    # -- what the front processes send

    def _readable(self, member: Member) -> None:
        messages = receive(member.link)
        if messages is None:
            self._ended(member)
            return
        for message, fds in messages:
            try:
                self._apply(member, message, fds[0] if fds else None)
                for extra in fds[1:]:
                    os.close(extra)
            except Exception:  # one bad message must not stop the link
                log.exception("bakery-worker: a front process's message could not be applied")

    def _apply(self, member: Member, message: Any, fd: int | None) -> None:
        if isinstance(message, tuple):
            if message[0] == "ready":
                member.ready = True
                member.ready_at = asyncio.get_running_loop().time()
                _say(f"bakery-worker: front process {member.index} (pid {member.process.pid}) ready")
                self._send_state(force=True)
            elif message[0] == "h":
                self._given_back(member, message[1], message[2], fd)
            elif message[0] == "drain seen":
                self._saw_drain(member)
            return
        for event in message:
            self._event(member, event)

    def _event(self, member: Member, event: tuple[Any, ...]) -> None:
        kind = event[0]
        if kind == "s":
            _, rid, idx, reqnum, workload, entered, started = event
            metrics = self.outcomes.new(idx, reqnum, workload, entered)
            metrics.work_started_at = started
            member.started[rid] = metrics
            member.served += 1
            self.outcomes.start(metrics)
        elif kind == "e":
            _, rid, how, text = event
            metrics = member.started.pop(rid, None)
            if metrics is None:
                return
            self._end(metrics, how, text)
        elif kind == "i":
            member.in_flight += 1
            self.drain.enter()
        elif kind == "o":
            member.in_flight -= 1
            self.drain.leave(None)
        elif kind == "r":
            _, idx, reqnum, workload, entered = event
            self.outcomes.reject(self.outcomes.new(idx, reqnum, workload, entered))
        elif kind == "x":
            self._closed(member, event[1])

    def _end(self, metrics: Any, how: str, text: str) -> None:
        if how == "success":
            self.outcomes.success(metrics)
        elif how == "canceled":
            self.outcomes.canceled(metrics)
        else:
            self.outcomes.errored(metrics, text)
        self.outcomes.end(metrics)

    def _closed(self, member: Member, conn_id: int) -> None:
        if conn_id in member.given:
            member.given.discard(conn_id)
            self.released()

    def _given_back(self, member: Member, conn_id: int, data: bytes, fd: int | None) -> None:
        self._closed(member, conn_id)
        if fd is None:
            return
        sock = socket.socket(fileno=fd)
        if self.take_back is None:
            sock.close()
            return
        self.take_back(sock, data)

    def _ended(self, member: Member) -> None:
        """A front process ended (its link closed): say so, fail its requests, serve without it."""
        if not member.alive:
            return
        member.alive = False
        with contextlib.suppress(RuntimeError, ValueError):
            asyncio.get_running_loop().remove_reader(member.link.fileno())
        member.link.close()
        code = member.process.poll()
        if code is None:
            try:
                code = member.process.wait(1.0)
            except subprocess.TimeoutExpired:
                code = None
        how = ("still running" if code is None else f"exit status {code}" if code >= 0
               else f"killed by signal {-code}")
        lost = len(member.started)
        # One that never became ready would fail again the same way (_late says why it stopped).
        again = member.ready and not self.drain.draining
        if again:
            ran = asyncio.get_running_loop().time() - (member.ready_at or 0.0)
            member.pause = member.pause if ran < STEADY else RESTART_FIRST
            asyncio.get_running_loop().call_later(member.pause, self._replace, member)
        if not self.drain.draining or lost:
            then = f"until a new one starts in {member.pause:g} s" if again else "from now on"
            _say(f"bakery-worker: warning: front process {member.index} ended ({how}); {lost} request(s) it "
                 f"was serving failed, {len(member.given)} connection(s) it held closed; the worker serves "
                 f"without it {then}")
        for metrics in member.started.values():
            self._end(metrics, "errored", FAILED)
        member.started.clear()
        for _ in range(member.in_flight):
            self.drain.leave(None)
        member.in_flight = 0
        for _ in range(len(member.given)):
            self.released()
        member.given.clear()
        self.slots.view[member.index] = 0  # its bodies are gone with it
        self._saw_drain(member)  # nothing of it is left to count

    # -- the state the front processes judge requests by

    def current(self) -> tuple[Any, ...]:
        pairs = getattr(self.knows, "pairs", None)
        return (tuple(pairs()) if pairs is not None else (), self.platform.unsecured, self.outcomes.loaded(),
                bool(self.drain.draining), round(self.outcomes.wait_time(), 0), self.slots.generation)

    def key_changed(self) -> None:
        """The platform's key changed (key_rotation): no front process serves a pair of the old one
        from now on (the shared generation, read per request), and the new state goes out at once."""
        self.slots.bump()
        self._send_state()

    def _send_state(self, force: bool = False) -> None:
        state = self.current()
        if state == self.state and not force:
            return
        self.state = state
        for member in self.members:
            if member.ready and member.alive:
                try:
                    send(member.link, ("s", state), wait=False)
                except OSError:
                    self.state = None  # sent again at the next tick (its end, if it ended, is read by _readable)

    def _tick(self) -> None:
        self._send_state()
        self._timer = asyncio.get_running_loop().call_later(STATE_EVERY, self._tick)

    async def hold(self) -> None:
        """The drain's hold: tell every running front process that the drain began and wait until each
        says it saw it (or ended). A request a front process took a moment ago is in the drain's count
        only once its entry arrived, a few ms later; its answer comes after every such entry."""
        # The state tick may have told some already (their answer may be in): those are not waited for.
        self.unseen = {m.index for m in self.members if m.ready and m.alive and not m.saw_drain}
        if not self.unseen:
            return
        self.seen = asyncio.get_running_loop().create_future()
        self._send_state()
        await self.seen  # the drain's time bounds it

    def _saw_drain(self, member: Member) -> None:
        member.saw_drain = True
        self.unseen.discard(member.index)
        if not self.unseen and self.seen is not None and not self.seen.done():
            self.seen.set_result(None)

    def draining(self) -> str:
        """Tell the front processes at once that the drain began (a drain note: its line)."""
        self._send_state()
        served = self.served_before + sum(m.served for m in self.members)
        alive = sum(1 for m in self.members if m.alive and m.ready)
        again = f"; {self.restarted} started again in place of one that ended" if self.restarted else ""
        return (f"bakery-worker: front processes: {alive} of {len(self.members)} running, {served} request(s) "
                f"served by them; told to drain{again}")

    def describe(self) -> str:
        """The startup line."""
        return (f"bakery-worker: front processes: {self.processes} ({PROCESSES_VAR}), each serving the plain "
                "signed requests of the connections the worker gives it; the rest come back to the worker")


def _say(message: str) -> None:
    sys.stdout.write(message + "\n")
    sys.stdout.flush()

