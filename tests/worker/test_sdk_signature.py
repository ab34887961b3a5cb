"""core.cache_signature(): inspect.signature() of the SDK's AuthData becomes a lookup asked for once
per envelope, nothing else changes.

vastai 1.9.1's `AuthData.from_json_msg` computes `inspect.signature(cls)` 7 times per request. The
worker states the signature once through `__signature__` (PEP 362). These tests prove that what
inspect returns is what it computed before, that a subclass still gets its own, and, on the real SDK
in the worker venv, that `from_json_msg` accepts and refuses exactly what it did.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from app import core
from tests.worker.helpers import WORKER_DIR


def _envelope_class() -> type:
    @dataclass
    class Envelope:
        cost: str
        reqnum: int
        url: str

    return Envelope


@pytest.fixture
def module(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """A fresh module `fake_sdk.data_types` holding a fresh dataclass `Envelope`."""
    fake = types.SimpleNamespace(Envelope=_envelope_class())
    monkeypatch.setitem(sys.modules, "fake_sdk.data_types", fake)
    return fake


def test_the_signature_is_computed_once_and_is_the_same(module: types.SimpleNamespace) -> None:
    cls = module.Envelope
    before = inspect.signature(cls)
    assert inspect.signature(cls) is not before  # computed afresh at every call: the cost removed
    assert core.cache_signature("fake_sdk.data_types", "Envelope") is True
    after = inspect.signature(cls)
    assert after == before
    assert list(after.parameters) == ["cost", "reqnum", "url"]
    assert inspect.signature(cls) is after


def test_twice_is_once(module: types.SimpleNamespace) -> None:
    assert core.cache_signature("fake_sdk.data_types", "Envelope") is True
    first = inspect.signature(module.Envelope)
    assert core.cache_signature("fake_sdk.data_types", "Envelope") is True
    assert inspect.signature(module.Envelope) is first


def test_a_subclass_gets_its_own_signature(module: types.SimpleNamespace) -> None:
    """An inherited `__signature__` would hand the subclass its parent's parameters: it must not."""
    core.cache_signature("fake_sdk.data_types", "Envelope")

    @dataclass
    class Wider(module.Envelope):  # type: ignore[name-defined,misc]
        extra: int = 0

    assert not hasattr(Wider, "__signature__")
    assert list(inspect.signature(Wider).parameters) == ["cost", "reqnum", "url", "extra"]
    assert list(inspect.signature(module.Envelope).parameters) == ["cost", "reqnum", "url"]


def test_instances_and_construction_are_untouched(module: types.SimpleNamespace) -> None:
    core.cache_signature("fake_sdk.data_types", "Envelope")
    made = module.Envelope(cost="8", reqnum=1, url="/v1/completions")
    assert not hasattr(made, "__signature__")
    assert made == module.Envelope("8", 1, "/v1/completions")
    with pytest.raises(TypeError):
        module.Envelope(cost="8")


@pytest.mark.parametrize(("module_name", "class_name"), [("fake_sdk.data_types", "Renamed"),
                                                         ("fake_sdk.absent", "Envelope")])
def test_a_changed_sdk_is_reported_and_untouched(module: types.SimpleNamespace, module_name: str,
                                                 class_name: str) -> None:
    assert core.cache_signature(module_name, class_name) is False
    assert "__signature__" not in module.Envelope.__dict__


def test_from_json_msg_is_replaced_once_and_only_with_the_modules_error(module: types.SimpleNamespace) -> None:
    class Refused(Exception):
        pass

    def parse(cls: type, json_msg: dict) -> object:
        return cls(**json_msg)

    module.Envelope.from_json_msg = classmethod(parse)
    assert core.cache_signature("fake_sdk.data_types", "Envelope") is True
    assert module.Envelope.__dict__["from_json_msg"].__func__ is parse  # no JsonDataException: untouched
    module.JsonDataException = Refused
    assert core.cache_signature("fake_sdk.data_types", "Envelope") is True
    replaced = module.Envelope.__dict__["from_json_msg"]
    assert replaced.__func__ is not parse
    assert core.cache_signature("fake_sdk.data_types", "Envelope") is True
    assert module.Envelope.__dict__["from_json_msg"] is replaced  # twice is once
    made = module.Envelope.from_json_msg({"url": "/v1/completions", "cost": "8", "reqnum": 1, "other": 2})
    assert made == module.Envelope(cost="8", reqnum=1, url="/v1/completions")
    with pytest.raises(Refused) as refused:
        module.Envelope.from_json_msg({"cost": "8"})
    assert refused.value.args == ({"reqnum": "missing parameter", "url": "missing parameter"},)


def test_the_default_is_the_sdks_auth_data() -> None:
    assert core.SDK_AUTH_DATA == ("vastai.serverless.server.lib.data_types", "AuthData")


REAL_SDK = textwrap.dedent("""
    import inspect, json, sys
    sys.path.insert(0, sys.argv[1])
    import vastai  # noqa: F401 (loads the serverless worker, as run() does)
    from vastai.serverless.server.lib.data_types import AuthData, JsonDataException
    from app import core

    FULL = {"cost": "8", "endpoint": "e", "reqnum": 3, "request_idx": 3, "signature": "s", "url": "/v1/completions"}
    CASES = [FULL, {**FULL, "extra": 1}, {k: v for k, v in FULL.items() if k != "url"}, {"cost": "8"}, {},
             {"extra": 1, **FULL}, list(FULL), "cost endpoint reqnum request_idx signature url"]
    real_signature, asked = inspect.signature, [0]

    def counted(obj, *args, **kwargs):
        asked[0] += 1
        return real_signature(obj, *args, **kwargs)

    inspect.signature = counted

    def outcomes():
        out = []
        for case in CASES:
            try:
                made = AuthData.from_json_msg(case if isinstance(case, str) else type(case)(case))
                out.append(["ok", repr(made), list(vars(made))])
            except JsonDataException as exc:
                out.append(["refused", exc.message])
            except Exception as exc:  # the same crash, where the SDK crashed
                out.append(["crash", type(exc).__name__, str(exc)])
        return out

    before, calls_before = outcomes(), asked[0]
    computed = real_signature(AuthData)
    cached = core.cache_signature()
    asked[0] = 0
    after, calls_after = outcomes(), asked[0]
    print(json.dumps({"cached": cached, "before": before, "after": after,
                      "calls": [calls_before, calls_after],
                      "same_signature": real_signature(AuthData) == computed,
                      "lookup": real_signature(AuthData) is real_signature(AuthData)}))
""")


@pytest.mark.slow
def test_real_sdk_auth_data(worker_python: Path) -> None:
    """In the worker venv: the class is found, and from_json_msg's answers are unchanged."""
    done = subprocess.run([str(worker_python), "-c", REAL_SDK, str(WORKER_DIR)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["cached"] is True
    assert got["after"] == got["before"]
    assert [kind for kind, *_ in got["after"]] == ["ok", "ok", "refused", "refused", "refused", "ok", "crash",
                                                   "crash"]
    # the SDK asks for the signature once, then once per key of an envelope it accepts (7 or 8 here);
    # now once, when installed (before the count restarts), and never per envelope
    assert got["calls"] == [7 + 8 + 1 + 1 + 1 + 8 + 1 + 1, 0], got["calls"]
    assert got["same_signature"] is True and got["lookup"] is True
