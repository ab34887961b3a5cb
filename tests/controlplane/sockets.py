"""Which connection is whose, read from /proc (standard library only: the host's tests use it too):
the worker's end of a client's connection, and whether any process still holds it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def server_inode(local_port: int, server_port: int) -> int | None:
    """The inode of the worker's end of the connection from `local_port` (its row in /proc/net/tcp*)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, remote = fields[1].rsplit(":", 1)[1], fields[2].rsplit(":", 1)[1]
                if int(local, 16) == server_port and int(remote, 16) == local_port:
                    return int(fields[9])
    return None


def held(inode: int) -> bool:
    """Whether any process still holds a descriptor of the socket `inode`."""
    target = f"socket:[{inode}]"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return True
    return False
