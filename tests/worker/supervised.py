"""Run worker/boot/supervise.py's loop as an image's PID 1 would, for tests/worker/test_supervise.py.

Usage: python supervised.py PLAN_JSON, where the plan holds the engine's name, argv and log, the
worker's argv (or null), grace, worker_stop, engine_stop and pid_dir, and optionally `held` (the stop
signals blocked first, as entrypoint.py's first line blocks them) and `stopped_while_booting` (held,
and a SIGTERM already pending). The process makes itself a child subreaper, so orphans of its
children are re-parented to it, as they are to PID 1 in a container.
Exits with run_programs' status.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "worker" / "boot"))
import supervise

PR_SET_CHILD_SUBREAPER = 36


def main(plan_path: str) -> int:
    plan = json.loads(Path(plan_path).read_text())
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    if plan.get("held") or plan.get("stopped_while_booting"):
        signal.pthread_sigmask(signal.SIG_BLOCK, supervise.STOP_SIGNALS)
    if plan.get("stopped_while_booting"):
        os.kill(os.getpid(), signal.SIGTERM)  # pending: blocked
    return supervise.run_programs(plan["name"], plan["argv"], plan["log"], plan["worker"], grace=plan["grace"],
                                  worker_stop=plan["worker_stop"], engine_stop=plan["engine_stop"],
                                  env=os.environ, pid_dir=Path(plan["pid_dir"]),
                                  say=lambda line: print(line, flush=True))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
