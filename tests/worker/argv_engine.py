"""A test engine that records the exact argv it was started with, then exits or waits.

It writes its pid and /proc/self/cmdline (the kernel's copy of argv, NUL-separated bytes) to
$ARGV_RECORD, prints a line to its output (which must reach MODEL_LOG), then exits with
$ARGV_EXIT (default 0) or, with ARGV_SLEEP set, sleeps until SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def main() -> int:
    """Record, print, exit or wait."""
    with open("/proc/self/cmdline", "rb") as handle:
        cmdline = handle.read()
    record = os.environ["ARGV_RECORD"]
    with open(record + ".tmp", "wb") as out:
        out.write(str(os.getpid()).encode() + b"\n" + cmdline)
    os.replace(record + ".tmp", record)
    print("argv_engine: recorded my argv", flush=True)
    if os.environ.get("ARGV_SLEEP"):
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        for _ in range(600):  # bounded: at most 60 s
            time.sleep(0.1)
    return int(os.environ.get("ARGV_EXIT", "0"))


if __name__ == "__main__":
    sys.exit(main())
