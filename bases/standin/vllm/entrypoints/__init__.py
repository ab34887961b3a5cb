"""Stand-in package path: vllm.entrypoints (bakery stand-in, not vLLM)."""
