"""admission.py's rules without the SDK: which Content-Encoding is refused, the byte bound against
the body limit (exit 2 below one body), the byte budget, the open-files limit the cap needs."""

from __future__ import annotations

from typing import Any

import pytest

from app import core
from config import table
from policy import admission, guards
from tests.worker.helpers import baked_facts, platform_env  # (puts worker/ on sys.path first)

MIB = 1024 * 1024


@pytest.mark.parametrize("codings", [[], [""], ["identity"], ["IDENTITY"], ["identity, identity"], [" identity "]])
def test_no_coding_or_identity_is_accepted(codings: list[str]) -> None:
    assert admission.encoding_error(codings) is None


@pytest.mark.parametrize("codings", [["gzip"], ["x-gzip"], ["Deflate"], ["br"], ["zstd"], ["compress"],
                                     ["gzip, gzip"], ["identity, gzip"], ["identity", "br"], ["aes128gcm"]])
def test_any_other_coding_is_refused_naming_the_header(codings: list[str]) -> None:
    error = admission.encoding_error(codings)
    assert error is not None and error.startswith("Content-Encoding ")
    assert codings[-1].split(",")[-1].strip().lower() in error


def test_a_long_coding_list_is_cut_in_the_error() -> None:
    error = admission.encoding_error(["gzip, " * 1000])
    assert error is not None and len(error) < 200


def limits(**values: Any) -> guards.Limits:
    return guards.Limits(**values)


def test_unset_the_byte_bound_holds_two_bodies_at_least() -> None:
    assert admission.reconcile(limits(), {})[0].max_buffered_bytes == 256 * MIB
    assert admission.reconcile(limits(max_body_bytes=96 * MIB), {})[0].max_buffered_bytes == 256 * MIB
    assert admission.reconcile(limits(max_body_bytes=200 * MIB), {})[0].max_buffered_bytes == 400 * MIB


def test_set_it_may_be_one_body_but_not_less() -> None:
    env = {"BAKERY_MAX_BUFFERED_BYTES": str(16 * MIB)}
    assert admission.reconcile(limits(max_buffered_bytes=16 * MIB), env) == (limits(max_buffered_bytes=16 * MIB), [])
    env = {"BAKERY_MAX_BUFFERED_BYTES": "1000"}
    _, errors = admission.reconcile(limits(max_buffered_bytes=1000), env)
    assert errors == [f"BAKERY_MAX_BUFFERED_BYTES='1000' is below the body limit BAKERY_MAX_BODY_BYTES={16 * MIB}: "
                      "no body that large could be admitted; set BAKERY_MAX_BUFFERED_BYTES to at least "
                      f"{16 * MIB} (default {256 * MIB}) or leave it unset"]


def test_the_worker_config_refuses_a_byte_bound_below_the_body_limit() -> None:
    """core.load_config, as the worker starts: one line, exit 2 (ConfigError)."""
    from workers.llama.worker import DEFAULTS

    env = {**platform_env(41234, "http://127.0.0.1:9"), **baked_facts("vllm"), "MODEL_LOG": "/tmp/x.log"}
    with pytest.raises(core.ConfigError) as caught:
        core.load_config(DEFAULTS, {**env, "BAKERY_MAX_BUFFERED_BYTES": "1000"})
    assert [line.split("=")[0] for line in caught.value.lines] == ["BAKERY_MAX_BUFFERED_BYTES"]
    assert core.load_config(DEFAULTS, env).limits.max_buffered_bytes == 256 * MIB


@pytest.mark.parametrize("raw", ["0", "-1", "1.5", "256MiB", "lots"])
def test_bad_bounds_are_exit_2_lines(raw: str) -> None:
    for name in ("BAKERY_MAX_BUFFERED_BYTES", "BAKERY_MAX_CONNECTIONS"):
        _, errors = guards.load_limits({name: raw})
        assert len(errors) == 1 and errors[0].startswith(f"{name}={raw!r} "), errors
        assert table.BY_NAME[name].bad == "exit"


def test_the_budget_refuses_what_does_not_fit_and_takes_it_back() -> None:
    budget = admission.Budget(100)
    assert budget.reserve(60) and not budget.reserve(41) and budget.reserve(40)
    assert (budget.held, budget.refused) == (100, 1)
    budget.release(60)
    budget.release(40)
    assert budget.held == 0 and budget.reserve(100)


def test_the_open_files_limit_is_raised_to_what_the_cap_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    got: list[tuple[int, int]] = []
    monkeypatch.setattr(admission.resource, "getrlimit", lambda _: (1024, 1 << 20))
    monkeypatch.setattr(admission.resource, "setrlimit", lambda _, value: got.append(value))
    assert admission.raise_fd_limit(2048) is None
    assert got == [(admission.fds_needed(2048), 1 << 20)]


def test_a_hard_limit_below_the_need_is_a_warning_naming_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission.resource, "getrlimit", lambda _: (1024, 2048))
    monkeypatch.setattr(admission.resource, "setrlimit", lambda *_: None)
    warning = admission.raise_fd_limit(2048)
    assert warning is not None and "(2048)" in warning and "BAKERY_MAX_CONNECTIONS=2048" in warning
    assert f"to {(2048 - admission.MAX_LINGERING - admission.SPARE_FDS) // 2} " in warning


def test_engine_connections_opened_at_load_count_only_above_the_cap() -> None:
    rest = admission.MAX_LINGERING + admission.SPARE_FDS
    assert admission.fds_needed(100) == admission.fds_needed(100, 100) == 200 + rest
    assert admission.fds_needed(100, 40) == 200 + rest  # a request takes an idle one before opening one
    assert admission.fds_needed(100, 300) == 400 + rest


def test_a_limit_too_low_for_the_connections_at_load_names_them(monkeypatch: pytest.MonkeyPatch) -> None:
    rest = admission.MAX_LINGERING + admission.SPARE_FDS
    monkeypatch.setattr(admission.resource, "getrlimit", lambda _: (1024, 1024))
    monkeypatch.setattr(admission.resource, "setrlimit", lambda *_: None)
    warning = admission.raise_fd_limit(64, 4096)
    assert warning is not None and "BAKERY_ENGINE_READY_CONNECTIONS=4096" in warning
    assert f"lower BAKERY_ENGINE_READY_CONNECTIONS to {1024 - 64 - rest} " in warning
    assert admission.raise_fd_limit(64, 1024 - 64 - rest) is None  # what it names fits
    # A cap that alone does not fit: the cap is named first, the connections at load with it.
    warning = admission.raise_fd_limit(1000, 4096)
    assert warning is not None and f"lower BAKERY_MAX_CONNECTIONS to {(1024 - rest) // 2} " in warning
    assert "(and BAKERY_ENGINE_READY_CONNECTIONS to at most that)" in warning


def test_the_listen_backlog_is_the_cap_and_never_below_the_floor() -> None:
    assert admission.listen_backlog(8) == admission.MIN_BACKLOG
    assert admission.listen_backlog(admission.MIN_BACKLOG + 1) == admission.MIN_BACKLOG + 1


@pytest.mark.parametrize(("somaxconn", "warned"), [("128\n", True), ("1023", True), ("1024", False), ("4096\n", False)])
def test_a_kernel_cap_below_the_backlog_is_a_warning_naming_the_sysctl(tmp_path: Any, somaxconn: str,
                                                                       warned: bool) -> None:
    path = tmp_path / "somaxconn"
    path.write_text(somaxconn)
    warning = admission.backlog_warning(1024, str(path))
    if not warned:
        assert warning is None
        return
    assert warning is not None
    assert f"at {int(somaxconn)} (net.core.somaxconn)" in warning
    assert "--sysctl net.core.somaxconn=1024" in warning


def test_an_unreadable_kernel_cap_is_no_warning(tmp_path: Any) -> None:
    assert admission.backlog_warning(1024, str(tmp_path / "absent")) is None
    (tmp_path / "garbled").write_text("many")
    assert admission.backlog_warning(1024, str(tmp_path / "garbled")) is None
