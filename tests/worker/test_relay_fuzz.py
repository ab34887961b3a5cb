"""bakery-relay fuzzed in the suite: tests/worker/relay_fuzz/fuzz_relay.c under libFuzzer with
AddressSanitizer and UndefinedBehaviorSanitizer, from the seeds that reach the states the third
review broke. Fixed seeds (the same inputs every run) and one random seed, printed so that a failure
can be run again with `python -m tests.worker.relay_fuzz --seed S`.
"""

from __future__ import annotations

import pytest

from tests.worker.relay_fuzz import random_seed, run

FIXED_SEEDS = (1, 2, 3)
RUNS = 3000  # inputs per fixed seed: ~5-10 s each on a 2-core machine
RANDOM_SECONDS = 20


@pytest.mark.parametrize("seed", [*FIXED_SEEDS, "random"])
def test_bakery_relay_holds_under_the_fuzzer(seed: int | str) -> None:
    chosen = random_seed() if seed == "random" else int(seed)
    print(f"fuzz-relay seed {chosen}")  # shown with the failure (pytest prints captured output)
    result = run(chosen, runs=RUNS) if seed != "random" else run(chosen, seconds=RANDOM_SECONDS)
    assert result.code == 0, f"seed {chosen}: the harness found a failure (exit {result.code}):\n{result.tail}"
    assert result.runs >= (RUNS if seed != "random" else 100), f"seed {chosen}: only {result.runs} inputs ran"
