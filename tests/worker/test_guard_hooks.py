"""The SDK internals the worker's guards hook into are still there and behave as the guards assume.

tests/worker/guard_hooks_probe.py runs in the real worker venv (vastai as locked) and reports the
facts; each test here pins one. An SDK upgrade that renames a hook, stops calling it, or starts doing
what a guard does itself fails a test named after the guard, instead of leaving that guard as dead
code. Every hook named here is a row of control/sdk_seam.py's table (the one module that may
name an SDK private; tests/worker/test_sdk_seam.py checks the table against the locked SDK and a
missing hook's exit 4). Also pinned: the SDK's own signature check covers only auth_data.url (what docs/security.md
says a captured envelope can be replayed with), so a release that signs more is noticed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from control import sdk_seam
from policy import guards
from tests.worker.helpers import HERE, probe_facts


@pytest.fixture(scope="module")
def facts(worker_python: Path) -> dict[str, Any]:
    """The probe's report from the real SDK."""
    return probe_facts(worker_python, str(HERE / "guard_hooks_probe.py"))


def test_the_server_module_builds_its_apps_through_web(facts: dict[str, Any]) -> None:
    """All HTTP guards ride on the `web` name of the SDK's server module (WebShim)."""
    assert facts["server_web_is_aiohttp_web"] is True
    assert facts["server_uses"] == ["AppRunner", "Application", "TCPSite", "add_post", "web"]
    assert facts["sdk_http_site_port_kw"] is True  # http_listener finds the second site by port=


def test_limits_the_sdk_still_sets_no_body_limit_nor_engine_timeout(facts: dict[str, Any]) -> None:
    """If the SDK starts limiting itself, the limits guard's reasons change: look again."""
    assert facts["sdk_unlimited_body"] is True
    assert facts["session_is_cached_property"] is True
    assert facts["sdk_session_total_timeout"] is True


def test_limits_the_engine_session_is_the_guards(facts: dict[str, Any]) -> None:
    """After the startup hook the SDK's `session` is the guard's, with both timeouts and no total."""
    assert facts["engine_session"] == {"sock_connect": 3.5, "sock_read": 7.5, "total": None,
                                       "base_url": "http://127.0.0.1:18000"}


def test_limits_an_engine_that_never_accepts_times_out_and_is_recorded(facts: dict[str, Any]) -> None:
    """Connect timeout 1 s against a listener whose backlog is full: the guarded call gives up after
    ~1 s with aiohttp's connection timeout, recorded for the middleware's 504."""
    result = facts["engine_connect"]
    assert result["error"] == result["recorded"] == "ConnectionTimeoutError", result
    assert 0.9 <= result["seconds"] <= 5, result


def test_requests_go_through_the_hooked_methods(facts: dict[str, Any]) -> None:
    """The SDK's handler (a session's requests) and its benchmark call these two: bakery replaces both
    with its own chains (app/core.py install_parts), so they must be what the SDK calls."""
    assert all(facts["backend_methods"].values()), facts["backend_methods"]
    assert facts["handle_request_calls"] == ["_Backend__call_backend", "_Backend__check_signature"]


def test_not_ready_the_benchmark_bypasses_the_http_server(facts: dict[str, Any]) -> None:
    """The 503 before load is safe only because the SDK's benchmark calls the engine directly."""
    assert facts["benchmark_calls"] == ["_Backend__call_backend"]
    assert facts["model_is_loaded_at_start"] is False


def test_pubkey_retry_hooks(facts: dict[str, Any]) -> None:
    """The key fetch is `_fetch_pubkey`, readiness waits on the event and reports via _model_loaded."""
    assert facts["start_tracking_calls"] == ["_fetch_pubkey"]
    assert facts["read_logs_calls"] == ["_Backend__pubkey_failed", "_Backend__pubkey_fetch_complete",
                                        "_model_loaded"]
    assert facts["pubkey_event"] == "Event"


def test_own_url_is_the_reported_url(facts: dict[str, Any]) -> None:
    """The URL the worker reports (and own_url compares with) is PUBLIC_IPADDR + VAST_TCP_PORT_<port>."""
    assert facts["metrics_url"] == facts["metrics_get_url"] == "http://203.0.113.7:41234"


def test_the_sdk_signs_only_the_url(facts: dict[str, Any]) -> None:
    """A valid envelope stays valid with any cost, reqnum, request_idx, endpoint (and the payload is
    not even an argument); a signature for another worker's URL passes the SDK's own check. When a
    release changes any of these, docs/security.md and own_url must be looked at again."""
    check = facts["sdk_check"]
    assert check["parameters"] == ["auth_data"]
    assert check["valid"] is True
    assert check["other_cost_reqnum_idx_endpoint"] is True
    assert check["other_url_signed_for_it"] is True
    assert check["flipped"] is False and check["empty"] is False
    assert facts["auth_fields"] == list(guards.AUTH_FIELDS)


def test_the_sdk_reads_unsecured_loosely(facts: dict[str, Any]) -> None:
    """Why the worker hands the SDK its own reading: strtobool takes `on`, crashes on a blank."""
    readings = facts["sdk_unsecured_readings"]
    assert readings["'on'"] is True and readings["'t'"] is True
    assert readings["''"].startswith("ValueError") and readings["' true'"].startswith("ValueError")
    assert facts["unsecured_from_env"] is False


def test_header_timeout_rides_on_aiohttps_keepalive_timer(facts: dict[str, Any]) -> None:
    assert facts["aiohttp_keepalive_at_connect"] is True
    assert facts["aiohttp_keepalive_closes_waiting"] is True


def test_sessions_and_self_update_routes_are_the_ones_guarded(facts: dict[str, Any]) -> None:
    """A new SDK route under another prefix would be unguarded: this list must be re-read."""
    assert facts["sdk_session_routes"] == ["/pyworker/update", "/session/create", "/session/end",
                                           "/session/get", "/session/health"]


# The chain that guards wrap in layers, each calling the one below (test_layered_signature_check proves
# the layers act when all are installed); every other change belongs to one guard. pubkey_retry's layer
# counts the verdicts (a run of failures re-fetches the key: test_key_rotation.py).
LAYERED = {"chain.check_signature": {"own_url", "pubkey_retry", "outcomes"}}


def test_each_guard_changes_its_own_things_only(facts: dict[str, Any]) -> None:
    """Installed alone on a real Worker, every guard changes something, and no two change the same
    thing (but the declared layers): removing one name from ACTIVE removes exactly that guard."""
    prints = facts["fingerprints"]
    assert sorted(prints) == sorted(guards.ACTIVE)
    seen: dict[str, set[str]] = {}
    for name, changed in prints.items():
        assert changed, f"guard {name} changes nothing"
        for item in changed:
            seen.setdefault(item, set()).add(name)
    shared = {item: names for item, names in seen.items() if len(names) > 1}
    assert shared == {item: names for item, names in LAYERED.items() if names <= set(guards.ACTIVE)}, \
        f"changed by more than one guard: {shared} (declared layers: {LAYERED})"


def test_layered_signature_check(facts: dict[str, Any]) -> None:
    """own_url under pubkey_retry under outcomes: another worker's URL is still refused, and outcomes
    sees both verdicts."""
    layered = facts["layered_signature_check"]
    assert layered["own"] == {"valid": True, "forged": False}, layered
    assert layered["other"] == {"valid": False, "forged": True}, layered


def test_outcomes_hooks(facts: dict[str, Any]) -> None:
    """What the outcomes guard builds on: the SDK rejects a 401 after its signature check (counting
    the workload and queueing the outcome), answers its 422 before it (reporting nothing), and
    makes its handlers with a factory the worker can call; the drain sends queued outcomes with the
    SDK's own method."""
    assert facts["sdk_401_rejects_after_check"] is True
    assert facts["sdk_422_before_check"] is True
    assert facts["reject_counts_workload_and_queues"] is True
    assert {"request_idx", "reqnum", "workload", "status", "entered_queue_at"} <= set(facts["request_metrics_fields"])
    assert facts["handler_factory"] is True
    assert facts["send_outcomes"] is True


def test_the_hooks_pinned_here_are_rows_of_the_seam(facts: dict[str, Any]) -> None:
    """What this file pins is what the seam's table declares (a hook here and not there is a reach
    past the seam)."""
    attrs = {hook.attr for hook in sdk_seam.HOOKS}
    pinned = {"_Backend__check_signature", "_Backend__call_backend", "_fetch_pubkey",
              "_Backend__pubkey_fetch_complete", "_model_loaded", "model_metrics.requests_deleting",
              "_Metrics__send_delete_requests_and_reset", "session", "web", "url"}
    assert pinned <= attrs, pinned - attrs
