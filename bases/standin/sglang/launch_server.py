"""`python3 -m sglang.launch_server --model-path M --host H --port P` (bakery stand-in)."""

import sys

from bakery_standin.sglang_engine import main

if __name__ == "__main__":
    sys.exit(main())
