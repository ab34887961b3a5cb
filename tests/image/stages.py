"""Time to ready, stage by stage, for a launch of the gate: from `docker run` to the first signed answer.

Read from what the launch leaves, with no probe or sleep of its own (docs/cold-start.md):
- `run`: the gate's wall clock just before `docker run` (Launched.run_at);
- `started`: Docker's State.StartedAt;
- `engine_spawned`: the entry point's `spawned: '<engine>'` line, at Docker's timestamp of that line;
- `load_begins`, `weights_loaded`, `engine_ready`: the entry point's `bakery: stage NAME at T` lines
  (logs/stages.py), stamped as the engine's log showed them;
- `benchmark_begins`, `benchmark_done`: the worker's `bakery-worker: stage NAME at T` lines, when
  the SDK's tail read the load line and when the SDK marked the model loaded;
- `ready_report`: the control-plane stand-in's receipt of the first ready report (else the worker's
  `ready_report_sent`);
- `first_answer`: the first signed request answered 200 (its probe's `sent_at` / `answered_at`).
All are wall-clock times of this host (a container shares its kernel's clock). A stage runs from one
boundary to the next one present; a boundary the launch did not show is named in `missing`, and its
stage is folded into the next. The wait between the ready report and the gate's first request (the
gate's own pace, not the image's) is left out and shown as `idle`.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from datetime import datetime
from typing import Any

from bakery.build.verify import GATE_STAGES_VAR, describe_split

STAGES_FILE_VAR = GATE_STAGES_VAR  # a JSON-lines file the gate appends each launch's split to (build.py reads it)
BOUNDARIES = (
    ("run", "docker run"),
    ("started", "container started"),
    ("engine_spawned", "engine process started"),
    ("load_begins", "model load begins"),
    ("weights_loaded", "weights loaded"),
    ("engine_ready", "engine ready (load line)"),
    ("benchmark_begins", "the worker reads the load line"),
    ("benchmark_done", "benchmark done"),
    ("ready_report", "ready report at the control plane"),
    ("first_answer", "first signed request answered"),
)
STAGE_LINE = re.compile(r"bakery(?:-worker)?: stage ([a-z_]+) at ([0-9]+(?:\.[0-9]+)?)")
# The parts of time to ready bakery controls: the boot before the engine runs, the wait from the
# engine's load line to the worker acting on it (the worker's own start when it came later, and its
# tail's poll), and the report after the benchmark (issue 22's target: <= 1 s). The engine's load and
# the benchmark are the engine's.
BAKERY_STAGES = (("started", "engine_spawned"), ("engine_ready", "benchmark_begins"),
                 ("benchmark_done", "ready_report"))


def docker_time(text: str) -> float:
    """An RFC 3339 time as Docker writes it (nanoseconds, Z) -> Unix seconds."""
    text = text.strip().replace("Z", "+00:00")
    head, _, rest = text.partition(".")
    if rest:  # Python reads at most microseconds
        digits = re.match(r"[0-9]*", rest).group()  # type: ignore[union-attr]
        text = f"{head}.{digits[:6].ljust(6, '0')}{rest[len(digits):]}"
    return datetime.fromisoformat(text).timestamp()


def boundaries(launched: Any, engine: str, is_ready_report: Any) -> dict[str, float]:
    """Every boundary `launched` shows (see the module's docstring), by name."""
    found: dict[str, float] = {}
    if launched.run_at:
        found["run"] = launched.run_at
    launched.container.reload()
    started = launched.container.attrs["State"].get("StartedAt") or ""
    if started and not started.startswith("0001-"):
        found["started"] = docker_time(started)
    logs = launched.container.logs(timestamps=True).decode("utf-8", "replace")
    for line in logs.splitlines():
        stamp, _, text = line.partition(" ")
        if "engine_spawned" not in found and f"spawned: '{engine}'" in text:
            found["engine_spawned"] = docker_time(stamp)
        for match in STAGE_LINE.finditer(text):  # every one: a line may hold two, glued by their writers
            if match.group(1) not in found:
                found[match.group(1)] = float(match.group(2))
    ready_sent = found.pop("ready_report_sent", None)
    if launched.controlplane:
        times = [float(r["time"]) for r in launched.records("/worker_status/") if is_ready_report(r.get("body"))]
        if times:
            found["ready_report"] = min(times)
    if "ready_report" not in found and ready_sent is not None:
        found["ready_report"] = ready_sent
    if launched.first_answer is not None:
        found["first_sent"] = float(launched.first_answer["sent_at"])
        found["first_answer"] = float(launched.first_answer["answered_at"])
    return found


def split(found: dict[str, float], launch: str) -> dict[str, Any]:
    """The stages between the boundaries `found` holds, their sum, the measured total and bakery's share."""
    found = dict(found)
    # Two readers of one log: the worker's tail may read the load line a poll before the entry point
    # does; then the engine was ready by then, and so were the stages before it.
    later = found.get("benchmark_begins")
    for name in ("engine_ready", "weights_loaded", "load_begins"):
        if name in found and later is not None and found[name] > later:
            found[name] = later
        later = found.get(name, later)
    present = [(name, label) for name, label in BOUNDARIES if name in found]
    stages = []
    idle = 0.0
    for (before, before_label), (after, after_label) in itertools.pairwise(present):
        start = found[before]
        if after == "first_answer":  # from the request's send: the gate's own wait is not the image's
            idle = max(found["first_sent"] - start, 0.0)
            start = found["first_sent"]
        stages.append({"from": before, "to": after, "stage": f"{before_label} -> {after_label}",
                       "seconds": round(found[after] - start, 3)})
    first, last = (present[0][0], present[-1][0]) if present else ("", "")
    total = (found[last] - found[first] - idle) if present else 0.0
    bakery = sum(found[b] - found[a] for a, b in BAKERY_STAGES if a in found and b in found)
    return {"launch": launch, "from": first, "to": last, "total": round(total, 3),
            "sum": round(sum(stage["seconds"] for stage in stages), 3), "idle": round(idle, 3),
            "bakery_seconds": round(bakery, 3), "stages": stages,
            "missing": [name for name, _ in BOUNDARIES if name not in found]}


def describe(result: dict[str, Any]) -> str:
    """One line: the launch, the total and each stage (build.py prints the same)."""
    return describe_split(result)


def keep(result: dict[str, Any]) -> None:
    """Append `result` to the file $BAKERY_GATE_STAGES names (build.py reads it), when set."""
    path = os.environ.get(STAGES_FILE_VAR)
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(result, sort_keys=True) + "\n")
