"""bakery.bases without Docker: catalogue, mirror discovery, one-line errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bakery.bases import make as bases
from bakery.errors import BuildError, InputError


def test_catalogue_names_refs_and_parents() -> None:
    assert list(bases.BASES) == ["debian", "debian-nopython", "vllm-standin", "sglang-standin", "llama-cpp",
                                 "vllm-cpu"]
    assert bases.BASES["debian"].ref == "bakery-local/debian:bookworm"
    assert bases.BASES["vllm-standin"].ref == "bakery-local/vllm-standin:0.33.0"
    assert bases.BASES["sglang-standin"].ref == "bakery-local/sglang-standin:0.5.23"
    assert bases.BASES["llama-cpp"].ref == f"bakery-local/llama-cpp:{bases.XLLAMACPP_VERSION}"
    for base in bases.BASES.values():
        assert base.description
        assert base.parent in (None, *bases.BASES)
    assert "STAND-IN" in bases.BASES["vllm-standin"].description
    # The real vLLM is gigabytes: only made when named, never by `python -m bakery.bases` alone.
    assert [name for name, base in bases.BASES.items() if not base.by_default] == ["vllm-cpu"]


_PINNED_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+) --hash=sha256:[0-9a-f]{64}$")


@pytest.mark.parametrize("name", ["requirements.txt", "convert-requirements.txt"])
def test_vllm_cpu_requirements_are_exact_pins_with_hashes(name: str) -> None:
    lines = [line for line in (bases.VLLM_CPU_DIR / name).read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    pins = {}
    for line in lines:
        match = _PINNED_LINE.match(line)
        assert match, f"{name}: not `name==version --hash=sha256:...`: {line!r}"
        key = re.sub(r"[-_.]+", "-", match.group(1)).lower()
        assert key not in pins, f"{name}: {key} twice"
        pins[key] = match.group(2)
    if name == "requirements.txt":
        assert pins["vllm-cpu"] == bases.VLLM_CPU_VERSION
        assert pins["torch"] == "2.13.0"
        # torch imports and vLLM serves on CPU without these (docs/engines.md, "A real vLLM on CPU").
        assert not {"triton", "cuda-bindings", "cuda-toolkit", "cuda-pathfinder"} & set(pins)


def test_vllm_cpu_model_pins_name_the_in_image_directory() -> None:
    entries = [line.split("  ", 1) for line in (bases.VLLM_CPU_DIR / "model.sha256").read_text().splitlines()]
    assert {Path(path).parent.as_posix() for _sha, path in entries} == {bases.BASES["vllm-cpu"].serves}
    assert "model.safetensors" in {Path(path).name for _sha, path in entries}
    assert all(re.fullmatch(r"[0-9a-f]{64}", sha) for sha, _path in entries)


def test_inputs_hash_follows_parent_and_context() -> None:
    a = bases._INPUTS["vllm-standin"]("sha256:aaa")
    assert a == bases._INPUTS["vllm-standin"]("sha256:aaa")
    assert a != bases._INPUTS["vllm-standin"]("sha256:bbb")
    assert a != bases._INPUTS["sglang-standin"]("sha256:aaa")
    assert bases._INPUTS["debian"](None) == bases._INPUTS["debian"]("ignored")


def test_mirror_from_deb822_and_one_line_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BAKERY_DEBIAN_MIRROR", raising=False)
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# a comment\nURIs: http://security.example/debian-security\nSuites: bookworm-security\n"
        "Components: main\n\nTypes: deb deb-src\nURIs: http://mirror.example/debian/\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n")
    assert bases.debian_mirror(tmp_path) == "http://mirror.example/debian"
    (tmp_path / "sources.list").write_text("# deb http://old/ bookworm main\n"
                                           "deb [arch=amd64] http://one-line.example/debian bookworm main\n")
    assert bases.debian_mirror(tmp_path) == "http://one-line.example/debian"
    monkeypatch.setenv("BAKERY_DEBIAN_MIRROR", "http://override.example/debian/")
    assert bases.debian_mirror(tmp_path) == "http://override.example/debian"


def test_mirror_falls_back_to_deb_debian_org(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BAKERY_DEBIAN_MIRROR", raising=False)
    assert bases.debian_mirror(tmp_path) == "http://deb.debian.org/debian"


def test_missing_debootstrap_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bases.shutil, "which", lambda _name: None)
    monkeypatch.setattr(bases.os, "access", lambda _path, _mode: False)
    with pytest.raises(BuildError) as err:
        bases._find_debootstrap()
    assert str(err.value) == ("debootstrap is not installed: run `apt-get install debootstrap` "
                              "(or scripts/setup-host)")


def test_unreachable_docker_is_a_build_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no.sock")
    with pytest.raises(BuildError, match=r"cannot reach the Docker engine at unix://.*no\.sock") as err:
        bases.ensure_base("debian", progress=lambda _m: None)
    assert "\n" not in str(err.value)


def test_unknown_base_is_an_input_error_before_docker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no.sock")
    with pytest.raises(InputError, match="unknown base 'ubuntu': choose one of debian, debian-nopython"):
        bases.ensure_base("ubuntu")


def test_slim_rootfs_keeps_copyright_and_drops_docs(tmp_path: Path) -> None:
    for rel in ("usr/share/doc/bash/copyright", "usr/share/doc/bash/README.gz", "usr/share/man/man1/ls.1.gz",
                "usr/share/locale/de/LC_MESSAGES/x.mo", "usr/share/locale/locale.alias",
                "var/lib/apt/lists/deb.debian.org_Packages", "var/cache/apt/pkgcache.bin",
                "var/cache/apt/archives/x.deb", "etc/hostname", "etc/apt/apt.conf.d/.keep"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    (tmp_path / "var/lib/apt/lists/partial").mkdir()
    bases._slim_rootfs(tmp_path)
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == ["etc/apt/apt.conf.d/.keep", "etc/apt/apt.conf.d/90bakery-norecommends",
                    "etc/dpkg/dpkg.cfg.d/bakery-nodoc", "etc/hostname", "usr/share/doc/bash/copyright",
                    "usr/share/locale/locale.alias"]
    assert (tmp_path / "etc/hostname").read_text() == ""
    assert (tmp_path / "var/lib/apt/lists/partial").is_dir()


def test_slim_rootfs_never_follows_symlinks_out_of_the_rootfs(tmp_path: Path) -> None:
    root, host = tmp_path / "rootfs", tmp_path / "host"
    for rel in ("man/keep.1", "doc/keep", "resolv.conf"):
        (host / rel).parent.mkdir(parents=True, exist_ok=True)
        (host / rel).write_text("host")
    (root / "usr/share/doc").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "usr/share/man").symlink_to(host / "man")
    (root / "usr/share/doc/pkg").symlink_to(host / "doc")
    (root / "etc/resolv.conf").symlink_to(host / "resolv.conf")
    bases._slim_rootfs(root)
    assert sorted(str(p.relative_to(host)) for p in host.rglob("*") if p.is_file()) == \
        ["doc/keep", "man/keep.1", "resolv.conf"]
    assert (host / "resolv.conf").read_text() == "host"
    assert not (root / "etc/resolv.conf").is_symlink()
