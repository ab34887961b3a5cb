"""bakery stand-in engines: fake vLLM / SGLang OpenAI-compatible servers for tests (stdlib only).

They reproduce what the worker depends on (docs/engines.md): the engines' startup, ready and fatal
log lines in each engine's own format, their /health behaviour while starting, and an
OpenAI-compatible API with deterministic answers. They load no model and need no GPU.
They are stand-ins and say so: in their version strings, their banner line and every answer's
`system_fingerprint`.

Entry points (the same command names as the real engines, so image templates start them unchanged):
  vllm serve <model> [--host H] [--port P] [...]            (the `vllm` executable, bin/vllm)
  python3 -m vllm.entrypoints.openai.api_server --model M [--host H] [--port P] [...]
  python3 -m sglang.launch_server --model-path M [--host H] [--port P] [...]
and, for the host, `python3 bases/standin/run_standin.py vllm|sglang ARGS...`.
Behaviour switches are environment variables: see `bakery_standin.core.Options`.
"""

# The engine releases whose log grammar the stand-ins reproduce (the stand-in images are tagged
# with these). The stand-in's own versions are these plus the PEP 440 local label "+standin".
VLLM_VERSION = "0.33.0"
SGLANG_VERSION = "0.5.23"
STANDIN_LABEL = "standin"

__version__ = "1.0.0"
