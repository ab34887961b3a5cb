"""bakery-relay's fuzz harness (fuzz_relay.c, libFuzzer with AddressSanitizer and
UndefinedBehaviorSanitizer): built with clang-14, seeded, and run for a bound.

    python -m tests.worker.relay_fuzz [--seconds N] [--seed S]     a longer run (make fuzz-relay)
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bakery.errors import BuildError
from bakery.host.relay import SOURCE, compile_cached

HARNESS = Path(__file__).resolve().parent / "fuzz_relay.c"
COMPILER = "clang-14"
FLAGS = ["-g", "-O1", "-fno-omit-frame-pointer", "-fsanitize=fuzzer,address,undefined",
         "-fno-sanitize-recover=all", "-Wall", "-I", str(SOURCE.parent)]
MAX_LEN = 4096
# Scripts that reach the states the third review broke (fuzz_relay.c reads them): a 64 KiB read of
# one-byte chunks with bare-LF size lines; an engine that hangs up while a write to a client with
# little room is pending; a body whose end is read while the client never reads again, under a send
# limit. The fuzzer starts from these and from what it finds.
SEEDS = {
    "bare-lf-flood": bytes([0x00, 0x05, *[0xE0, 0x00, 0x00, 0x01] * 4, 0x04, 0xF9]),
    "hang-up-while-pending": bytes([0x20, 0x03, 0x10, 0xFF, 0xFF, 0x00, 0x10, 0xFF, 0xFF, 0x00, 0x06, 0xF9, 0xFC]),
    "end-then-stalled-client": bytes([0x2C, 0x02, 0x18, 0x00, 0x00, 0x00, 0x04, 0xF9, 0xFF]),
}


def harness() -> Path:
    """The harness, built (cached) against today's worker/relay/bakery_relay.c."""
    compiler = shutil.which(COMPILER)
    if compiler is None:
        raise BuildError(f"no {COMPILER} to build {HARNESS.name}: install clang-14 and libclang-rt-14-dev "
                         "(scripts/setup-host does)")
    return compile_cached(compiler, FLAGS, [HARNESS], "fuzz-relay",
                          "install clang-14 and libclang-rt-14-dev (scripts/setup-host does)", included=(SOURCE,))


@dataclass
class Run:
    """One bounded run of the harness: its seed, exit status, inputs run and output's tail."""

    seed: int
    code: int
    runs: int
    tail: str


def run(seed: int, runs: int | None = None, seconds: int | None = None, corpus: Path | None = None) -> Run:
    """The harness from SEEDS (and `corpus`, where it keeps what it finds), with libFuzzer's `seed`,
    for `runs` inputs or `seconds`, whichever it is given (one of them, bounded either way)."""
    program = harness()
    with tempfile.TemporaryDirectory(prefix="fuzz-relay-") as scratch:
        seeds = Path(scratch) / "seeds"
        seeds.mkdir()
        for name, data in SEEDS.items():
            (seeds / name).write_bytes(data)
        work = corpus or Path(scratch) / "corpus"
        work.mkdir(parents=True, exist_ok=True)
        bound = [f"-runs={runs}"] if runs is not None else [f"-max_total_time={seconds or 60}"]
        command = [str(program), f"-seed={seed}", f"-max_len={MAX_LEN}", "-timeout=20", "-print_final_stats=1",
                   f"-artifact_prefix={scratch}/", *bound, str(work), str(seeds)]
        limit = (seconds or 0) + 300 if runs is None else 900
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit, check=False, cwd=scratch)
    output = done.stdout + done.stderr
    count = 0
    for line in output.splitlines():
        if line.startswith("stat::number_of_executed_units:"):
            count = int(line.split(":")[-1])
    return Run(seed, done.returncode, count, output[-6000:])


def random_seed() -> int:
    """A seed for a run no earlier run made (libFuzzer takes a 32-bit one)."""
    return secrets.randbelow(2**31 - 1) + 1
