"""Proposed changes to files this bench does not own, measured side by side (`bench/run.py --proposals`).

Nothing here changes the repo: each proposal is applied to a private copy (a build context's
Dockerfile, or a copy of the entry point bind-mounted over the image's), so its effect can be
measured in the same round as the product as it is. They are proposals for the owners of
templates/base.Dockerfile.j2 and worker/boot/entrypoint.py.

1. `reorder_final_stage`: on this machine's classic builder each Dockerfile step costs seconds even
   when it only sets metadata (it creates and commits a container on fuse-overlayfs). Today a worker
   change re-runs every step after `COPY worker/` (ENV x3, EXPOSE, ARG x2, LABEL, WORKDIR, ENTRYPOINT).
   Proposed order of the image stage: the engine's own steps, then everything that depends on
   neither the worker nor the bake (ENV PATH, the engine command, EXPOSE, WORKDIR, ENTRYPOINT, the
   ARGs, the static labels), then `COPY --from=worker-build`, the bake ENV, `COPY worker/`, and last
   one LABEL with the per-build revision/created. A worker change then re-runs 2 steps, a bake
   change 3. (ARG steps do not miss the cache when only their value changes; RUN steps after them
   would, and there are none after the engine's own steps.)
2. `fast_supervisord_entrypoint`: supervisord's main loop polls with a 1 s timeout *before* it
   spawns anything, so every boot waits ~1 s for nothing. Proposed: the entry point runs
   supervisord through a two-line launcher whose first poll does not wait.
3. `quiet_requests_core`: the SDK logs four DEBUG lines per proxied request (`Starting Request N`,
   `posting to endpoint ...`, `Request N succeeded`, `Ending Request N`); in the image each line
   goes through supervisord and dockerd's log driver, CPU taken from the same cores as the worker.
   Proposed: the worker drops exactly those four (every other SDK line stays: readiness, benchmark,
   errors, status reports).
"""


from __future__ import annotations

FAST_SUPERVISORD = (
    "import sys, supervisor.poller as p; o = p.Poller.poll; first = [1]\n"
    "def poll(self, timeout):\n"
    "    return o(self, 0 if first and first.pop() else timeout)\n"
    "p.Poller.poll = poll\n"
    "from supervisor.supervisord import main; main()\n"
)
_SPAWN = "child = subprocess.Popen([supervisord, \"-c\", str(config)])"


def fast_supervisord_entrypoint(text: str) -> str | None:
    """worker/boot/entrypoint.py with supervisord's first 1 s poll skipped; None if it no longer fits."""
    if _SPAWN not in text:
        return None
    return text.replace(_SPAWN, f"child = subprocess.Popen([VENV_PYTHON, \"-c\", {FAST_SUPERVISORD!r}, "
                                "\"-c\", str(config)])")


def _instructions(lines: list[str]) -> list[list[str]]:
    """Group Dockerfile lines into instructions (a line ending in a backslash continues); drop comments."""
    out: list[list[str]] = []
    current: list[str] = []
    for line in lines:
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current.append(line)
        if not line.rstrip().endswith("\\"):
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out


def reorder_final_stage(dockerfile: str) -> str | None:
    """The Dockerfile with its image stage in the proposed order; None if its shape is unexpected."""
    lines = dockerfile.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("FROM "))
    head, stage = lines[:start], _instructions(lines[start:])
    words = [ins[0].split()[0].upper() for ins in stage]
    venv = next((i for i, ins in enumerate(stage) if ins[0].startswith("COPY --from=worker-build ")), None)
    worker = next((i for i, ins in enumerate(stage) if ins[0].startswith("COPY worker/ ")), None)
    bake = next((i for i, ins in enumerate(stage) if words[i] == "ENV" and "BACKEND=" in " ".join(ins)), None)
    labels = [i for i, w in enumerate(words) if w == "LABEL"]
    if None in (venv, worker, bake) or len(labels) != 1 or "RUN" in words[venv:]:
        return None
    static, dynamic = [], []
    for raw in stage[labels[0]]:
        item = raw.strip().removeprefix("LABEL ").removesuffix("\\").strip()
        (dynamic if "${BAKERY_" in item else static).append(item)
    moved = [ins for i, ins in enumerate(stage[venv:], venv) if i not in (venv, worker, bake, labels[0])]

    def label(items: list[str]) -> list[str]:
        return [f"LABEL {' '.join(items)}"] if items else []

    order = [*stage[:venv], *moved, label(static), stage[venv], stage[bake], stage[worker], label(dynamic)]
    return "\n".join([*head, *(line for ins in order for line in ins)]) + "\n"


_ADD_HANDLER = "    logging.getLogger().addHandler(_LaunchFailureExit())\n"
_PER_REQUEST_FILTER = '''

_BENCH_PER_REQUEST = _bench_re.compile(r"^(Starting Request \\d+|Ending Request \\d+|"
                                       r"Request \\d+ succeeded|posting to endpoint: )")


def _not_per_request(record: logging.LogRecord) -> bool:
    return record.levelno > logging.DEBUG or not _BENCH_PER_REQUEST.match(str(record.msg))
'''


def quiet_requests_core(text: str) -> str | None:
    """worker/workers/openai/core.py without the SDK's per-request DEBUG lines; None if it no longer fits."""
    if _ADD_HANDLER not in text or "\nimport logging\n" not in text:
        return None
    patched = text.replace(_ADD_HANDLER, _ADD_HANDLER + "    for handler in logging.getLogger().handlers:\n"
                           "        handler.addFilter(_not_per_request)\n")
    patched = patched.replace("\nimport logging\n", "\nimport logging\nimport re as _bench_re\n", 1)
    return patched + _PER_REQUEST_FILTER
