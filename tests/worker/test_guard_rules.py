"""The guards' rules as plain functions (no SDK): limits and their variables, envelope shapes, query
redaction, session callbacks, backoff, the ACTIVE interface, UNSECURED and the kept access lines."""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any

import pytest

import tests.worker.helpers  # noqa: F401 (puts worker/ on sys.path first)
from app import core, output, worker_config
from policy import guards
from tests.worker.helpers import baked_facts
from workers.vllm.worker import DEFAULTS as VLLM

PLATFORM = {"CONTAINER_ID": "7", "REPORT_ADDR": "http://127.0.0.1:9", "PUBLIC_IPADDR": "127.0.0.1",
            "WORKER_PORT": "3000", "VAST_TCP_PORT_3000": "41000", **baked_facts("vllm")}
AUTH = {"cost": "8", "endpoint": "e", "reqnum": 1, "request_idx": 1, "signature": "c2ln", "url": "http://h:1"}


# --------------------------------------------------------------------------- ACTIVE and install()


def test_active_names_every_installer_once() -> None:
    assert len(set(guards.ACTIVE)) == len(guards.ACTIVE)
    assert set(guards.ACTIVE) == set(guards.INSTALLERS)
    assert all(name.isidentifier() and name == name.lower() for name in guards.ACTIVE)


BARE: dict[str, Any] = {"platform": None, "check_signature": lambda _auth: False, "call_engine": None}


def test_install_refuses_an_unknown_name() -> None:
    with pytest.raises(guards.GuardError, match=r"unknown guard.*own_ur"):
        guards.install(object(), guards.Limits(), routes=(), http_port=1, report_addr="", active=("own_ur",),
                       **BARE)


def test_install_refuses_without_the_sdk_server_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(__import__("sys").modules, guards.SERVER_MODULE, raising=False)
    with pytest.raises(guards.GuardError, match="vastai changed"):
        guards.install(object(), guards.Limits(), routes=(), http_port=1, report_addr="", active=(), **BARE)


def test_the_startup_line_lists_guards_and_limits() -> None:
    line = guards.describe(("own_url", "limits"), guards.Limits())
    assert line.startswith("bakery-worker: guards=own_url,limits max_body=16777216B ")
    for part in ("body_timeout=60s", "header_timeout=30s", "send_timeout=30s", "engine_connect=10s", "engine_idle=600s",
                 "retry_after=10s", "sessions=off", "session_lifetime<=600s", "max_sessions=10",
                 "pubkey_backoff<=60s"):
        assert part in line


# --------------------------------------------------------------------------- limits


def test_defaults() -> None:
    limits, errors = guards.load_limits({})
    assert errors == [] and limits == guards.Limits()
    assert limits.max_body_bytes == 16 * 1024 * 1024 and limits.sessions is False


def test_every_limit_has_a_variable() -> None:
    assert set(guards.VARIABLES) == {f for f in guards.Limits.__dataclass_fields__}
    names = [name for name, _, _ in guards.VARIABLES.values()]
    assert len(set(names)) == len(names) and all(n.startswith("BAKERY_") for n in names)


def test_values_are_read() -> None:
    env = {"BAKERY_MAX_BODY_BYTES": "1024", "BAKERY_ENGINE_IDLE_TIMEOUT": " 2.5 ", "BAKERY_SESSIONS": "Yes",
           "BAKERY_RETRY_AFTER": "3", "BAKERY_HEADER_TIMEOUT": "", "BAKERY_PUBKEY_BACKOFF_MAX": "0.5"}
    limits, errors = guards.load_limits(env)
    assert errors == []
    assert (limits.max_body_bytes, limits.engine_idle_timeout) == (1024, 2.5)
    assert (limits.sessions, limits.retry_after) == (True, 3)
    assert limits.header_timeout == 30.0 and limits.pubkey_backoff_max == 0.5


@pytest.mark.parametrize(("name", "raw"), [
    ("BAKERY_MAX_BODY_BYTES", "16M"), ("BAKERY_MAX_BODY_BYTES", "0"), ("BAKERY_MAX_BODY_BYTES", "-1"),
    ("BAKERY_MAX_BODY_BYTES", "1.5"), ("BAKERY_RETRY_AFTER", "ten"), ("BAKERY_MAX_SESSIONS", "0"),
    ("BAKERY_BODY_TIMEOUT", "0"), ("BAKERY_ENGINE_IDLE_TIMEOUT", "inf"), ("BAKERY_ENGINE_CONNECT_TIMEOUT", "nan"),
    ("BAKERY_HEADER_TIMEOUT", "-3"), ("BAKERY_SESSIONS", "on"), ("BAKERY_SESSIONS", "ture"),
    ("BAKERY_SESSION_MAX_LIFETIME", "1h"),
])
def test_a_bad_value_is_one_line_naming_it(name: str, raw: str) -> None:
    _, errors = guards.load_limits({name: raw})
    assert len(errors) == 1 and errors[0].startswith(f"{name}={raw!r} is ")
    assert "\n" not in errors[0]


def test_every_bad_value_is_reported_at_once() -> None:
    _, errors = guards.load_limits({"BAKERY_MAX_BODY_BYTES": "x", "BAKERY_RETRY_AFTER": "y"})
    assert [e.split("=")[0] for e in errors] == ["BAKERY_MAX_BODY_BYTES", "BAKERY_RETRY_AFTER"]


# --------------------------------------------------------------------------- UNSECURED


@pytest.mark.parametrize(("raw", "value"), [(None, False), ("", False), ("  ", False), ("true", True),
                                            (" TRUE ", True), ("1", True), ("yes", True), ("false", False),
                                            ("0", False), ("No", False)])
def test_unsecured_is_read_like_serverless(raw: str | None, value: bool) -> None:
    env = dict(PLATFORM) if raw is None else {**PLATFORM, "UNSECURED": raw}
    assert worker_config.load_settings(VLLM, env).unsecured is value


@pytest.mark.parametrize("raw", ["ture", "on", "t", "y", "2", "off", "true false"])
def test_an_unsecured_typo_is_a_config_error(raw: str) -> None:
    with pytest.raises(core.ConfigError) as err:
        worker_config.load_settings(VLLM, {**PLATFORM, "UNSECURED": raw})
    assert err.value.lines == [f"UNSECURED={raw!r} is neither true nor false: set UNSECURED=true or false "
                               "(true/1/yes, false/0/no) or leave it unset"]


# --------------------------------------------------------------------------- envelopes

VALID = {"auth_data": AUTH, "payload": {"prompt": "hi"}}
MALFORMED = {
    "null body": None,
    "number body": 5,
    "string body": "auth_data payload",
    "list body": [VALID],
    "auth_data null": {"auth_data": None, "payload": {}},
    "auth_data number": {"auth_data": 3, "payload": {}},
    "auth_data magic string": {"auth_data": "costendpointreqnumrequest_idxsignatureurl", "payload": {}},
    "auth_data list": {"auth_data": list(AUTH), "payload": {}},
    "auth_data missing": {"payload": {}},
    "reqnum list": {"auth_data": {**AUTH, "reqnum": [1]}, "payload": {}},
    "reqnum string": {"auth_data": {**AUTH, "reqnum": "1"}, "payload": {}},
    "reqnum bool": {"auth_data": {**AUTH, "reqnum": True}, "payload": {}},
    "request_idx object": {"auth_data": {**AUTH, "request_idx": {"a": 1}}, "payload": {}},
    "request_idx float": {"auth_data": {**AUTH, "request_idx": 1.5}, "payload": {}},
    "signature null": {"auth_data": {**AUTH, "signature": None}, "payload": {}},
    "url number": {"auth_data": {**AUTH, "url": 5}, "payload": {}},
    "field missing": {"auth_data": {k: v for k, v in AUTH.items() if k != "url"}, "payload": {}},
    "payload null": {"auth_data": AUTH, "payload": None},
    "payload list": {"auth_data": AUTH, "payload": [1]},
    "payload missing": {"auth_data": AUTH},
    "session_id list": {**VALID, "session_id": [1]},
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_envelopes_are_named(name: str) -> None:
    error = guards.envelope_error(MALFORMED[name])
    assert isinstance(error, str) and error


@pytest.mark.parametrize("envelope", [VALID, {**VALID, "session_id": "abc"}, {**VALID, "session_id": None},
                                      {"auth_data": {**AUTH, "cost": 8.5, "extra": 1}, "payload": {"input": {}}},
                                      {"auth_data": {**AUTH, "cost": None, "endpoint": None}, "payload": {}}])
def test_valid_envelopes_pass(envelope: dict) -> None:
    assert guards.envelope_error(envelope) is None


# --------------------------------------------------------------------------- query strings


@pytest.mark.parametrize(("text", "clean"), [
    ('127.0.0.1 "POST /route/?api_key=SECRET HTTP/1.1" 200', '127.0.0.1 "POST /route/?<redacted> HTTP/1.1" 200'),
    ("on_close POST failed: route=http://h/x?token=abc&b=2 status=500",
     "on_close POST failed: route=http://h/x?<redacted> status=500"),
    ('"GET /a?b HTTP/1.1" "http://ref/?k=v"', '"GET /a?<redacted> HTTP/1.1" "http://ref/?<redacted>"'),
    ("is the model loaded? yes", "is the model loaded? yes"),
    # quotes and angle brackets inside the query are the query's (they used to end it)
    ("\"POST /v1?'api_key=SECRET HTTP/1.1\" 401", "\"POST /v1?<redacted> HTTP/1.1\" 401"),
    ('"POST /v1?a"b=SECRET&c<d>=SECRET HTTP/1.1"', '"POST /v1?<redacted> HTTP/1.1"'),
    ("url <http://h/?token=SECRET>", "url <http://h/?<redacted>>"),
    ("r='http://h/?k=SECRET'", "r='http://h/?<redacted>'"),
    ("no query here", "no query here"),
])
def test_query_strings_are_redacted(text: str, clean: str) -> None:
    assert guards.redact_query(text) == clean
    assert guards.redact_query(clean) == clean  # a record may pass the filter twice


def test_the_redactor_rewrites_the_record() -> None:
    record = logging.LogRecord("aiohttp.access", logging.INFO, __file__, 1, '"%s /v1?api_key=%s"', ("POST", "K"), None)
    assert guards.QueryRedactor().filter(record) is True
    assert record.getMessage() == '"POST /v1?<redacted>"'


# --------------------------------------------------------------------------- sessions


HOSTS = guards.report_hosts("https://run.vast.ai, http://10.0.0.5:8000/")


def test_report_hosts() -> None:
    assert {"run.vast.ai", "10.0.0.5"} == HOSTS


@pytest.mark.parametrize("route", [None, "https://run.vast.ai/session/closed", "http://10.0.0.5:9/x?y=1",
                                   "https://RUN.vast.ai:8443/z"])
def test_callbacks_to_the_autoscaler_are_allowed(route: str | None) -> None:
    assert guards.callback_error(route, HOSTS) is None


@pytest.mark.parametrize("route", ["http://169.254.169.254/latest/meta-data", "http://127.0.0.1:22/",
                                   "file:///etc/passwd", "https://run.vast.ai.evil.example/",
                                   "https://user:pw@run.vast.ai/", "gopher://run.vast.ai/", 5,
                                   "http://run.vast.ai:99999/", "//run.vast.ai/x"])
def test_other_callbacks_are_refused(route: object) -> None:
    assert guards.callback_error(route, HOSTS)


@pytest.mark.parametrize(("payload", "ok"), [({}, True), ({"lifetime": 600}, True), ({"lifetime": 0.5}, True),
                                             ({"lifetime": 601}, False), ({"lifetime": 0}, False),
                                             ({"lifetime": -1}, False), ({"lifetime": "60"}, False),
                                             ({"lifetime": True}, False), ({"lifetime": float("inf")}, False),
                                             (None, False), ({"on_close_route": "http://evil/"}, False)])
def test_session_create_rules(payload: object, ok: bool) -> None:
    assert (guards.session_create_error(payload, 600.0, HOSTS) is None) is ok


# --------------------------------------------------------------------------- backoff


def test_backoff_doubles_to_its_cap() -> None:
    assert list(itertools.islice(guards.backoff(60.0), 9)) == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert list(itertools.islice(guards.backoff(0.5), 3)) == [0.5, 0.5, 0.5]


# --------------------------------------------------------------------------- access lines kept


@pytest.mark.parametrize(("line", "kept"), [
    ("POST /session/create HTTP/1.1", True), ("POST /session/end?x=1 HTTP/1.1", True),
    ("POST /pyworker/update HTTP/1.1", True), ("POST /pyworker HTTP/1.1", True),
    ("POST /v1/completions HTTP/1.1", False), ("POST /sessions HTTP/1.1", False), ("", False),
])
def test_2xx_access_lines_of_sessions_and_pyworker_are_kept(line: str, kept: bool) -> None:
    logger = logging.getLogger(f"test.access.{time.time_ns()}")
    logger.propagate = False
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    logger.addFilter(output.AccessLines())
    logger.warning("access", extra={"response_status": 200, "first_request_line": line})
    assert bool(seen) is kept
