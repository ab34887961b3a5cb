"""The worker keeps its engine connection alive between requests, and never reuses one it cut.

Read from the stand-in's own access lines, which name the client's address and port as uvicorn's do
(`INFO:     127.0.0.1:54321 - "POST /v1/completions HTTP/1.1" 200 OK`): requests one after another
through the worker arrive on one engine connection (the SDK opened a new one per request); after a
client went away mid-stream, that connection is closed and the next request comes on a new one.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.worker.helpers import Proc, ReportServer
from tests.worker.serving import MODEL, EventStream, envelope, start_served, start_standin, wait_records

pytestmark = pytest.mark.slow
ACCESS = re.compile(r'127\.0\.0\.1:(\d+) - "POST (/v1/\S+) HTTP/1\.1" (\d+)')


def engine_ports(log: Path, path: str) -> list[int]:
    """The client port of each POST to `path` in the stand-in's log, in order."""
    return [int(m.group(1)) for m in ACCESS.finditer(log.read_text()) if m.group(2) == path]


def test_requests_share_one_engine_connection_and_a_cut_one_is_not_reused(
        tmp_path: Path, worker_python: Path, pubkey_pem: str, procs: list[Proc]) -> None:
    steps, record = tmp_path / "steps", tmp_path / "record.jsonl"
    steps.mkdir()
    reports = ReportServer(pubkey_pem)
    try:
        engine_port, log = start_standin("vllm", tmp_path, procs, STANDIN_STEP_DIR=str(steps),
                                         STANDIN_STREAM_RECORD=str(record), STANDIN_REPLY_TOKENS="20")
        served = start_served("vllm", tmp_path, procs, reports, worker_python, engine_port, log)
        route = "/v1/chat/completions"
        before = len(engine_ports(log, route))
        for idx in range(3):
            stream = EventStream(served.port, route, envelope(
                {"model": MODEL, "messages": [{"role": "user", "content": f"n{idx}"}], "max_tokens": 2}, idx + 1))
            assert stream.status == 200, stream.rest()
            stream.rest()
            stream.close()
        ports = engine_ports(log, route)[before:]
        assert len(ports) == 3 and len(set(ports)) == 1, ports

        # A stream the client leaves: its engine connection is closed, never handed to the next request.
        held = EventStream(served.port, route, envelope(
            {"model": MODEL, "messages": [{"role": "user", "content": "left"}], "stream": True}, 9))
        assert held.status == 200 and held.next_event()
        held.close()
        served.worker.wait_for("cancelled (client disconnect)")
        (steps / "go-all").touch()
        assert wait_records(record, 1)[-1]["outcome"] in {"BrokenPipeError", "ConnectionResetError"}
        stream = EventStream(served.port, route, envelope(
            {"model": MODEL, "messages": [{"role": "user", "content": "after"}], "max_tokens": 2}, 10))
        assert stream.status == 200
        stream.rest()
        stream.close()
        cut, after = engine_ports(log, route)[-2:]
        assert cut != after and after not in ports, (ports, cut, after)
    finally:
        reports.close()
