"""log_tail: the SDK reads the engine's log on the event loop, exactly as it read it through anyio.

The SDK tails MODEL_LOG with `open_file(...)` then `await f.readline()` until it returns '', and
`await f.aclose()` when the file is rotated. log_tail gives it a file object doing the same in place.
Checked in the worker venv against anyio's own AsyncFile on the same growing file (partial lines,
bytes that are not UTF-8, CRLF), and the SDK hook it replaces is pinned.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from control import sdk_seam
from logs import log_tail
from policy.guards import GuardError
from tests.worker.helpers import probe_facts

PROBE = r"""
import asyncio, inspect, json, sys, tempfile
from anyio import open_file
from logs import log_tail

CHUNKS = [b"first line\n", b"half a li", b"ne\n", b"caf\xc3\xa9 \xff\xfe bad bytes\n", b"crlf\r\n", b"no newline yet"]

async def read_all(opener, path):
    # As the SDK tails: write a chunk, then readline until '' (EOF for now), repeat.
    out = []
    f = await opener(path, encoding="utf-8", errors="ignore")
    with open(path, "ab", buffering=0) as writer:
        for chunk in CHUNKS:
            writer.write(chunk)
            while line := await f.readline():
                out.append(line)
            out.append("<eof>")
    await f.aclose()
    return out

async def main():
    results = []
    for opener in (open_file, log_tail.open_local_file):
        with tempfile.NamedTemporaryFile(delete=False) as tmp:
            pass
        results.append(await read_all(opener, tmp.name))
    from vastai.serverless.server.lib import backend
    names, stack = set(), [backend.Backend._Backend__read_logs.__code__]
    while stack:
        code = stack.pop(); names.update(code.co_names); stack.extend(c for c in code.co_consts if inspect.iscode(c))
    log_tail.install()
    print(json.dumps({"anyio": results[0], "local": results[1], "tail_uses_open_file": "open_file" in names,
                      "installed": backend.open_file is log_tail.open_local_file}))

asyncio.run(main())
"""


def test_reads_what_anyio_reads_and_replaces_the_sdks_open_file(worker_python: Path) -> None:
    facts = probe_facts(worker_python, "-c", PROBE)
    assert facts["local"] == facts["anyio"], facts
    # As with anyio: a line written in two pieces is read in two pieces (the SDK's known limit, see
    # docs/architecture.md), bytes that are not UTF-8 are dropped, CRLF becomes a newline.
    local = facts["local"]
    assert local[local.index("half a li") + 2] == "ne\n" and "café  bad bytes\n" in local and "crlf\n" in local, local
    assert facts["tail_uses_open_file"] is True  # the SDK's tail still opens the log with the name replaced
    assert facts["installed"] is True


def test_a_changed_sdk_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, sdk_seam.BACKEND_MODULE, types.SimpleNamespace())
    with pytest.raises(GuardError, match=r"log_tail\.py"):
        log_tail.install()


def test_install_replaces_only_the_backends_name(monkeypatch: pytest.MonkeyPatch) -> None:
    async def threaded_open(*_a: object, **_k: object) -> None:
        raise AssertionError("not used")

    fake = types.SimpleNamespace(open_file=threaded_open)
    monkeypatch.setitem(sys.modules, sdk_seam.BACKEND_MODULE, fake)
    log_tail.install()
    assert fake.open_file is log_tail.open_local_file
