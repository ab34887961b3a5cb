#!/bin/sh
# Build the worker's virtual environment under $1/venv, offline, from $1/../tmp wheelhouse.
# Uses the base image's python3 when it is >= 3.10 (no second interpreter in the image); otherwise
# the relocatable Python bundled by bundle-python.sh at $1/python.
set -eu
root=$1
wheels=/tmp/bakery/wheels
if command -v python3 >/dev/null 2>&1 \
    && python3 -c 'import sys, venv; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    python=$(command -v python3)
    rm -rf "$root/python"
    echo "bakery: worker venv on the base's Python ($("$python" -V 2>&1))"
else
    python=$root/python/bin/python3
    echo "bakery: the base has no Python >= 3.10; worker venv on the bundled $("$python" -V 2>&1)"
fi
if command -v ss >/dev/null 2>&1 || command -v netstat >/dev/null 2>&1; then
    rm -rf "$root/tools"
else
    echo "bakery: the base has neither ss nor netstat; keeping the bundled ss in $root/tools/bin"
fi
"$python" -m venv --without-pip "$root/venv"
pip_wheel=$(ls "$wheels"/pip-*.whl)
# --no-deps + --require-hashes: exactly the pinned, hashed set of requirements.txt, nothing resolved.
"$root/venv/bin/python" "$pip_wheel/pip" install --quiet --no-cache-dir --disable-pip-version-check \
    --no-index --find-links "$wheels" --no-deps --require-hashes -r /tmp/bakery/requirements.txt
# Test suites that wheels ship inside their packages and nothing imports at run time:
# pycryptodome's Crypto/SelfTest and certifi's tests.
for site in "$root"/venv/lib/python3*/site-packages; do
    rm -rf "$site/Crypto/SelfTest" "$site/certifi/tests"
done
# Byte-compile now so the first boot does not pay for it (and the image stays read-only-friendly).
"$root/venv/bin/python" -m compileall -q "$root/venv" >/dev/null || true
mkdir -p /var/lib/bakery/worker
