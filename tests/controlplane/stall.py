"""A client that reads nothing, for the gate (`python -m controlplane stall`): it sends refused
requests (a flipped signature: 401) back to back on one connection with the least receive room until
its sends block, never reads, and times how long the worker keeps that connection: until no process
in the container holds the worker's end of it (its socket's inode in /proc/*/fd), which is when the
worker gave its slot back. Loopback only; bounded in requests and in time."""

from __future__ import annotations

import json
import socket
import time
import urllib.parse
from typing import Any

from .probe import body_bytes
from .server import State
from .sockets import held, server_inode

MOST_REQUESTS = 20000
BLOCKED = 1.0  # sends that take nothing for this long: the worker stopped reading


def stall(state: State, worker: str, seconds: float) -> dict[str, Any]:
    """Run the client; what happened: requests sent, seconds until the sends blocked, and seconds from
    then until the worker let the connection go (None when it still held it after `seconds`)."""
    parts = urllib.parse.urlsplit(worker)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    data = body_bytes(state, {"signature": "flipped", "request_idx": 7001})
    request = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(data)}\r\n\r\n").encode() + data
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
    sock.settimeout(10)
    sock.connect((host, port))
    inode = server_inode(sock.getsockname()[1], port)
    sock.setblocking(False)
    stream, sent, started = request * MOST_REQUESTS, 0, time.monotonic()
    last_progress = started
    while sent < len(stream) and time.monotonic() - last_progress < BLOCKED:
        try:
            sent += sock.send(stream[sent:sent + 65536])
            last_progress = time.monotonic()
        except BlockingIOError:
            time.sleep(0.01)
        except OSError:
            break
    blocked = time.monotonic()
    released = None
    while inode is not None and time.monotonic() - blocked < seconds:
        if not held(inode):
            released = round(time.monotonic() - blocked, 2)
            break
        time.sleep(0.2)
    sock.close()
    return {"requests": sent // len(request), "sent_bytes": sent, "blocked_after": round(blocked - started, 2),
            "released_after": released, "found": inode is not None}


def main(state: State, worker: str, seconds: float) -> None:
    """Print stall()'s result as JSON."""
    print(json.dumps(stall(state, worker, seconds)))
