"""The request path of config/request_path.py is the one the worker runs.

Pure checks of the declaration (each stage's code exists, the kinds, the middleware ranks), then a real
SDK Worker built as core.run() builds it (tests/worker/request_path_probe.py): its aiohttp.web
middlewares, the layers of its signature check and of its engine call must be STAGES' own, in STAGES'
order, bakery's to the end of each chain. A reordering planted in the worker's code (the guards installed
in reverse) and one planted in the declaration are both caught. One signed request, traced on its way
through a route's handler to an engine and back, calls no function of the SDK.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from config import request_path
from tests.worker.helpers import HERE, WORKER_DIR, probe_facts

KINDS = ("listener", "middleware", "handler", "signature", "engine", "answer")
def mismatches(declared: tuple[request_path.Stage, ...], facts: dict[str, Any]) -> list[str]:
    """What a worker's observed chains (`facts`) do differently from `declared`, one line each."""
    found = []
    for kind in ("middleware", "signature", "engine"):
        want = [stage.name for stage in declared if stage.kind == kind]
        if facts[kind] != want:
            found.append(f"{kind}: the worker runs {facts[kind]}, config/request_path.py declares {want}")
    for kind in ("signature", "engine"):
        if facts[f"{kind}_inner"] != "NoneType":
            found.append(f"{kind}: the innermost layer wraps {facts[f'{kind}_inner']}, not nothing")
    return found


@pytest.fixture(scope="module")
def facts(worker_python: Path) -> dict[str, Any]:
    return probe_facts(worker_python, str(HERE / "request_path_probe.py"))


def test_every_stage_is_named_once_and_says_where_its_code_lives() -> None:
    names = [stage.name for stage in request_path.STAGES]
    assert len(names) == len(set(names))
    for stage in request_path.STAGES:
        assert stage.kind in KINDS and stage.refuses and stage.code, stage
        for path in re.findall(r"\b[\w/]+\.(?:py|c)\b", stage.code):
            assert (WORKER_DIR / path).is_file() or (WORKER_DIR.parent / path).is_file(), (stage.name, path)
    assert [kind for kind in KINDS if kind in {s.kind for s in request_path.STAGES}] == list(KINDS)


def test_the_middlewares_rank_in_the_declared_order() -> None:
    ranked = sorted(request_path.RANK, key=request_path.RANK.__getitem__)
    assert ranked == list(request_path.order("middleware"))
    assert request_path.middleware("drain", lambda: None)[0] == ranked.index("drain")
    with pytest.raises(KeyError):
        request_path.layer("no_such_stage", lambda: None, None)


def test_the_worker_runs_the_declared_path(facts: dict[str, Any]) -> None:
    assert mismatches(request_path.STAGES, facts) == []


def test_the_sdks_own_callers_reach_bakerys_chains(facts: dict[str, Any]) -> None:
    """The SDK's readiness benchmark and its handler of a session's requests call bakery's chains."""
    assert facts["sdk_reaches_bakerys"] == [True, True]


def test_a_request_passes_through_nothing_of_the_sdk(facts: dict[str, Any]) -> None:
    """Its parse, signature check, engine call, answer and record are bakery's: no SDK function runs."""
    request = facts["request"]
    assert request["status"] == 200 and '"ok"' in request["body"], request
    assert request["sdk_called"] == []
    # The same trace sees SDK code when some runs (else the check above proves nothing).
    assert request["control_called"] == ["serverless/server/lib/metrics.py:_request_id"], request["control_called"]


def test_a_reordering_planted_in_the_declaration_is_caught(facts: dict[str, Any]) -> None:
    stages = list(request_path.STAGES)
    first, second = (i for i, stage in enumerate(stages) if stage.name in ("own_url", "pubkey_retry"))
    stages[first], stages[second] = stages[second], stages[first]
    found = mismatches(tuple(stages), facts)
    assert len(found) == 1 and found[0].startswith("signature: the worker runs"), found


def test_a_reordering_planted_in_the_worker_is_caught(worker_python: Path) -> None:
    planted = probe_facts(worker_python, str(HERE / "request_path_probe.py"), "--plant")
    found = mismatches(request_path.STAGES, planted)
    assert [line.split(":")[0] for line in found] == ["signature"], found


def test_the_security_doc_shows_the_declared_path() -> None:
    text = (WORKER_DIR.parent / "docs" / "security.md").read_text(encoding="utf-8")
    table = text.split("<!-- request path: worker/config/request_path.py STAGES -->", 1)[1].split("\n\n", 1)[0]
    shown = [re.findall(r"`(\w+)`", line)[0] for line in table.strip().splitlines()[2:]]
    assert shown == [stage.name for stage in request_path.STAGES], "docs/security.md's table and STAGES differ"
