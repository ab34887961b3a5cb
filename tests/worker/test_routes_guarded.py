"""The guards of port 3000 on every route of the table, as the platform uses them: signed requests.

One secured worker (no UNSECURED; REPORT_ADDR is a local report server holding the platform's public
key, helpers.SigningKey signs as the platform does) serves every route of routes.ROUTES in front of
the recording vLLM stand-in, with the real SDK, through worker/start_server.sh. For each route: before
the model is loaded a signed request is 503; then an unsigned one, one signed for another worker's
URL, a malformed envelope and an oversized body are refused and never reach the engine, and a signed
one does (the stand-in records it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app import core
from config import routes
from tests.worker.helpers import SDK_READY, Harness, Proc, SigningKey, make_signing_key, post_enveloped

pytestmark = pytest.mark.slow
BODY_LIMIT = 1024 * 1024  # above every benchmark body (the largest, a 30 s clip, is 640 KB), small to send
ENGINE_LOAD_SECONDS = 4.0  # long enough to ask every route before the model is loaded


@dataclass
class Guarded:
    """The secured worker serving every route, and what the tests need to reach it."""

    port: int
    url: str  # the worker's own URL, as the platform signs it
    key: SigningKey
    record: Path  # the stand-in's record of every request it received
    worker: Proc
    early: dict[str, tuple[int, bytes, str]]  # per route: a signed request sent before the model loaded

    def auth(self, url: str | None = None) -> dict[str, Any]:
        """auth_data fields signed for `url` (default: this worker)."""
        target = url or self.url
        return {"signature": self.key.sign(target), "url": target}

    def received(self, marker: str) -> bool:
        """Whether the engine received a request carrying `marker`."""
        return self.record.exists() and marker in self.record.read_text()


def body_for(route: str, marker: str) -> dict[str, Any]:
    """A valid client request for `route` (its own benchmark request), tagged with `marker`."""
    inputs = routes.BenchmarkInputs(words=core.load_words(), model_id="standin-model", max_tokens=8)
    return {**routes.benchmark_generator(route, inputs)(), "user": marker}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory, worker_python: Path) -> Iterator[Guarded]:
    key = make_signing_key(worker_python)
    # The report server serves this module's signing key (the requests are signed with it).
    with Harness(tmp_path_factory.mktemp("routes-guarded"), worker_python, key.pem) as harness:
        record = harness.tmp / "engine.jsonl"
        engine = harness.standin("vllm", load_seconds=ENGINE_LOAD_SECONDS, STANDIN_RECORD=str(record))
        served = harness.worker("vllm", engine, UNSECURED=None, VLLM_MODEL="standin-model",
                                OPENAI_ROUTES=",".join(routes.ROUTES), BAKERY_MAX_BODY_BYTES=str(BODY_LIMIT),
                                OPENAI_MAX_UPLOAD_BYTES="600000")
        worker, port, reports = served.worker, served.port, harness.reports
        worker.wait_for("HTTP servers started", timeout=60)
        running = Guarded(port, f"http://127.0.0.1:{port}", key, record, worker, {})
        for route in routes.ROUTES:
            running.early[route] = post_enveloped(port, route, body_for(route, f"early-{route}"),
                                                  auth=running.auth())
        worker.wait_for(SDK_READY, timeout=90)
        reports.wait_loaded()
        yield running


def error_of(result: tuple[int, bytes, str], status: int) -> Any:
    """Assert `result` is `status` with a JSON body; return the decoded body."""
    got, body, ctype = result
    assert got == status, (got, body[:300])
    assert ctype.startswith("application/json"), ctype
    return json.loads(body)


def test_the_worker_serves_the_whole_table(guarded: Guarded) -> None:
    assert f"bakery-worker: serving: {', '.join(routes.ROUTES)}" in guarded.worker.text
    assert " max_body=1048576B " in guarded.worker.text  # set by hand: it wins, and fits one upload
    assert "cannot carry one OPENAI_MAX_UPLOAD_BYTES" not in guarded.worker.text


@pytest.mark.parametrize("route", list(routes.ROUTES))
def test_before_the_model_loads_every_route_is_503(route: str, guarded: Guarded) -> None:
    body = error_of(guarded.early[route], 503)
    assert body["error"] == "the model is not loaded yet"
    assert not guarded.received(f"early-{route}")


@pytest.mark.parametrize("route", list(routes.ROUTES))
def test_every_route_serves_only_what_the_platform_signed_for_this_worker(route: str, guarded: Guarded) -> None:
    port, refused = guarded.port, f"refused-{route}"
    unsigned = post_enveloped(port, route, body_for(route, refused), auth={"url": guarded.url})
    assert error_of(unsigned, 401)["error"] == "the request is not signed for this worker"
    elsewhere = f"http://127.0.0.1:{port + 7}"
    assert error_of(post_enveloped(port, route, body_for(route, refused), auth=guarded.auth(elsewhere)), 401)
    malformed = post_enveloped(port, route, body_for(route, refused), auth={**guarded.auth(), "reqnum": "5"})
    assert error_of(malformed, 422)["error"] == "auth_data.reqnum must be an integer"
    oversized = post_enveloped(port, route, {**body_for(route, refused), "pad": "x" * BODY_LIMIT},
                               auth=guarded.auth())
    assert "BAKERY_MAX_BODY_BYTES" in error_of(oversized, 413)["error"]
    assert not guarded.received(refused)

    served = f"served-{route}"
    status, answer, _ = post_enveloped(port, route, body_for(route, served), auth=guarded.auth())
    assert status == 200, answer[:300]
    assert guarded.received(served)
