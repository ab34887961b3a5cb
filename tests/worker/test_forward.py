"""bakery's own engine client (engine/forward.py) reads answers as HTTP/1.1 says, however
the bytes arrive, and keeps, retries and drops engine connections as the SDK's aiohttp client did.

tests/worker/forward_probe.py runs in the worker venv and reports; this pins each fact. The
end-to-end behaviour (events pass one by one, a client gone closes the engine connection, kept-alive
reuse, timeouts' 504) is held by test_streaming.py, test_engine_connections.py and test_guards.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.worker.helpers import probe_facts

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def report(worker_python: Path) -> dict[str, Any]:
    return probe_facts(worker_python, str(HERE / "forward_probe.py"))


@pytest.mark.parametrize("name", ["chunked", "length", "close", "empty", "bad_size", "no_crlf", "not_http",
                                  "bad_header", "head_too_big"])
def test_an_answer_decodes_the_same_however_its_bytes_are_split(report: dict[str, Any], name: str) -> None:
    seen = report["decoding"][name]
    assert seen["splits"] >= 2 and seen["distinct"] == 1, seen


def test_a_chunked_stream_is_decoded_with_its_extensions_and_trailer(report: dict[str, Any]) -> None:
    out = report["decoding"]["chunked"]["outcome"]
    assert out["body"] == 'data: {"a":1}\n\nhello'
    assert out["status"] == 200 and out["content_type"] == "text/event-stream" and out["keep_alive"]
    assert (out["error"], out["done"], out["discarded"]) == (None, 1, 0)


def test_a_stream_relayed_to_a_chunked_client_reads_the_same_however_its_bytes_are_split(
        report: dict[str, Any]) -> None:
    seen = report["relaying"]
    assert seen["splits"] >= 50 and seen["bodies"] == ['data: {"a":1}\n\ndata: {"b":2}\n\nhello'], seen
    assert seen["all_ended"], seen


def test_an_engine_writing_one_event_per_read_is_relayed_with_its_own_framing(report: dict[str, Any]) -> None:
    # The two plain chunks go on as they came (the engine's upper-case size included); the one with an
    # extension is decoded and framed again, without it.
    per_event = report["relaying"]["per_event"]
    assert per_event["raw_reads"] == 2, per_event
    assert per_event["client"] == ('f\r\ndata: {"a":1}\n\n\r\nF\r\ndata: {"b":2}\n\n\r\n'
                                   "5\r\nhello\r\n0\r\n\r\n"), per_event


def test_only_whole_plain_chunks_short_of_the_last_are_relayed_as_they_are(report: dict[str, Any]) -> None:
    assert report["relaying"]["whole_chunks"] == {
        "3\r\nabc\r\n": True, "3\r\nabc\r\nA\r\n0123456789\r\n": True,
        "3\r\nabc\r\n0\r\n\r\n": False,  # the last chunk: the answer's end is the slow path's
        "3\r\nabc": False, "3;x=1\r\nabc\r\n": False, " 3\r\nabc\r\n": False, "3\r\nabcXY": False,
        "0\r\n\r\n": False, "1_0\r\n0123456789abcdef\r\n": False}


def test_length_close_and_bodiless_answers_end_where_http_says(report: dict[str, Any]) -> None:
    length, close, empty = (report["decoding"][n]["outcome"] for n in ("length", "close", "empty"))
    assert (length["status"], length["body"], length["keep_alive"], length["done"]) == (400, '{"error":1}', True, 1)
    # HTTP/1.0 without a length: the body is what came before the connection's end, never reused
    assert (close["body"], close["keep_alive"], close["done"]) == ("until the end", False, 1)
    assert (empty["status"], empty["body"], empty["done"]) == (204, "", 1)


@pytest.mark.parametrize("name", ["bad_size", "no_crlf", "not_http", "bad_header", "head_too_big"])
def test_a_malformed_answer_fails_and_its_connection_is_dropped(report: dict[str, Any], name: str) -> None:
    out = report["decoding"][name]["outcome"]
    assert (out["error"], out["ended"], out["done"]) == ("EngineError", True, 0) and out["discarded"] >= 1, out


def test_connections_are_kept_alive_and_one_the_engine_closed_is_not_reused(report: dict[str, Any]) -> None:
    pooling = report["pooling"]
    assert pooling["kept_alive"] == {"bodies": ["{}", "{}", "{}"], "connections": 1}
    assert pooling["closed_by_engine"] == {"bodies": ["{}", "{}"], "connections": 2}


@pytest.mark.parametrize("name", ["extra_same_read", "extra_later"])
def test_a_connection_with_bytes_after_an_answer_is_not_reused(report: dict[str, Any], name: str) -> None:
    """Bytes the engine sends after an answer's end (with it, or a moment later and not yet read by
    the loop when the next request comes) are no answer to the next request: a new connection is."""
    seen = report["pooling"][name]
    assert seen["bodies"] == ["{}", "[]"] and seen["connections"] == 2, seen
    if name == "extra_same_read":
        assert seen["keep_alive"] is False


def test_a_request_on_a_connection_the_engine_dropped_is_retried_once(report: dict[str, Any]) -> None:
    assert report["pooling"]["stale_retried"] == {"body": "{}", "connections": 2}


def test_a_silent_engine_times_out_and_a_refused_one_raises(report: dict[str, Any]) -> None:
    silent = report["pooling"]["silent"]  # the idle timeout is 0.3 s; a busy machine may add some
    assert silent["error"] == "TimeoutError" and 0.3 <= silent["seconds"] < 10, silent
    assert report["pooling"]["refused"] == "ConnectionRefusedError"


def test_a_first_connection_refused_is_tried_again_and_a_later_refusal_is_not(report: dict[str, Any]) -> None:
    # vLLM prints its load line before it listens on its bound port: the benchmark, the first
    # engine call, must not fail on that window; an engine gone after serving fails at once.
    late = report["pooling"]["late_listener"]
    assert isinstance(late, dict) and late["body"] == "{}" and late["seconds"] >= 0.25, late
    after = report["pooling"]["refused_after_first"]
    assert after["error"] == "ConnectionRefusedError" and after["seconds"] < 1.0, after


def test_only_plain_http_engine_urls_use_this_client(report: dict[str, Any]) -> None:
    assert report["engine_address"] == {"http://127.0.0.1:18000": ["127.0.0.1", 18000],
                                        "http://localhost": ["localhost", 80],
                                        "https://127.0.0.1:1": None, "http://h:1/prefix": None}


def test_a_multipart_body_is_built_as_the_sdk_built_it(report: dict[str, Any]) -> None:
    """forward.form_data, bakery's multipart body for an upload, against the SDK's own builder: the same
    parts (name, filename, content type, value) in the same order, the same refusal of bare bytes."""
    forms = report["forms"]
    assert forms.pop("bare_bytes") == ["TypeError", "TypeError"]
    for name, (ours, sdk) in forms.items():
        assert ours == sdk, name
    assert len(forms["file_and_fields"][0]) == 5  # four parts (None left out), and the multipart flag
