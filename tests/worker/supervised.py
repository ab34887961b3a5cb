"""Run worker/boot/supervise.py's loop as an image's PID 1 would, for tests/worker/test_supervise.py.

Usage: python supervised.py PLAN_JSON, where the plan holds the engine's name, argv and log, the
worker's argv (or null), grace, worker_stop, engine_stop and pid_dir. The process makes itself a child
subreaper, so orphans of its children are re-parented to it, as they are to PID 1 in a container.
Exits with run_programs' status.
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "worker" / "boot"))
import supervise

PR_SET_CHILD_SUBREAPER = 36


def main(plan_path: str) -> int:
    plan = json.loads(Path(plan_path).read_text())
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    return supervise.run_programs(plan["name"], plan["argv"], plan["log"], plan["worker"], grace=plan["grace"],
                                  worker_stop=plan["worker_stop"], engine_stop=plan["engine_stop"],
                                  pid_dir=Path(plan["pid_dir"]), say=lambda line: print(line, flush=True))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
