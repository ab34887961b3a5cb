"""supervisord event listener: when the engine or the worker dies, end the container with its status.

When the engine dies it also appends the upstream supervisor line `INFO exited: <engine> ...` to
MODEL_LOG, so the worker (whose error grammar includes that line) reports itself errored, and waits
BAKERY_EXIT_GRACE seconds (default 10) for that report before stopping everything.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

RUN_DIR = Path(os.environ.get("BAKERY_RUN_DIR", "/run/bakery"))


def grace_seconds() -> float:
    """How long the worker gets to report an engine death before the container stops."""
    try:
        value = float(os.environ.get("BAKERY_EXIT_GRACE", "10"))
    except ValueError:
        return 10.0
    return value if 0 <= value < 3600 else 10.0


def exit_status(name: str) -> int:
    """The dead program's exit status, from supervisord (the event does not carry it); 1 if unknown."""
    try:
        from supervisor import childutils

        info = childutils.getRPCInterface(os.environ).supervisor.getProcessInfo(name)
        return int(info.get("exitstatus", 1))
    except Exception:  # noqa: BLE001 - any failure here must still stop the container
        return 1


def handle(headers: dict[str, str], payload: dict[str, str]) -> None:
    """React to one PROCESS_STATE_EXITED/FATAL event."""
    name = payload.get("processname", "?")
    expected = payload.get("expected") == "1"
    status = exit_status(name)
    if headers.get("eventname") == "PROCESS_STATE_FATAL" and status == 0:
        status = 127  # supervisord could not start it at all (e.g. the engine command is missing)
    reason = "expected" if expected else "not expected"
    print(f"bakery: {name} exited (status {status}; {reason}); stopping the container", file=sys.stderr, flush=True)
    engine = os.environ.get("BAKERY_ENGINE_PROGRAM", "")
    if name == engine:
        log = os.environ.get("MODEL_LOG", "")
        if log:
            with open(log, "a", encoding="utf-8") as out:
                out.write(f"INFO exited: {name} (exit status {status}; {reason})\n")
        time.sleep(grace_seconds())
    (RUN_DIR / "exit-status").write_text(str(status))
    os.kill(os.getppid(), signal.SIGTERM)


def main() -> None:
    """The supervisor eventlistener protocol loop (READY → event → RESULT)."""
    while True:
        sys.stdout.write("READY\n")
        sys.stdout.flush()
        header_line = sys.stdin.readline()
        headers = dict(token.split(":", 1) for token in header_line.split())
        body = sys.stdin.read(int(headers.get("len", "0")))
        first, _, _ = body.partition("\n")
        payload = dict(token.split(":", 1) for token in first.split())
        if headers.get("eventname", "").startswith("PROCESS_STATE"):
            handle(headers, payload)
        sys.stdout.write("RESULT 2\nOK")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
