#!/usr/bin/env python3
"""bakery's command line: render, build, verify and publish serverless-ready engine images.

A thin layer over the `bakery` package; see `python build.py --help` and README.md.
"""

import sys

from bakery.cli import main

if __name__ == "__main__":
    sys.exit(main())
