#!/bin/sh
# A bakery-relay that exits at once (tests/worker/test_native_relay.py).
exit 3
