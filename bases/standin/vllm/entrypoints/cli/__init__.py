"""Stand-in package path: vllm.entrypoints.cli (bakery stand-in, not vLLM)."""
