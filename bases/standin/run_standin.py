#!/usr/bin/env python3
"""Run a stand-in engine from a checkout, no PYTHONPATH needed (this file's directory is on sys.path).

    python3 bases/standin/run_standin.py vllm serve MODEL --host 127.0.0.1 --port 18000
    python3 bases/standin/run_standin.py vllm-api-server --model MODEL --port 18000
    python3 bases/standin/run_standin.py sglang --model-path MODEL --port 18000
"""

import sys

USAGE = "usage: run_standin.py {vllm ...|vllm-api-server ...|sglang ...}"


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("vllm", "vllm-api-server", "sglang"):
        print(USAGE, file=sys.stderr)
        return 2
    engine, rest = argv[0], argv[1:]
    if engine == "vllm":
        from bakery_standin.vllm_engine import main_cli

        return main_cli(rest)
    if engine == "vllm-api-server":
        from bakery_standin.vllm_engine import main_api_server

        return main_api_server(rest)
    from bakery_standin.sglang_engine import main as sglang_main

    return sglang_main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
