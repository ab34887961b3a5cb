"""bakery stand-in for vLLM (not vLLM): see bases/standin/README.md and bakery_standin.vllm_engine."""

from bakery_standin.vllm_engine import VERSION as __version__

__all__ = ["__version__"]
