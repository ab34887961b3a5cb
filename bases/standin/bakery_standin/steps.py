"""Step mode of a streamed answer (STANDIN_STEP_DIR), and the record of how a stream ended.

Step mode lets a test prove that a proxy passes events through as the engine writes them, without
timing: before writing event k+1 of a stream (k >= 1 events written) the stand-in waits for the file
`go-<k>` (or `go-all`) in the step directory, and after each event it writes the number of events
written so far to `written` there. A client that holds event k while `written` says k and `go-<k>`
does not exist yet has received it before the engine could write the next one. One stream at a time:
the counter and the files are per directory, not per request.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

# A test that forgets to release a step must not hang the stand-in forever.
STEP_TIMEOUT = 120.0
_POLL = 0.002


class Steps:
    """The step directory of STANDIN_STEP_DIR (see the module docstring)."""

    def __init__(self, directory: str, timeout: float = STEP_TIMEOUT) -> None:
        self.directory = Path(directory)
        self.timeout = timeout

    def wrote(self, count: int) -> None:
        """Record that `count` events of the current stream have been written (atomic replace)."""
        tmp = self.directory / "written.tmp"
        tmp.write_text(str(count))
        os.replace(tmp, self.directory / "written")

    def wait(self, written: int) -> bool:
        """Wait until the test releases event `written`+1; False if it did not within the timeout."""
        go, every = self.directory / f"go-{written}", self.directory / "go-all"
        deadline = time.monotonic() + self.timeout
        while not (go.exists() or every.exists()):
            if time.monotonic() > deadline:
                return False
            time.sleep(_POLL)
        return True
