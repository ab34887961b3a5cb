#!/bin/sh
# Start the bakery worker for $BACKEND (POSIX sh: an image may have no bash).
#
# Runs workers/$BACKEND/worker.py, found next to this script, with the worker's own Python
# ($WORKER_PYTHON, default /opt/bakery/venv/bin/python), isolated from the engine's packages:
# PYTHONPATH is set to the worker directory alone and PYTHONHOME is dropped. It runs in
# $WORKER_STATE_DIR (default /var/lib/bakery/worker, created), where the SDK writes .has_benchmark.
# An empty or unknown BACKEND exits 2 at once, naming the backends found under workers/; a BACKEND
# equal to the image's baked BAKERY_ENGINE_PROGRAM with no adapter runs workers/openai/generic.py.
set -eu

here=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd)

valid=""
for dir in "$here"/workers/*/; do
    name=$(basename -- "$dir")
    if [ -f "$dir/worker.py" ]; then
        valid="${valid:+$valid }$name"
    fi
done

backend="${BACKEND:-}"
case "$backend" in
    "" | *[!A-Za-z0-9_]*)
        echo "start_server.sh: BACKEND='$backend' is not a worker backend; valid: $valid" >&2
        exit 2
        ;;
esac
script="$here/workers/$backend/worker.py"
if [ ! -f "$script" ]; then
    # An engine without an adapter of its own runs on the generic core with its image's baked values;
    # only for the program the image bakes, so a misspelt BACKEND still fails here.
    if [ "$backend" = "${BAKERY_ENGINE_PROGRAM:-}" ]; then
        script="$here/workers/openai/generic.py"
    else
        echo "start_server.sh: BACKEND='$backend' is not a worker backend; valid: $valid" >&2
        exit 2
    fi
fi

python="${WORKER_PYTHON:-/opt/bakery/venv/bin/python}"
if [ ! -x "$python" ]; then
    echo "start_server.sh: the worker's Python '$python' is not executable (set WORKER_PYTHON)" >&2
    exit 2
fi

state="${WORKER_STATE_DIR:-/var/lib/bakery/worker}"
mkdir -p -- "$state"
cd -- "$state"

unset PYTHONHOME
PYTHONPATH="$here"
PYTHONNOUSERSITE=1
PYTHONUNBUFFERED=1
export PYTHONPATH PYTHONNOUSERSITE PYTHONUNBUFFERED
exec "$python" "$script"
