"""The `vllm` command (`vllm serve <model> ...`): bakery stand-in, same module path as vLLM's CLI."""

import sys

from bakery_standin.vllm_engine import main_cli as main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
