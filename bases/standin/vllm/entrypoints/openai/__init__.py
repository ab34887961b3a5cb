"""Stand-in package path: vllm.entrypoints.openai (bakery stand-in, not vLLM)."""
