"""Downloads prepared on the host for builds and tests, each file pinned by sha256 and cached: the
image builds' wheelhouse, the worker's per-Python wheelhouse and host venv, llama.cpp's wheel and
the SmolLM2 model. No Docker.
"""
