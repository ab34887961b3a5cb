"""BACKEND=openai: a backwards-compatible alias of the vLLM worker.

It imports the vLLM defaults rather than copying them, so there is one definition to maintain;
the banner names vllm and notes the alias.
"""

from app.core import run
from workers.vllm.worker import DEFAULTS

if __name__ == "__main__":
    run(DEFAULTS)
