"""The engine's log is read on the event loop, not through a thread per line.

vastai 1.9.1 tails MODEL_LOG with anyio's `open_file`: a thread hand-off per line, taken from the thread that
serves :3000. A local file's read does not block in any way that matters, so the SDK gets an `open_file` that
reads in place (same calls and decoding), handing each line to `seen`. Standard library only; docs/serving.md.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from control import sdk_seam


class LocalFile:
    """An open file with the async methods of anyio's AsyncFile that the SDK calls, done in place."""

    def __init__(self, handle: io.TextIOBase | io.BufferedIOBase, seen: Callable[[Any], None] | None = None) -> None:
        self._handle = handle
        self._seen = seen

    async def readline(self) -> Any:
        line = self._handle.readline()
        if line and self._seen is not None:
            self._seen(line)
        return line

    async def read(self, size: int = -1) -> Any:
        return self._handle.read(size)

    async def write(self, data: Any) -> int:
        return self._handle.write(data)

    async def aclose(self) -> None:
        self._handle.close()

    async def __aenter__(self) -> LocalFile:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self._handle.close()


async def open_local_file(file: Any, mode: str = "r", buffering: int = -1, encoding: str | None = None,
                          errors: str | None = None, newline: str | None = None, *,
                          seen: Callable[[Any], None] | None = None) -> LocalFile:
    """anyio.open_file's signature (the arguments the SDK passes), opening the file in this thread."""
    return LocalFile(open(file, mode, buffering, encoding, errors, newline), seen)


def install(seen: Callable[[Any], None] | None = None) -> None:
    """Give the SDK's log tail the in-place open_file (each line read also goes to `seen`); GuardError
    when it has none to replace."""
    async def open_and_watch(*args: Any, **kwargs: Any) -> LocalFile:
        return await open_local_file(*args, **kwargs, seen=seen)

    sdk_seam.replace_open_file(open_local_file if seen is None else open_and_watch)
