"""The worker's one configuration (config/table.py): one table, one parser, one reader of
the environment. No SDK needed."""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest

import tests.worker.helpers  # noqa: F401 (puts worker/ on sys.path first)
from config import table

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "worker"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# Not the worker: a stdlib-only demo client the caller runs on their own machine (it must work as a lone
# file), whose --model default reads the model variables.
NOT_THE_WORKER = {WORKER / "workers" / "openai" / "client.py"}
# Upper-case names in the contract that are not variables the worker or its entry point reads, and why.
NOT_VARIABLES = {
    "ACTIVE": "guards.py's tuple of guard names",
    "VARIABLES": "table.py's table (table.VARIABLES)",
    "HOOKS": "sdk_seam.py's table (sdk_seam.HOOKS)",
    "ENGINE_KEEPALIVE": "a constant of guards.py",
    "BENCHMARK_": "the prefix of the BENCHMARK_* variables",
    "ECHO_MODEL": "an example of the variable BAKERY_MODEL_VAR names",
    "LLAMA_ARGS": "an example of the variable BAKERY_ENGINE_ARGS_VAR names",
    "INFO": "text of supervisord's exit line",
    "NAME": "the placeholder of a ${NAME} token",
    "PYTHONHOME": "unset by start_server.sh",
    "PYTHONPATH": "set by start_server.sh",
    "TMPDIR": "read by Python's tempfile (the port lock's directory)",
    "USE_SSL": "read by the SDK alone",
}


def environ_reads(tree: ast.AST) -> list[str]:
    """Every `os.environ`, `os.getenv`, `environ`/`getenv` imported from os, and `os.putenv` in `tree`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "environb", "getenv", "getenvb", "putenv",
                                                             "unsetenv"):
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [f"line {node.lineno}: from os import {a.name}" for a in node.names
                      if a.name in ("environ", "environb", "getenv", "getenvb", "putenv", "unsetenv")]
    return found


def test_only_config_reads_the_environment() -> None:
    """Nothing of the worker, its entry point included, but config/table.py touches os.environ (or getenv):
    every variable is read through the table and its parser, from one snapshot (core.run's, the entry point's)."""
    offenders = {}
    for path in sorted(WORKER.glob("*/**/*.py")):
        if path == WORKER / "config" / "table.py" or path in NOT_THE_WORKER:
            continue
        reads = environ_reads(ast.parse(path.read_text(encoding="utf-8")))
        if reads:
            offenders[str(path.relative_to(ROOT))] = reads
    assert offenders == {}


def test_the_environment_check_sees_each_form() -> None:
    source = "import os\nfrom os import getenv\na = os.environ['X']\nb = os.getenv('Y')\n"
    assert len(environ_reads(ast.parse(source))) == 3


def contract_names() -> set[str]:
    """The upper-case names in code spans of docs/architecture.md's "Environment contract (worker)"."""
    section = ARCHITECTURE.read_text(encoding="utf-8").split("## Environment contract (worker)")[1]
    section = section.split("\n## ")[0]
    names = set()
    for span in re.findall(r"`([^`]*)`", section):
        names.update(re.findall(r"\b[A-Z][A-Z0-9_]{2,}(?:<[A-Z_]+>)?", span))
    return names


def test_the_table_is_the_documented_contract() -> None:
    """Every variable the contract names is a row of the table, and every row is in the contract."""
    names = contract_names()
    assert names - set(table.BY_NAME) - set(NOT_VARIABLES) == set()
    assert set(table.BY_NAME) - names == set()
    assert not set(NOT_VARIABLES) & set(table.BY_NAME)


def test_every_row_is_well_formed() -> None:
    assert len(table.BY_NAME) == len(table.VARIABLES)
    for var in table.VARIABLES:
        assert var.bad in ("exit", "warn", "none"), var
        assert var.reader in ("worker", "entry point", "start_server.sh"), var
        assert var.doc and var.owner, var
        if var.kind in ("int", "digits", "number", "bool", "drain", "lines") and var.reader == "worker":
            assert var.bad != "none", f"{var.name}: a parsed kind must say what a bad value does"


def test_strict_and_warning_variables_are_the_documented_ones() -> None:
    """Guard limits, UNSECURED and the drain stop the worker, and so do the engine's baked facts (the
    log file, load and error lines: there is no default to take); the benchmark, readiness, upload and
    late-error numbers, BAKERY_LOG_REQUESTS, BAKERY_EVENT_LOOP, BAKERY_FRONT, BAKERY_FRONT_PROCESSES,
    BAKERY_RELAY, BAKERY_ENGINE_KEEP_WARM, BAKERY_ENGINE_READY_CONNECTIONS and the info lines warn and
    take their default."""
    strict = {v.name for v in table.VARIABLES if v.bad == "exit" and v.owner in ("guards", "drain", "core")
              and v.kind in ("digits", "number", "bool", "drain")}
    assert strict == {"UNSECURED", "BAKERY_DRAIN_TIMEOUT", *(v.name for v in table.VARIABLES if v.owner == "guards")}
    baked = {v.name for v in table.VARIABLES if v.bad == "exit" and v.default is None and v.kind in ("text", "lines")
             and v.owner == "core"}
    assert baked == {"MODEL_LOG", "MODEL_LOAD_LOG_MSG", "MODEL_ERROR_LOG_MSGS"}
    warned = {v.name for v in table.VARIABLES if v.bad == "warn"}
    assert warned == {"MODEL_INFO_LOG_MSGS", "BENCHMARK_RUNS",
                      "BENCHMARK_CONCURRENCY", "BENCHMARK_MAX_TOKENS", "READINESS", "READINESS_TIMEOUT",
                      "HEALTHCHECK_PROBE_TIMEOUT", "BAKERY_LOG_REQUESTS", "OPENAI_MAX_UPLOAD_BYTES",
                      "OPENAI_MAX_REQUEST_UPLOAD_BYTES", "BENCHMARK_EMBED_CHARS", "BAKERY_LATE_ERROR_PROBES",
                      "BAKERY_LATE_ERROR_INTERVAL", "BAKERY_LOAD_BEGIN_LOG_MSGS", "BAKERY_WEIGHTS_LOADED_LOG_MSGS",
                      "BAKERY_EVENT_LOOP", "BAKERY_FRONT", "BAKERY_FRONT_PROCESSES", "BAKERY_RELAY",
                      "BAKERY_ENGINE_KEEP_WARM", "BAKERY_ENGINE_READY_CONNECTIONS"}


@pytest.mark.parametrize("raw", [None, "", "  ", "\t\n"])
def test_blank_is_unset_for_every_kind(raw: str | None) -> None:
    env = {} if raw is None else {"X": raw}
    for kind in ("text", "lines", "int", "digits", "number", "bool", "seconds", "drain", "count"):
        for bad in ("exit", "warn"):
            warnings: list[str] = []
            errors: list[str] = []
            assert table.parse(env, "X", kind, bad, ("d",) if kind == "lines" else 7, warnings, errors) \
                in (("d",), 7)
            assert warnings == errors == []


def test_a_bad_value_goes_where_its_row_says() -> None:
    warnings: list[str] = []
    errors: list[str] = []
    assert table.read({"BAKERY_RETRY_AFTER": "x"}, "BAKERY_RETRY_AFTER", warnings, errors) == 10
    assert table.read({"BENCHMARK_EMBED_CHARS": "x"}, "BENCHMARK_EMBED_CHARS", warnings, errors) == 600
    assert [e.split("=")[0] for e in errors] == ["BAKERY_RETRY_AFTER"]
    assert [w.split("=")[0] for w in warnings] == ["BENCHMARK_EMBED_CHARS"]


def test_the_two_integer_rules_keep_their_differences() -> None:
    """BENCHMARK_RUNS & co. take what int() takes; the byte counts and guard limits digits only."""
    assert table.parse({"X": " +3 "}, "X", "int", "warn", 1) == 3
    assert table.parse({"X": "1_0"}, "X", "int", "warn", 1) == 10
    assert table.parse({"X": "+3"}, "X", "digits", "warn", 1) == 1
    assert table.parse({"X": " 3 "}, "X", "digits", "exit", 1) == 3


SECONDS = [("BAKERY_DRAIN_TIMEOUT", 8.0), ("BAKERY_EXIT_GRACE", 10.0)]  # seconds from 0 to 3600, and defaults


@pytest.mark.parametrize(("name", "default"), SECONDS)
@pytest.mark.parametrize(("raw", "value"), [("0", 0.0), ("3600", 3600.0), (" 2.5 ", 2.5), ("", None)])
def test_seconds(name: str, default: float, raw: str, value: float | None) -> None:
    assert table.read({name: raw}, name) == (default if value is None else value)


@pytest.mark.parametrize(("name", "default"), SECONDS)
@pytest.mark.parametrize("raw", ["-1", "3601", "inf", "nan", "8s"])
def test_seconds_refused_naming_the_variable(name: str, default: float, raw: str) -> None:
    errors: list[str] = []
    assert table.read({name: raw}, name, errors=errors) == default
    assert len(errors) == 1 and errors[0].startswith(f"{name}={raw!r} is not a number of seconds from 0 to 3600")
    assert f"(default {default:g}" in errors[0]


def test_numbers_are_finite() -> None:
    for raw in ("inf", "nan", "-1", "0"):
        assert math.isfinite(table.parse({"X": raw}, "X", "number", "warn", 1.5))


def test_the_snapshot_is_read_only() -> None:
    snapshot = table.snapshot()
    with pytest.raises(TypeError):
        snapshot["X"] = "1"  # type: ignore[index]


def test_the_table_defaults_are_the_modules_defaults() -> None:
    """One value per default: each row's default is the constant its owner module uses."""
    from app import worker_config as wc
    from config import routes, uploads, workload
    from policy import drain, guards

    expected: dict[str, object] = {
        "MODEL_SERVER_URL": wc.DEFAULT_SERVER_URL, "MODEL_HEALTH_ENDPOINT": wc.DEFAULT_HEALTH_ENDPOINT,
        "BENCHMARK_MAX_TOKENS": wc.DEFAULT_BENCHMARK_MAX_TOKENS, "READINESS": wc.DEFAULT_READINESS,
        "READINESS_TIMEOUT": wc.DEFAULT_READINESS_TIMEOUT,
        "HEALTHCHECK_PROBE_TIMEOUT": wc.DEFAULT_HEALTHCHECK_PROBE_TIMEOUT,
        "BENCHMARK_ROUTE": routes.DEFAULT_BENCHMARK_ROUTE, "BENCHMARK_EMBED_CHARS": workload.DEFAULT_EMBED_CHARS,
        "OPENAI_MAX_UPLOAD_BYTES": uploads.DEFAULT_MAX_UPLOAD_BYTES,
        "OPENAI_MAX_REQUEST_UPLOAD_BYTES": uploads.DEFAULT_MAX_REQUEST_UPLOAD_BYTES,
        "BAKERY_DRAIN_TIMEOUT": drain.DEFAULT_DRAIN_SECONDS, "BAKERY_LOG_REQUESTS": False, "UNSECURED": False,
        **{name: getattr(guards.Limits(), attr) for attr, name in guards.LIMIT_VARS.items()},
    }
    assert {name: table.BY_NAME[name].default for name in expected} == expected


def test_the_documented_defaults_are_the_tables() -> None:
    """`NAME=value` in the contract's knob, route, limit and drain lists is the row's default."""
    section = ARCHITECTURE.read_text(encoding="utf-8").split("## Environment contract (worker)")[1]
    knobs = section.split("Worker knobs")[1].split("\nServing (")[0]
    shown = dict(re.findall(r"`([A-Z][A-Z0-9_]+)=([^`\s]+)`", knobs))
    assert len(shown) >= 20, shown
    for name, text in shown.items():
        default = table.BY_NAME[name].default
        if isinstance(default, bool):
            assert text == str(default).lower(), name
        elif isinstance(default, (int, float)):
            assert float(text) == default, name
        else:
            assert text == default, name
