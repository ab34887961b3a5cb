"""The worker's port, claimed before the SDK binds it: a per-port lock, then a bind test of both ports
the SDK will bind, so a second worker or another listener ends the start with exit 3."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import tempfile
from pathlib import Path

from app.worker_config import Settings


class PortBusy(Exception):
    """The worker's port (or the SDK's internal HTTP port) is already taken."""


def bind_test(port: int) -> None:
    """Raise PortBusy if a listener holds `port` on any address the SDK would bind (all interfaces).

    Binds the way asyncio's create_server(host=None) does: every passive address, SO_REUSEADDR,
    IPv6 sockets v6-only. A socket lingering in TIME_WAIT therefore does not count as busy.
    """
    infos = socket.getaddrinfo(None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    for family, kind, proto, _, address in infos:
        try:
            sock = socket.socket(family, kind, proto)
        except OSError:  # e.g. no IPv6 on this host
            continue
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise PortBusy(f"port {port} is already in use") from None
                if exc.errno != errno.EADDRNOTAVAIL:
                    raise


def claim_port(port: int, lock_dir: Path | None = None) -> int:
    """Take the per-port worker lock and return its fd (keep it open for the process's life).

    The lock closes the race a bind test alone leaves open: two workers started together (the
    upstream incident of a worker launched by two paths) both pass a bind test before either binds.
    """
    directory = lock_dir or Path(tempfile.gettempdir())
    path = directory / f"bakery-worker-port-{port}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise PortBusy(f"another bakery worker already runs on port {port} (lock {path})") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def claim_ports(settings: Settings, lock_dir: Path | None = None) -> int:
    """Lock the worker port, then check both ports the SDK will bind; return the lock's fd."""
    fd = claim_port(settings.worker_port, lock_dir)
    try:
        for port in (settings.worker_port, settings.worker_http_port):
            bind_test(port)
    except BaseException:
        os.close(fd)
        raise
    return fd
