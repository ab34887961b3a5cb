"""Unit tests for every environment rule of the worker (app/core.py), no SDK needed."""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tests.worker.helpers  # noqa: F401 (puts worker/ on sys.path first)
from app import core, ports, sdk_config, worker_config
from app.ports import PortBusy
from app.worker_config import ConfigError
from tests.worker.helpers import baked_facts, free_port_pair
from workers.llama.worker import DEFAULTS as LLAMA
from workers.sglang.worker import DEFAULTS as SGLANG
from workers.vllm.worker import DEFAULTS as VLLM

PLATFORM = {"CONTAINER_ID": "7", "REPORT_ADDR": "http://127.0.0.1:9", "PUBLIC_IPADDR": "127.0.0.1",
            "WORKER_PORT": "3000", "VAST_TCP_PORT_3000": "41000", **baked_facts("vllm")}


def settings(**env: str) -> core.Settings:
    """load_settings for vLLM with the platform variables plus `env`."""
    return worker_config.load_settings(VLLM, {**PLATFORM, **env})


# --------------------------------------------------------------------------- engine defaults


@pytest.mark.parametrize(("defaults", "log", "load", "errors"), [
    (VLLM, "/var/log/portal/vllm.log", ["Application startup complete."],
     ["INFO exited: vllm", "RuntimeError: Engine", "Traceback (most recent call last):"]),
    (SGLANG, "/var/log/portal/sglang.log", ["The server is fired up and ready to roll!"],
     ["INFO exited: sglang", "Traceback (most recent call last):"]),
    (LLAMA, "/var/log/portal/llama.log", ["model loaded"],
     ["INFO exited: llama", "error loading model", "failed to load model"]),
], ids=lambda value: getattr(value, "engine", None))
def test_the_baked_engine_facts_are_upstreams(defaults: Any, log: str, load: list[str], errors: list[str]) -> None:
    """What each image bakes from its spec, as the worker resolves it, is upstream's (docs/engines.md,
    "Upstream's worker"), or adds error lines the spec's notes declare; the adapter states none of it."""
    from bakery.spec.engine_spec import load_engine

    resolved = worker_config.load_settings(defaults, {**PLATFORM, **baked_facts(defaults.engine)})
    assert (resolved.engine, resolved.model_log, resolved.load_lines) == (defaults.engine, log, load)
    assert resolved.error_lines[:len(errors)] == errors
    if resolved.error_lines != errors:
        assert "MODEL_ERROR_LOG_MSGS" in load_engine(defaults.engine).notes, resolved.error_lines
    assert (resolved.info_lines, resolved.healthcheck_url) == (['"message":"Download'], "http://127.0.0.1:18000/health")
    assert {f.name for f in dataclasses.fields(defaults)} == {"engine", "ready_connections", "front_processes"}


def test_openai_alias_imports_the_vllm_defaults() -> None:
    """BACKEND=openai is vllm by import: the very same object, no copy."""
    import workers.openai.worker as alias

    assert alias.DEFAULTS is VLLM
    source = Path(alias.__file__).read_text()
    assert "EngineDefaults(" not in source


def test_engine_workers_are_only_defaults() -> None:
    """Each engine's worker.py is a few lines: its defaults and the call to run()."""
    for engine in ("vllm", "sglang", "llama"):
        path = Path(core.__file__).parents[1] / "workers" / engine / "worker.py"
        code = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        assert len(code) <= 15, path


# --------------------------------------------------------------------------- log-line lists


@pytest.mark.parametrize(("raw", "expected"), [
    ('["Application startup complete."]', ["Application startup complete."]),
    ('  [" a ", "", "b"]  ', ["a", "b"]),
    ("one\n  two  \n\n three", ["one", "two", "three"]),
    ("single line", ["single line"]),
    ('["not closed"', ['["not closed"']),          # not JSON: one line
    ("[1, 2]", ["[1, 2]"]),                        # not an array of strings: split on newlines
    ('["a"]\n["b"]', ['["a"]', '["b"]']),          # not one JSON value
    ('"message":"Download', ['"message":"Download']),
])
def test_parse_lines(raw: str, expected: list[str]) -> None:
    """JSON array of strings (the baked form) or newline-separated; stripped, empties dropped."""
    assert worker_config.parse_lines(raw) == expected


@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20), max_size=6))
def test_parse_lines_json_round_trip(items: list[str]) -> None:
    """Any list baked as a JSON array comes back stripped, without empty items, in order."""
    assert worker_config.parse_lines(json.dumps(items)) == [s.strip() for s in items if s.strip()]


@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Zl", "Zp", "Cc")), max_size=20),
                max_size=6))
def test_parse_lines_newline_form(items: list[str]) -> None:
    """A real newline always separates items (unless the whole value is a JSON array of strings)."""
    raw = "\n".join(items)
    if raw.strip().startswith("["):
        return
    assert worker_config.parse_lines(raw) == [s.strip() for s in items if s.strip()]


@pytest.mark.parametrize("var", ["MODEL_LOAD_LOG_MSG", "MODEL_ERROR_LOG_MSGS", "MODEL_INFO_LOG_MSGS"])
def test_log_line_variables(var: str) -> None:
    """Each list variable is read in either form. The info lines have a default (unset, blank or empty
    falls back to it); the load and error lines are the engine's facts: only baked, never defaulted, so
    unset, blank or empty is one line naming the variable (exit 2)."""
    attr = {"MODEL_LOAD_LOG_MSG": "load_lines", "MODEL_ERROR_LOG_MSGS": "error_lines",
            "MODEL_INFO_LOG_MSGS": "info_lines"}[var]
    assert getattr(settings(**{var: '["x", " y "]'}), attr) == ["x", "y"]
    assert getattr(settings(**{var: "x\ny"}), attr) == ["x", "y"]
    if var == "MODEL_INFO_LOG_MSGS":
        default = list(worker_config.DEFAULT_INFO_LINES)
        for blank in ("", "  \n "):
            assert getattr(settings(**{var: blank}), attr) == default
        s = settings(**{var: "[]"})
        assert getattr(s, attr) == default
        assert len(s.warnings) == 1 and var in s.warnings[0]
        return
    for missing in ("", "  \n "):
        with pytest.raises(ConfigError) as err:
            settings(**{var: missing})
        assert len(err.value.lines) == 1 and err.value.lines[0].startswith(f"{var} is not set: an image bakes it")
    with pytest.raises(ConfigError) as err:
        settings(**{var: "[]"})
    assert err.value.lines == [f"{var}='[]' holds no log line: set the engine's lines (a JSON list of strings, "
                               "or one per line)"]


# --------------------------------------------------------------------------- MODEL_LOG, model id, URLs


def test_model_log() -> None:
    """MODEL_LOG is the baked one, or a launch's; empty (or blank) counts as unset, and unset names it."""
    assert settings().model_log == "/var/log/portal/vllm.log"
    assert settings(MODEL_LOG="/tmp/x.log").model_log == "/tmp/x.log"
    assert worker_config.load_settings(LLAMA, {**PLATFORM, **baked_facts("llama")}).model_log == \
        "/var/log/portal/llama.log"
    for blank in ("", "   "):
        with pytest.raises(ConfigError) as err:
            settings(MODEL_LOG=blank)
        assert [line.split(":")[0] for line in err.value.lines] == ["MODEL_LOG is not set"]


@pytest.mark.parametrize(("env", "expected"), [
    ({}, None),
    ({"LLAMA_MODEL": "l"}, "l"),
    ({"SGLANG_MODEL": "s", "LLAMA_MODEL": "l"}, "s"),
    ({"VLLM_MODEL": "v", "SGLANG_MODEL": "s"}, "v"),
    ({"MODEL_NAME": "m", "VLLM_MODEL": "v"}, "m"),
    ({"MODEL_NAME": "", "VLLM_MODEL": " ", "SGLANG_MODEL": "s"}, "s"),
])
def test_model_id_precedence(env: dict[str, str], expected: str | None) -> None:
    """First non-empty of MODEL_NAME, VLLM_MODEL, SGLANG_MODEL, LLAMA_MODEL."""
    assert worker_config.resolve_model_id(env) == expected


@pytest.mark.parametrize(("url", "base", "port"), [
    (None, "http://127.0.0.1", 18000),
    ("", "http://127.0.0.1", 18000),
    ("http://127.0.0.1:8080", "http://127.0.0.1", 8080),
    ("http://127.0.0.1:8080/", "http://127.0.0.1", 8080),
    ("http://localhost", "http://localhost", 80),
    ("https://engine.internal", "https://engine.internal", 443),
    ("http://[::1]:9000", "http://[::1]", 9000),
])
def test_model_server_url(url: str | None, base: str, port: int) -> None:
    """MODEL_SERVER_URL gives the SDK's model_server_url (scheme://host) and port."""
    env = {} if url is None else {"MODEL_SERVER_URL": url}
    full, got_base, got_port = worker_config.resolve_server(env)
    assert (got_base, got_port) == (base, port)
    assert full == f"{base}:{port}"


@pytest.mark.parametrize("url", ["127.0.0.1:18000", "ftp://host:1", "http://host:1/v1", "http://host:99999",
                                 "http://host:1?x=1", "http://:80"])
def test_model_server_url_rejected(url: str) -> None:
    """Anything but an http(s) origin is a one-line config error naming the variable."""
    with pytest.raises(ConfigError) as err:
        worker_config.resolve_server({"MODEL_SERVER_URL": url})
    assert "MODEL_SERVER_URL" in err.value.lines[0]


@pytest.mark.parametrize(("endpoint", "expected"), [
    (None, "http://127.0.0.1:18000/health"),
    ("/health", "http://127.0.0.1:18000/health"),
    ("health", "http://127.0.0.1:18000/health"),
    ("/v1/models", "http://127.0.0.1:18000/v1/models"),
    ("http://127.0.0.1:18000/health", "http://127.0.0.1:18000/health"),
    ("http://10.0.0.5:9999/ping", "http://10.0.0.5:9999/ping"),
])
def test_health_endpoint(endpoint: str | None, expected: str) -> None:
    """A path resolves against the engine server's URL; a full URL is used as is."""
    env = {} if endpoint is None else {"MODEL_HEALTH_ENDPOINT": endpoint}
    assert settings(**env).healthcheck_url == expected


def test_health_endpoint_follows_model_server_url() -> None:
    """The default /health resolves against MODEL_SERVER_URL, not a fixed port."""
    assert settings(MODEL_SERVER_URL="http://127.0.0.1:8080").healthcheck_url == "http://127.0.0.1:8080/health"


# --------------------------------------------------------------------------- numbers


NUMBER_VARS = [
    ("BENCHMARK_RUNS", "benchmark_runs", 3),
    ("BENCHMARK_CONCURRENCY", "benchmark_concurrency", 10),
    ("BENCHMARK_MAX_TOKENS", "benchmark_max_tokens", 500),
    ("READINESS_TIMEOUT", "readiness_timeout", 1800.0),
    ("HEALTHCHECK_PROBE_TIMEOUT", "healthcheck_probe_timeout", 30.0),
]


@pytest.mark.parametrize(("var", "attr", "default"), NUMBER_VARS)
def test_number_defaults(var: str, attr: str, default: float) -> None:
    """Unset or empty: the upstream default, no warning."""
    for s in (settings(), settings(**{var: ""})):
        assert getattr(s, attr) == default
        assert s.warnings == []


@pytest.mark.parametrize(("var", "attr", "default"), NUMBER_VARS)
@pytest.mark.parametrize("bad", ["abc", "0", "-1", "-0.5", "inf", "-inf", "nan", "NaN", "1e999", "0x10", "1,5"])
def test_bad_numbers_fall_back_with_one_warning(var: str, attr: str, default: float, bad: str) -> None:
    """Not a number, 0, negative, inf, nan → the default, with one warning naming the variable."""
    s = settings(**{var: bad})
    assert getattr(s, attr) == default
    assert len(s.warnings) == 1
    assert s.warnings[0].startswith(f"{var}=")


@pytest.mark.parametrize(("var", "attr", "raw", "value"), [
    ("BENCHMARK_RUNS", "benchmark_runs", " 1 ", 1),
    ("BENCHMARK_CONCURRENCY", "benchmark_concurrency", "4", 4),
    ("BENCHMARK_MAX_TOKENS", "benchmark_max_tokens", "8", 8),
    ("READINESS_TIMEOUT", "readiness_timeout", "90.5", 90.5),
    ("HEALTHCHECK_PROBE_TIMEOUT", "healthcheck_probe_timeout", "1e1", 10.0),
])
def test_good_numbers(var: str, attr: str, raw: str, value: float) -> None:
    """A positive (finite) number is taken."""
    s = settings(**{var: raw})
    assert getattr(s, attr) == value
    assert s.warnings == []


def test_counts_must_be_whole() -> None:
    """A fraction is not a count of runs: default and a warning."""
    s = settings(BENCHMARK_RUNS="2.5")
    assert s.benchmark_runs == 3 and len(s.warnings) == 1


@given(st.text(max_size=12))
def test_float_rule_never_returns_unusable(raw: str) -> None:
    """Whatever the text, the timeout is positive and finite."""
    warnings: list[str] = []
    value = worker_config.env_positive_float({"X": raw}, "X", 30.0, warnings)
    assert math.isfinite(value) and value > 0
    assert len(warnings) <= 1


@given(st.text(max_size=12))
def test_int_rule_never_returns_unusable(raw: str) -> None:
    """Whatever the text, the count is a positive integer."""
    warnings: list[str] = []
    value = worker_config.env_positive_int({"X": raw}, "X", 3, warnings)
    assert isinstance(value, int) and value > 0
    assert len(warnings) <= 1


# --------------------------------------------------------------------------- readiness


def test_readiness_mode() -> None:
    """READINESS defaults to logs; healthcheck is accepted; anything else warns and means logs."""
    assert settings().readiness == "logs"
    assert settings(READINESS="healthcheck").readiness == "healthcheck"
    assert settings(READINESS=" HealthCheck ").readiness == "healthcheck"
    s = settings(READINESS="magic")
    assert s.readiness == "logs" and len(s.warnings) == 1 and "READINESS" in s.warnings[0]


@dataclass
class OldWorkerConfig:
    """Shaped like vastai 1.9.1's WorkerConfig: no readiness fields."""

    model_server_url: str | None = None
    handlers: list[Any] = field(default_factory=list)


@dataclass
class NewWorkerConfig(OldWorkerConfig):
    """Shaped like the upstream draft: health-gated readiness fields."""

    readiness: str = "logs"
    readiness_timeout: float = 1800.0
    healthcheck_probe_timeout: float = 30.0


def test_readiness_passed_when_the_sdk_accepts_it() -> None:
    """An SDK whose WorkerConfig takes readiness settings gets all three, from env."""
    s = settings(READINESS="healthcheck", READINESS_TIMEOUT="600", HEALTHCHECK_PROBE_TIMEOUT="12")
    kwargs, note = sdk_config.readiness_kwargs(s, NewWorkerConfig)
    assert kwargs == {"readiness": "healthcheck", "readiness_timeout": 600.0, "healthcheck_probe_timeout": 12.0}
    assert note.startswith("readiness: healthcheck")
    NewWorkerConfig(**kwargs)  # accepted


def test_readiness_left_out_on_an_old_sdk() -> None:
    """An SDK without them (vastai 1.9.1) gets none, and the note says log mode once."""
    s = settings(READINESS="healthcheck")
    kwargs, note = sdk_config.readiness_kwargs(s, OldWorkerConfig)
    assert kwargs == {}
    assert "logs" in note and "READINESS=healthcheck ignored" in note
    kwargs, note = sdk_config.readiness_kwargs(settings(), OldWorkerConfig)
    assert kwargs == {} and "ignored" not in note


def test_readiness_feature_detection_uses_the_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    """Detection reads inspect.signature: a fake signature flips the branch on the same class."""
    s = settings(READINESS="healthcheck")
    assert sdk_config.readiness_kwargs(s, OldWorkerConfig)[0] == {}
    fake = inspect.signature(NewWorkerConfig)
    monkeypatch.setattr(sdk_config.inspect, "signature", lambda cls: fake)
    assert sdk_config.readiness_kwargs(s, OldWorkerConfig)[0]["readiness"] == "healthcheck"


# --------------------------------------------------------------------------- platform variables


@pytest.mark.parametrize("missing", ["CONTAINER_ID", "REPORT_ADDR", "WORKER_PORT", "VAST_TCP_PORT_3000",
                                     "PUBLIC_IPADDR"])
def test_missing_platform_variable(missing: str) -> None:
    """One line naming the variable and what normally sets it, instead of a KeyError in the SDK."""
    env = {k: v for k, v in PLATFORM.items() if k != missing}
    with pytest.raises(ConfigError) as err:
        worker_config.load_settings(VLLM, env)
    assert len(err.value.lines) == 1
    line = err.value.lines[0]
    assert line.startswith(missing)
    assert "Vast.ai platform" in line
    if missing == "VAST_TCP_PORT_3000":
        assert "EXPOSE 3000" in line and "mapped" in line


def test_empty_platform_variable_counts_as_missing() -> None:
    """REPORT_ADDR='' would make the SDK post to a relative path: treated as missing."""
    with pytest.raises(ConfigError) as err:
        worker_config.load_settings(VLLM, {**PLATFORM, "REPORT_ADDR": ""})
    assert err.value.lines[0].startswith("REPORT_ADDR")


def test_all_missing_gives_one_line_each() -> None:
    """Nothing set: one line per variable (the mapped port cannot be named without WORKER_PORT)."""
    with pytest.raises(ConfigError) as err:
        worker_config.load_settings(VLLM, {})
    assert [line.split()[0] for line in err.value.lines] == ["CONTAINER_ID", "REPORT_ADDR", "PUBLIC_IPADDR",
                                                             "WORKER_PORT"]


@pytest.mark.parametrize(("var", "value"), [("WORKER_PORT", "abc"), ("WORKER_PORT", "70000"), ("WORKER_PORT", "0"),
                                            ("CONTAINER_ID", "one"), ("WORKER_HTTP_PORT", "x")])
def test_malformed_platform_variable(var: str, value: str) -> None:
    """A value the SDK would crash on (int()) is named in one line."""
    with pytest.raises(ConfigError) as err:
        worker_config.load_settings(VLLM, {**PLATFORM, var: value})
    assert err.value.lines[0].startswith(f"{var}=")


def test_worker_ports() -> None:
    """The SDK binds WORKER_PORT and WORKER_HTTP_PORT (default WORKER_PORT+1)."""
    s = settings()
    assert (s.worker_port, s.worker_http_port) == (3000, 3001)
    assert settings(WORKER_HTTP_PORT="4000").worker_http_port == 4000


# --------------------------------------------------------------------------- banner and requests


def test_banner() -> None:
    """The engine's name; with BACKEND=openai, vllm and the alias noted."""
    assert core.banner(settings()) == "Using worker backend: vllm"
    assert core.banner(settings(BACKEND="vllm")) == "Using worker backend: vllm"
    assert core.banner(settings(BACKEND="openai")) == "Using worker backend: vllm (BACKEND=openai is an alias of vllm)"
    llama = worker_config.load_settings(LLAMA, {**PLATFORM, "BACKEND": "llama"})
    assert core.banner(llama) == "Using worker backend: llama"


def test_benchmark_prompt_is_shipped_data() -> None:
    """The prompt comes from the worker's own word list: no download, no NLTK."""
    words = core.load_words()
    assert len(words) >= 200 and len(set(words)) == len(words)
    assert all(w.isalpha() for w in words)
    source = Path(core.__file__).read_text()
    assert "nltk" not in source.lower().replace("no nltk", "")


def test_routes_are_resolved_with_the_settings() -> None:
    """OPENAI_ROUTES / BENCHMARK_ROUTE are read by load_settings (before the SDK is imported); the
    benchmark size defaults to the benchmarked route's own, BENCHMARK_RUNS/CONCURRENCY still win."""
    s = settings()
    assert s.routes.routes == ("/v1/completions", "/v1/chat/completions")
    assert s.routes.benchmark_route == "/v1/completions"
    assert (s.benchmark_runs, s.benchmark_concurrency) == (3, 10)
    s = settings(OPENAI_ROUTES="/v1/audio/transcriptions", BENCHMARK_ROUTE="/v1/audio/transcriptions/")
    assert s.routes.routes == ("/v1/audio/transcriptions",)
    assert (s.benchmark_runs, s.benchmark_concurrency) == (2, 4)  # the route's own size
    s = settings(BENCHMARK_ROUTE="/v1/videos/sync", BENCHMARK_RUNS="5", BENCHMARK_CONCURRENCY="x")
    assert s.routes.routes[-1] == "/v1/videos/sync" and (s.benchmark_runs, s.benchmark_concurrency) == (5, 1)
    assert s.warnings == ["BENCHMARK_CONCURRENCY='x' is not a positive integer; using the default 1"]


def test_route_warnings_join_the_settings_warnings() -> None:
    s = settings(BENCHMARK_ROUTE="/v1/audio/speech/batch", OPENAI_MAX_UPLOAD_BYTES="lots")
    assert [w.split("=")[0] for w in s.warnings] == ["BENCHMARK_ROUTE", "OPENAI_MAX_UPLOAD_BYTES"]


@pytest.mark.parametrize(("env", "first"), [
    ({"OPENAI_ROUTES": "/v1/embedding"}, "OPENAI_ROUTES names '/v1/embedding', which is not a route"),
    ({"BENCHMARK_ROUTE": "/v1/speech"}, "BENCHMARK_ROUTE='/v1/speech' is not a route"),
    ({"OPENAI_ROUTES": "/v1/embeddings"}, "BENCHMARK_ROUTE=/v1/completions is not served: OPENAI_ROUTES"),
])
def test_bad_routes_are_config_errors(env: dict[str, str], first: str) -> None:
    """A RouteConfigError becomes the ConfigError run() prints as one line and exits 2 on."""
    with pytest.raises(ConfigError) as caught:
        settings(**env)
    assert len(caught.value.lines) == 1 and caught.value.lines[0].startswith(first)


# --------------------------------------------------------------------------- body limit vs uploads


MIB = 1024 * 1024


def reconcile(**env: str) -> tuple[Any, list[str], list[str]]:
    from policy import guards

    limits, errors = guards.load_limits(env)
    assert errors == []
    return worker_config.reconcile_limits(limits, settings(**env).routes, env)


def test_a_text_worker_keeps_the_16_mib_body_limit() -> None:
    for env in ({}, {"OPENAI_ROUTES": "/v1/completions,/v1/embeddings,/v1/rerank,/v1/images/generations"}):
        limits, notes, warnings = reconcile(**env)
        assert (limits.max_body_bytes, notes, warnings) == (16 * MIB, [], [])


@pytest.mark.parametrize("route", ["/v1/audio/transcriptions", "/v1/audio/translations", "/v1/images/edits",
                                   "/v1/videos/sync", "/v1/audio/speech", "/v1/audio/speech/batch"])
def test_a_worker_with_uploads_carries_the_upload_limit_in_its_body(route: str) -> None:
    """Unset BAKERY_MAX_BODY_BYTES follows OPENAI_MAX_REQUEST_UPLOAD_BYTES (64 MiB -> 96 MiB), so a
    25 MiB file (33.3 MiB of base64) and the 64 MiB request total both arrive; the note says so."""
    limits, notes, warnings = reconcile(BENCHMARK_ROUTE=route)
    assert limits.max_body_bytes == 96 * MIB and warnings == []
    assert notes == [f"BAKERY_MAX_BODY_BYTES={96 * MIB} (follows OPENAI_MAX_REQUEST_UPLOAD_BYTES={64 * MIB}: "
                     "routes with uploads are served; set BAKERY_MAX_BODY_BYTES to change it)"]
    assert limits.max_body_bytes > 64 * MIB * 4 / 3 + 8 * MIB  # base64 of the total, with room to spare
    limits, _, _ = reconcile(BENCHMARK_ROUTE=route, OPENAI_MAX_UPLOAD_BYTES=str(200 * MIB))
    assert limits.max_body_bytes == 300 * MIB  # the request total never sits below one file
    limits, _, _ = reconcile(BENCHMARK_ROUTE=route, OPENAI_MAX_REQUEST_UPLOAD_BYTES=str(MIB),
                             OPENAI_MAX_UPLOAD_BYTES=str(MIB))
    assert limits.max_body_bytes == 16 * MIB  # never below the text default


def test_a_body_limit_set_by_hand_wins_and_warns_when_no_file_fits() -> None:
    limits, notes, warnings = reconcile(OPENAI_ROUTES="/v1/audio/transcriptions",
                                        BENCHMARK_ROUTE="/v1/audio/transcriptions",
                                        BAKERY_MAX_BODY_BYTES=str(16 * MIB))
    assert limits.max_body_bytes == 16 * MIB and notes == []
    assert warnings == [f"BAKERY_MAX_BODY_BYTES={16 * MIB} cannot carry one OPENAI_MAX_UPLOAD_BYTES={25 * MIB} "
                        "upload (base64: 34952536 bytes): larger uploads get 413; raise BAKERY_MAX_BODY_BYTES to "
                        f"at least {25 * MIB * 3 // 2} or lower OPENAI_MAX_UPLOAD_BYTES"]
    assert reconcile(BENCHMARK_ROUTE="/v1/images/edits", BAKERY_MAX_BODY_BYTES=str(40 * MIB))[1:] == ([], [])


# --------------------------------------------------------------------------- ports


def test_bind_test_detects_a_listener() -> None:
    """A listener on the port (any address the SDK binds) makes it busy."""
    port = free_port_pair()
    ports.bind_test(port)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        with pytest.raises(PortBusy):
            ports.bind_test(port)
    ports.bind_test(port)


def test_port_lock_is_exclusive(tmp_path: Path) -> None:
    """Only one worker holds a port's lock; it is free again once released."""
    port = free_port_pair()
    fd = ports.claim_port(port, tmp_path)
    with pytest.raises(PortBusy, match="another bakery worker"):
        ports.claim_port(port, tmp_path)
    import os

    os.close(fd)
    os.close(ports.claim_port(port, tmp_path))


def test_missing_log_file_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """While MODEL_LOG does not exist the worker warns (the SDK would wait silently); then it stops."""
    path = tmp_path / "engine.log"
    thread = core.watch_log_file(str(path), first=0.05, every=0.05)
    deadline = time.monotonic() + 10
    while "still does not exist" not in capsys.readouterr().err:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    path.write_text("")
    thread.join(5)
    assert not thread.is_alive()


def test_present_log_file_is_not_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No warning when the log is already there."""
    path = tmp_path / "engine.log"
    path.write_text("")
    core.watch_log_file(str(path), first=0.01).join(5)
    assert capsys.readouterr().err == ""


def test_parse_lines_breaks_only_on_newline() -> None:
    # Unicode line separators are text inside a log line; only \n (and \r\n) separate lines.
    assert worker_config.parse_lines("a\u2028b\r\nc\x85d\n") == ["a\u2028b", "c\x85d"]
