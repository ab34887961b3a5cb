"""The real-registry helpers of the publishing tests (tests/image/real_registry.py), without Docker."""

from __future__ import annotations

import subprocess

import pytest

import tests.host_tools as host_tools
import tests.image.real_registry as real_registry


def test_a_missing_tool_fails_under_ci_and_skips_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_tools.shutil, "which", lambda name: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"docker-registry is not installed.*CI=true needs it"):
        real_registry.require_tool("docker-registry")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="skopeo is not installed"):
        real_registry.require_tool("skopeo")


def test_a_missing_buildx_plugin_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_tools.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(host_tools.subprocess, "run",
                        lambda argv, **_k: subprocess.CompletedProcess(argv, 1, "", "unknown command"))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"docker buildx is not installed.*CI=true needs it"):
        host_tools.require_buildx()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="docker buildx is not installed"):
        host_tools.require_buildx()


def test_the_registry_config_is_loopback_with_its_own_storage(tmp_path) -> None:
    plain = real_registry._config(tmp_path, 5123, readonly=False, htpasswd=None)
    assert plain["http"]["addr"] == "127.0.0.1:5123"
    assert plain["storage"]["filesystem"] == {"rootdirectory": str(tmp_path)}
    assert "auth" not in plain and "maintenance" not in plain["storage"]
    refusing = real_registry._config(tmp_path, 5123, readonly=True, htpasswd=tmp_path / "htpasswd")
    assert refusing["storage"]["maintenance"] == {"readonly": {"enabled": True}}
    assert refusing["auth"]["htpasswd"]["path"] == str(tmp_path / "htpasswd")
