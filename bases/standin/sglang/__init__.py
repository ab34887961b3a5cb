"""bakery stand-in for SGLang (not SGLang): see bases/standin/README.md and bakery_standin.sglang_engine."""

from bakery_standin.sglang_engine import VERSION as __version__

__all__ = ["__version__"]
