"""A longer run of bakery-relay's fuzz harness: python -m tests.worker.relay_fuzz --seconds 600."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.worker.relay_fuzz import random_seed, run


def main() -> int:
    """Run the harness for --seconds (default 600) with --seed (default: a random one, printed)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=600)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--corpus", type=Path, default=None, help="keep the inputs found here (default: dropped)")
    args = parser.parse_args()
    seed = args.seed or random_seed()
    print(f"fuzz-relay: seed {seed}, {args.seconds} s", flush=True)
    result = run(seed, seconds=args.seconds, corpus=args.corpus)
    print(result.tail if result.code else result.tail[-600:])
    print(f"fuzz-relay: seed {seed}: {result.runs} inputs, exit {result.code}")
    return 0 if result.code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
