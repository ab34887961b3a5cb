"""The streamed body's relay in C: bakery-relay (worker/relay/bakery_relay.c) moves it after the head.

The helper does a stream's recv and send from an epoll loop in C, so its events cost no Python. Only a chunked
answer to a plain client socket with nothing unsent is handed; the rest goes to forward.relay. The outcome is
the answer's own, so the accounting and the drain see no difference. See docs/serving.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import struct
import subprocess
from pathlib import Path
from typing import Any

NATIVE, PYTHON = "native", "python"
CHOICES = (NATIVE, PYTHON)
DEFAULT = NATIVE
DEFAULT_PROGRAM = Path(__file__).resolve().parents[1] / "relay" / "bakery-relay"
# Outcomes of bakery_relay.c (its OUT_* values).
END, END_EXTRA, ENGINE_EOF, ENGINE_ERR, MALFORMED, CLIENT_GONE, IDLE, ABORTED, REFUSED, CLIENT_STALLED = range(10)
_START = struct.Struct("<cIII")  # id, idle ms, send ms; then the head, if any
_DONE = struct.Struct("<IHHQ")  # id, outcome, flags, body bytes moved
HEAD_WRITTEN = 1  # a done message's flag: the start's head reached the client
HEAD_MAX = 16384  # bakery_relay.c's bound on a head handed with a stream
REAP_TRIES, REAP_STEP = 50, 0.1  # a helper gone is collected within 5 s of its socket closing
log = logging.getLogger("bakery.relay")

ACTIVE: Relay | None = None  # the worker's helper, once started (forward.relay reads it)


class Relay:
    """One bakery-relay process and the streams handed to it."""

    def __init__(self, program: Path) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process = subprocess.Popen([str(program), str(theirs.fileno())], pass_fds=[theirs.fileno()],
                                        stdin=subprocess.DEVNULL, close_fds=True)
        theirs.close()
        ours.setblocking(False)
        self.sock = ours
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future[tuple[int, int, int]]] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.dead = False
        self.handed = 0
        self.send_timeout = 0.0  # seconds a pending client write may take no byte (BAKERY_SEND_TIMEOUT)

    def describe(self) -> str:
        return f"bakery-worker: relay: {self.handed} stream(s) relayed by bakery-relay (pid {self.process.pid})"

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        loop.add_reader(self.sock.fileno(), self._replies)

    def _replies(self) -> None:
        while True:
            try:
                data = self.sock.recv(64)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._died()
                return
            if len(data) != _DONE.size:
                continue
            ident, outcome, flags, moved = _DONE.unpack(data)
            future = self.waiting.pop(ident, None)
            if future is not None and not future.done():
                future.set_result((outcome, flags, moved))

    def _died(self) -> None:
        if self.dead:
            return
        self.dead = True
        if self.loop is not None:
            self.loop.remove_reader(self.sock.fileno())
        self.sock.close()  # the helper's end is gone: nothing more comes or goes on it
        log.warning("bakery-worker: warning: bakery-relay (pid %s) is gone (%s): %d stream(s) in it end, the "
                    "next are relayed in Python", self.process.pid, self._reap(), len(self.waiting))
        for future in self.waiting.values():
            if not future.done():
                future.set_result((ENGINE_ERR, 0, 0))
        self.waiting.clear()

    def _reap(self, tries: int = REAP_TRIES) -> str:
        """Collect the helper's exit (else it stays a zombie until the worker exits) and say how it
        ended. Its control socket closes as it exits, a moment before the exit can be collected, so
        a helper not yet collected is looked at again from the loop, REAP_TRIES times at most."""
        code = self.process.poll()
        if code is None:
            if tries > 1 and self.loop is not None and not self.loop.is_closed():
                self.loop.call_later(REAP_STEP, self._reap, tries - 1)
            return "its exit not collected yet"
        return f"killed by signal {-code}" if code < 0 else f"exit status {code}"

    def start(self, client_fd: int, engine_fd: int, idle: float,
              head: bytes = b"") -> tuple[int, asyncio.Future[tuple[int, int, int]]] | None:
        """Hand one stream over, with the answer's `head` when the client has not had it yet; (id, the
        future of its (outcome, flags, body bytes)) or None if not taken."""
        if self.dead or len(head) > HEAD_MAX:
            return None
        loop = asyncio.get_running_loop()
        if self.loop is not loop:
            self._watch(loop)
        ident = next(self.ids) & 0xFFFFFFFF
        idle_ms, send_ms = (min(int(seconds * 1000), 0xFFFFFFFF) if seconds else 0
                            for seconds in (idle, self.send_timeout))
        try:
            socket.send_fds(self.sock, [_START.pack(b"S", ident, idle_ms, send_ms) + head], [client_fd, engine_fd])
        except BlockingIOError:
            return None
        except OSError:
            self._died()
            return None
        future: asyncio.Future[tuple[int, int, int]] = loop.create_future()
        self.waiting[ident] = future
        self.handed += 1
        return ident, future

    def abort(self, ident: int) -> None:
        """End a handed stream (its request ended first): the helper writes no more of it."""
        self.waiting.pop(ident, None)
        if not self.dead:
            with contextlib.suppress(OSError):
                self.sock.send(struct.pack("<cI", b"A", ident))

    def close(self) -> None:
        self.sock.close()  # the helper exits when its end reads EOF


def socket_fd(transport: Any) -> int | None:
    """The file descriptor of a plain TCP transport's socket; None for TLS or no socket."""
    if transport is None or transport.is_closing() or transport.get_extra_info("ssl_object") is not None:
        return None
    sock = transport.get_extra_info("socket")
    fd = sock.fileno() if sock is not None else -1
    return fd if fd >= 0 else None


def install(choice: str, program: str | None, send_timeout: float) -> tuple[str, str | None]:
    """Start the helper when `choice` is native, ending a stream whose client takes no byte of a
    pending write for `send_timeout` seconds; (what relays streams, a warning or None)."""
    global ACTIVE  # noqa: PLW0603 - one helper per worker process, read by forward.relay
    if choice != NATIVE:
        return "Python (BAKERY_RELAY=python)", None
    path = Path(program) if program else DEFAULT_PROGRAM
    if not os.access(path, os.X_OK):
        return "Python", (f"no bakery-relay program at {path} (BAKERY_RELAY_PROGRAM): streamed bodies are "
                          "relayed in Python")
    try:
        ACTIVE = Relay(path)
        ACTIVE.send_timeout = send_timeout
    except OSError as exc:
        return "Python", f"bakery-relay at {path} did not start ({exc}): streamed bodies are relayed in Python"
    return f"bakery-relay ({path}, pid {ACTIVE.process.pid})", None
