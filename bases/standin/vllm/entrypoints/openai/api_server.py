"""`python3 -m vllm.entrypoints.openai.api_server --model M --host H --port P` (bakery stand-in)."""

import sys

from bakery_standin.vllm_engine import main_api_server

if __name__ == "__main__":
    sys.exit(main_api_server())
