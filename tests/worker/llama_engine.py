"""Run the real llama.cpp server (the `xllamacpp` extension) until killed: the llama backend's engine.

    <xllamacpp venv>/bin/python llama_engine.py --model FILE.gguf --port P

llama.cpp writes its own log lines (`... init: model loaded`, `listening on http://...`, or
`error loading model` / `failed to load model` for a bad file) to stderr; the test sends them to
the MODEL_LOG file, as supervisord does in an image. Exits 1 when the server cannot start.
"""

from __future__ import annotations

import argparse
import sys
import threading


def main() -> int:
    """Start the server on 127.0.0.1:<port> and wait."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--alias", default="smollm2")
    args = parser.parse_args()

    import xllamacpp  # the engine's own venv, not the worker's

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    params.n_ctx = 2048
    params.cpuparams.n_threads = 1
    params.model_alias = {args.alias}
    try:
        server = xllamacpp.Server(params)
    except RuntimeError as err:
        print(f"llama_engine: {err}", file=sys.stderr, flush=True)
        return 1
    print(f"llama_engine: serving on {server.listening_address}", file=sys.stderr, flush=True)
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
