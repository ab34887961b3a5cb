"""The engine's log is read on the event loop, not through a thread per line.

vastai 1.9.1 tails MODEL_LOG for its whole life (load and error lines) with anyio's `open_file`,
whose every `readline()` runs in a worker thread: a queue hand-off, a condition wake-up and a GIL
hand-back per line, taken from the one thread that also serves :3000. Engines log a line per request
(vLLM's and llama.cpp's access lines), so under traffic that cost grows with the request rate, and a
profile of 16 concurrent streams put the tail at about a tenth of the worker's busy time, in the
same moments its requests were being set up. Reading a local regular file does not block in any way
that matters (a few kilobytes from the page cache), so the SDK's backend gets an `open_file` that
reads in place: the same calls (`await f.readline()`, `await f.aclose()`, `async with`), the same
text decoding, no thread.

Installed by serving.install before the server starts (the SDK opens the log after its HTTP sites
are up). This module imports only the standard library.
"""

from __future__ import annotations

import io
from typing import Any

from workers.openai import sdk_seam

BACKEND_MODULE = sdk_seam.BACKEND_MODULE


class LocalFile:
    """An open file with the async methods of anyio's AsyncFile that the SDK calls, done in place."""

    def __init__(self, handle: io.TextIOBase | io.BufferedIOBase) -> None:
        self._handle = handle

    async def readline(self) -> Any:
        return self._handle.readline()

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
                          errors: str | None = None, newline: str | None = None) -> LocalFile:
    """anyio.open_file's signature (the arguments the SDK passes), opening the file in this thread."""
    return LocalFile(open(file, mode, buffering, encoding, errors, newline))


def install() -> None:
    """Give the SDK's backend module the in-place open_file; GuardError when it has none to replace."""
    _, current = sdk_seam.module_hook("open_file", "log_tail.py")
    if not callable(current):
        raise sdk_seam.GuardError(f"log_tail.py: the SDK module {BACKEND_MODULE}'s open_file is not callable "
                                  f"(vastai changed): update the hook 'open_file' in {sdk_seam.SEAM_FILE}")
    sdk_seam.replace_in_module("open_file", "log_tail.py", open_local_file)
