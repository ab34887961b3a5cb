"""bakery-relay (worker/relay/bakery_relay.c) on its own: the bytes a client gets and the outcome the
worker is told, for every way a streamed body can end, and at every cut of the engine's bytes.

The program is driven as native_relay.py drives it (a SOCK_SEQPACKET control socket, the two sockets
passed with SCM_RIGHTS); the engine and the client are this test's ends of two socket pairs. Every
test runs on the shipped build and on one with AddressSanitizer and UndefinedBehaviorSanitizer, which
ends the program at the first finding (the relay's fuzz harness is tests/worker/test_relay_fuzz.py).
The worker on both relays is held to the same answers in test_native_relay_worker.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bakery.host.relay import sanitized_relay
from engine import native_relay
from tests.worker.helpers import relay_program_path

START, ABORT, DONE = struct.Struct("<cIII"), struct.Struct("<cI"), struct.Struct("<IHHQ")
HEAD_WRITTEN, HEAD_MAX = 1, 16384
END, END_EXTRA, ENGINE_EOF, ENGINE_ERR, MALFORMED, CLIENT_GONE, IDLE, ABORTED, REFUSED, STALLED = range(10)
SMALL_BUFFER = 4096  # a client socket's send room (the kernel doubles it): a write that it cannot take whole


class Helper:
    def __init__(self, program: Path) -> None:
        self.ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen([str(program), str(theirs.fileno())], pass_fds=[theirs.fileno()])
        theirs.close()
        self.ctl.settimeout(10)
        self.next_id = 0
        self.flags = -1  # of the last done message

    def stream(self, idle_ms: int = 0, keep: list[socket.socket] | None = None,
               head: bytes = b"", send_ms: int = 0, small: bool = False) -> tuple[int, socket.socket, socket.socket]:
        """(id, engine end, client end) of a new stream handed to the helper, with the answer's `head`
        for it to write first; `keep` gets the worker's own end of the engine connection (else it is
        closed, as if the worker had dropped it); `small`: the client's socket takes little at once."""
        engine_ours, engine_theirs = socket.socketpair()
        client_ours, client_theirs = socket.socketpair()
        if small:
            client_theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUFFER)
        self.next_id += 1
        socket.send_fds(self.ctl, [START.pack(b"S", self.next_id, idle_ms, send_ms) + head],
                        [client_theirs.fileno(), engine_theirs.fileno()])
        if keep is None:
            engine_theirs.close()
        else:
            keep.append(engine_theirs)
        client_theirs.close()
        engine_ours.settimeout(10)
        client_ours.settimeout(10)
        return self.next_id, engine_ours, client_ours

    def done(self) -> tuple[int, int, int]:
        """(id, outcome, body bytes) of the next done message; its flags are kept in `flags`."""
        ident, outcome, self.flags, moved = DONE.unpack(self.ctl.recv(64))
        return ident, outcome, moved

    def close(self) -> None:
        self.ctl.close()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module", params=["shipped", "sanitized"])
def helper(request: pytest.FixtureRequest) -> Iterator[Helper]:
    made = Helper(relay_program_path() if request.param == "shipped" else sanitized_relay())
    yield made
    made.close()
    assert made.proc.returncode == 0  # it exits by itself when the worker's end closes (a finding: 1)


def read_until_closed(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


EVENTS = [b'data: {"id": %d, "text": "tok"}\n\n' % i for i in range(5)]
BODY = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in EVENTS)


def test_whole_chunks_pass_as_they_came_and_the_last_chunk_is_left_to_the_worker(helper: Helper) -> None:
    kept: list[socket.socket] = []
    ident, engine, client = helper.stream(keep=kept)
    engine.sendall(BODY + b"0\r\n\r\n")
    assert helper.done() == (ident, END, sum(map(len, EVENTS)))
    assert read_until_closed(client) == BODY  # no last chunk: the worker writes it
    engine.sendall(b"HTTP/1.1 200 OK\r\n")  # the next answer: the connection is the worker's again
    kept[0].settimeout(10)
    assert kept[0].recv(64) == b"HTTP/1.1 200 OK\r\n"


@pytest.mark.parametrize("cut", range(1, len(BODY) + 6, 3))
def test_every_cut_of_the_engine_bytes_gives_the_same_body(helper: Helper, cut: int) -> None:
    ident, engine, client = helper.stream()
    data = BODY + b"0\r\n\r\n"
    engine.sendall(data[:cut])
    time.sleep(0.01)  # two reads for the helper
    engine.sendall(data[cut:])
    assert helper.done() == (ident, END, sum(map(len, EVENTS)))
    assert read_until_closed(client) == BODY


def test_an_extension_or_trailer_is_not_passed_on(helper: Helper) -> None:
    ident, engine, client = helper.stream()
    engine.sendall(b"5;name=x\r\nhello\r\n 3 \r\nabc\r\n0\r\nTrailer: x\r\n\r\n")
    assert helper.done() == (ident, END, 8)
    assert read_until_closed(client) == b"5\r\nhello\r\n3\r\nabc\r\n"


def test_bytes_after_the_answer_are_reported(helper: Helper) -> None:
    ident, engine, client = helper.stream()
    engine.sendall(b"3\r\nabc\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n")
    assert helper.done() == (ident, END_EXTRA, 3)
    assert read_until_closed(client) == b"3\r\nabc\r\n"


def test_an_engine_closing_mid_body_is_reported_after_what_came(helper: Helper) -> None:
    ident, engine, client = helper.stream()
    engine.sendall(b"3\r\nabc\r\n5\r\nhe")
    engine.close()
    assert helper.done() == (ident, ENGINE_EOF, 5)
    assert read_until_closed(client) == b"3\r\nabc\r\n5\r\nhe"


@pytest.mark.parametrize("broken", [b"zz\r\nabc\r\n", b"3\r\nabcXY", b"1234567890abcdef0\r\n", b"9" * 5000])
def test_a_broken_framing_is_reported(helper: Helper, broken: bytes) -> None:
    ident, engine, client = helper.stream()
    engine.sendall(broken)
    outcome = helper.done()
    assert outcome[:2] == (ident, MALFORMED)
    client.settimeout(10)
    assert b"XY" not in read_until_closed(client)


def test_an_idle_engine_ends_the_stream(helper: Helper) -> None:
    ident, engine, client = helper.stream(idle_ms=300)
    engine.sendall(b"3\r\nabc\r\n")
    started = time.monotonic()
    assert helper.done() == (ident, IDLE, 3)
    assert 0.2 < time.monotonic() - started < 5
    assert read_until_closed(client) == b"3\r\nabc\r\n"


def test_a_client_gone_is_reported(helper: Helper) -> None:
    ident, engine, client = helper.stream()
    client.close()
    engine.sendall(b"3\r\nabc\r\n")
    assert helper.done() == (ident, CLIENT_GONE, 3)


def test_an_abort_ends_a_stream_and_others_go_on(helper: Helper) -> None:
    first, _engine1, client1 = helper.stream()
    second, engine2, client2 = helper.stream()
    helper.ctl.send(ABORT.pack(b"A", first))
    assert helper.done() == (first, ABORTED, 0)
    assert read_until_closed(client1) == b""
    engine2.sendall(b"3\r\nabc\r\n0\r\n\r\n")
    assert helper.done() == (second, END, 3)
    assert read_until_closed(client2) == b"3\r\nabc\r\n"


def test_a_slow_client_holds_the_engine_back_and_loses_nothing(helper: Helper) -> None:
    ident, engine, client = helper.stream()
    piece = b"x" * 60000
    chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
    unit = chunk * 4
    sent = 0
    engine.setblocking(False)
    # The client reads nothing: the helper must stop reading the engine, so the engine's sends block.
    # A send may take part of what it is given: each one goes on where the last one stopped.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            sent += engine.send(unit[sent % len(unit):] + unit)
        except BlockingIOError:
            break
    assert time.monotonic() < deadline, "the engine was read without bound while the client took nothing"
    engine.setblocking(True)
    engine.settimeout(10)
    # The rest of the unit the last send stopped in, then the body's end.
    writer = threading.Thread(target=engine.sendall, args=(unit[sent % len(unit):] + b"0\r\n\r\n",))
    writer.start()
    received = read_until_closed(client)
    writer.join(10)
    outcome = helper.done()
    assert outcome[:2] == (ident, END)
    assert sent > 0
    assert received == unit * (sent // len(unit) + 1)


def test_a_client_that_takes_nothing_is_ended_at_the_idle_limit(helper: Helper) -> None:
    """The engine's reads stop for a client that reads nothing; the idle limit still counts from the
    last engine read (the worker's Python relay ends such a stream at its idle timeout too)."""
    ident, engine, client = helper.stream(idle_ms=300)
    piece = b"x" * 60000
    unit = b"%x\r\n%s\r\n" % (len(piece), piece)
    sent = 0
    engine.setblocking(False)
    started = time.monotonic()
    # The engine keeps writing (its sends block once the helper stopped reading) until the helper
    # ends the stream and closes its end, or 5 s passed.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        while time.monotonic() - started < 5:
            try:
                sent += engine.send(unit[sent % len(unit):] + unit)
            except BlockingIOError:
                time.sleep(0.01)
    assert time.monotonic() - started < 5, "a stream whose client took nothing was not ended"
    assert helper.done()[:2] == (ident, IDLE)
    assert 0 < len(read_until_closed(client)) < sent  # what it had room for, then the cut


def test_one_byte_chunks_with_bare_lf_size_lines_fit_the_output_room(helper: Helper) -> None:
    """A size line ending in a bare LF is written with CRLF: one byte more than came. A read of
    13,000 one-byte chunks so framed grows by a fifth; it once wrote ~9 KB past the output room
    (the sanitized build died of it, the shipped one overwrote its next buffer)."""
    ident, engine, client = helper.stream()
    count = 13000
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(read_until_closed(client)))
    reader.start()
    engine.sendall(b"1\nX\r\n" * count + b"0\r\n\r\n")
    assert helper.done() == (ident, END, count)
    reader.join(10)
    assert received == [b"1\r\nX\r\n" * count]


def fill_engine(engine: socket.socket, unit: bytes, seconds: float = 5) -> int:
    """Send `unit` over and over until the engine's sends block (the helper stopped reading it) or the
    stream ended; the bytes sent."""
    sent = 0
    engine.setblocking(False)
    started = time.monotonic()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        while time.monotonic() - started < seconds:
            try:
                sent += engine.send(unit[sent % len(unit):] + unit)
            except BlockingIOError:
                break
    engine.setblocking(True)
    return sent


def test_a_client_that_takes_nothing_after_the_engine_ended_is_ended_at_the_send_limit(helper: Helper) -> None:
    """The body's end is read while a client write is pending, and the client never reads again: the
    idle limit no longer applies (the engine is done), the send limit does, in that state too."""
    ident, engine, client = helper.stream(idle_ms=300, send_ms=300, small=True)
    piece = b"x" * 60000
    engine.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(piece), piece))
    started = time.monotonic()
    outcome = helper.done()
    assert outcome[:2] == (ident, STALLED), outcome
    assert 0.2 < time.monotonic() - started < 5
    assert 0 < len(read_until_closed(client)) < len(piece)  # what it had room for, then the cut


def test_a_client_that_takes_nothing_mid_body_is_ended_at_the_send_limit(helper: Helper) -> None:
    ident, engine, client = helper.stream(send_ms=300, small=True)  # no idle limit: the send one ends it
    piece = b"x" * 60000
    sent = fill_engine(engine, b"%x\r\n%s\r\n" % (len(piece), piece))
    outcome = helper.done()
    assert outcome[:2] == (ident, STALLED), outcome
    assert 0 < len(read_until_closed(client)) < sent  # what it had room for, then the cut


def test_a_slow_client_is_not_ended_while_it_takes_bytes(helper: Helper) -> None:
    """The send limit counts from the last byte a client took, not from when the write began."""
    ident, engine, client = helper.stream(send_ms=400, small=True)
    piece = b"y" * 30000
    body = b"%x\r\n%s\r\n" % (len(piece), piece) * 4
    writer = threading.Thread(target=engine.sendall, args=(body + b"0\r\n\r\n",))
    writer.start()
    received = b""
    client.settimeout(10)
    while len(received) < len(body):  # ~3 s in all: far past the send limit, a little at a time
        time.sleep(0.1)
        received += client.recv(4096)
    writer.join(10)
    assert helper.done() == (ident, END, 4 * len(piece))
    assert received == body


def test_an_engine_ending_while_a_client_write_is_pending_loses_and_reorders_nothing(helper: Helper) -> None:
    """The engine sends more and closes while the client takes nothing: the engine's hang-up must not
    read (and write) its last bytes ahead of the pending ones."""
    ident, engine, client = helper.stream(small=True)
    pieces = [bytes([65 + i % 26]) * 20000 for i in range(8)]
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
    engine.sendall(body)
    engine.close()  # a hang-up now, with bytes still unread behind the pending write
    time.sleep(0.3)  # the helper sees the hang-up while the client has not read
    received = read_until_closed(client)
    assert helper.done() == (ident, ENGINE_EOF, sum(map(len, pieces)))
    assert received == body


def test_a_bad_message_is_refused_and_closes_what_it_carried(helper: Helper) -> None:
    ours, theirs = socket.socketpair()
    socket.send_fds(helper.ctl, [b"S"], [theirs.fileno()])
    theirs.close()
    assert helper.done()[1] == REFUSED
    ours.settimeout(10)
    assert ours.recv(1) == b""  # its descriptor was closed there


# --------------------------------------------------------------------------- a stream handed with its head

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize("cut", [0, 1, 3, 7, len(BODY) // 2, len(BODY) - 1])
def test_a_head_goes_first_with_the_body_at_every_cut(helper: Helper, cut: int) -> None:
    ident, engine, client = helper.stream(head=HEAD)
    whole = BODY + b"0\r\n\r\n"
    for piece in (whole[:cut], whole[cut:]):
        if piece:
            engine.sendall(piece)
            time.sleep(0.01)
    assert helper.done() == (ident, END, sum(len(e) for e in EVENTS))
    assert helper.flags == HEAD_WRITTEN
    assert read_until_closed(client) == HEAD + BODY


def test_a_head_is_written_alone_at_an_empty_bodys_end(helper: Helper) -> None:
    ident, engine, client = helper.stream(head=HEAD)
    engine.sendall(b"0\r\n\r\n")
    assert helper.done() == (ident, END, 0)
    assert helper.flags == HEAD_WRITTEN
    assert read_until_closed(client) == HEAD


@pytest.mark.parametrize("failure", ["engine closes", "broken framing", "idle", "abort"])
def test_a_body_failing_before_its_first_byte_leaves_the_head_unwritten(helper: Helper, failure: str) -> None:
    """The worker then answers with an error itself: the client must not have had the head."""
    ident, engine, client = helper.stream(head=HEAD, idle_ms=200 if failure == "idle" else 0)
    if failure == "engine closes":
        engine.close()
    elif failure == "broken framing":
        engine.sendall(b"zz\r\n" + BODY)
    elif failure == "abort":
        helper.ctl.send(ABORT.pack(b"A", ident))
    expected = {"engine closes": ENGINE_EOF, "broken framing": MALFORMED, "idle": IDLE, "abort": ABORTED}
    assert helper.done() == (ident, expected[failure], 0)
    assert helper.flags == 0
    assert read_until_closed(client) == b""


def test_a_body_failing_after_its_head_went_is_cut_there(helper: Helper) -> None:
    ident, engine, client = helper.stream(head=HEAD)
    engine.sendall(BODY)
    assert client.recv(len(HEAD)) == HEAD
    engine.close()
    assert helper.done() == (ident, ENGINE_EOF, sum(len(e) for e in EVENTS))
    assert helper.flags == HEAD_WRITTEN
    assert HEAD[len(HEAD):] + read_until_closed(client) == BODY


def test_a_head_over_the_bound_is_refused(helper: Helper) -> None:
    ident, engine, client = helper.stream(head=b"x" * (HEAD_MAX + 1))
    assert helper.done() == (ident, REFUSED, 0)
    assert read_until_closed(client) == b""  # both its descriptors were closed there
    assert engine.recv(1) == b""


def test_a_helper_that_exits_is_collected_and_its_end_said(caplog: pytest.LogCaptureFixture) -> None:
    """native_relay.Relay, as the worker runs it, on a program that exits at once with status 3: the
    worker sees its socket close, says how it ended, and collects its exit (no zombie is left)."""

    async def run(program: Path) -> native_relay.Relay:
        relay = native_relay.Relay(program)
        relay._watch(asyncio.get_running_loop())  # as the first start() does
        for _ in range(100):
            if relay.dead and relay.process.returncode is not None:
                break
            await asyncio.sleep(0.05)
        return relay

    script = Path(__file__).parent / "exit_3.sh"
    with caplog.at_level(logging.WARNING, logger="bakery.relay"):
        relay = asyncio.run(run(script))
    assert relay.dead
    assert relay.process.returncode == 3  # collected: poll() took its exit status
    gone = [r.getMessage() for r in caplog.records if "is gone" in r.getMessage()]
    assert len(gone) == 1 and (f"pid {relay.process.pid}) is gone (" in gone[0]), gone
    assert "exit status 3" in gone[0] or "its exit not collected yet" in gone[0], gone
    assert not Path(f"/proc/{relay.process.pid}").exists()  # no zombie left behind
