"""Read every tag of a registry back with skopeo and compare it with build.py --json's records.

    python build.py --engine vllm --local --push --repository 127.0.0.1:5000/acme --json > summary.json
    python -m tests.image.readback 127.0.0.1:5000 summary.json
    python -m tests.image.readback 127.0.0.1:5000 --records records/   # bakery.release's records

Every repository the registry lists (its /v2/_catalog), every tag in it (skopeo list-tags), is read
with `skopeo inspect --raw`. A tag passes when build.py reported pushing exactly that ref at exactly
that digest (or a verified record of `python -m bakery.release verify --push` names that ref and
digest), and the manifest's config is the image id whose gate passed. An index (a release made
by bakery.release) passes when every digest it lists passes. Anything else is reported, exit 1.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import urllib.request
from pathlib import Path
from typing import Any

from bakery.errors import BakeryError
from tests.image.real_registry import skopeo_raw, skopeo_tags


def verified_pushes(summary: dict[str, Any]) -> dict[str, str]:
    """{ref@digest: verified image id} from a build.py --json summary (verified engines only)."""
    pushes = {}
    for item in summary.get("engines", []):
        if item.get("verified") is True:
            for line in item.get("pushed", []):
                pushes[line] = item["image_id"]
    return pushes


def record_pushes(directory: Path) -> dict[str, str]:
    """{pushed_ref@digest: image id} from bakery.release's verified records (*.json) in `directory`."""
    from bakery.release.ci import VerifiedRecord

    records = [VerifiedRecord.read(path) for path in sorted(Path(directory).glob("*.json"))]
    return {f"{r.pushed_ref}@{r.digest}": r.image_id for r in records if r.pushed_ref and r.digest}


def catalog(host: str) -> list[str]:
    """The repositories a registry on `host` holds (the distribution API's catalog)."""
    with urllib.request.urlopen(f"http://{host}/v2/_catalog?n=1000", timeout=10) as response:
        return sorted(json.load(response).get("repositories") or [])


def readback(host: str, pushes: dict[str, str], prefix: str = "") -> tuple[list[str], list[str]]:
    """(lines for tags that match a verified push, lines for tags that do not), for every repository
    of the registry whose name starts with `prefix`; `pushes` is {ref@digest: verified image id}."""
    by_digest = {line.partition("@")[2]: image for line, image in pushes.items()}
    good, bad = [], []
    for repo in [r for r in catalog(host) if r.startswith(prefix)]:
        for tag in skopeo_tags(f"{host}/{repo}"):
            ref = f"{host}/{repo}:{tag}"
            found = skopeo_raw(ref)
            if found is None:
                bad.append(f"{ref}: listed but unreadable")
                continue
            manifest, digest = found
            if "manifests" in manifest:
                listed = [m["digest"] for m in manifest["manifests"]]
                stray = [d for d in listed if d not in by_digest]
                (bad if stray or not listed else good).append(
                    f"{ref}: index of {', '.join(listed)}" + (f"; not verified: {', '.join(stray)}" if stray else ""))
                continue
            config = (manifest.get("config") or {}).get("digest")
            expected = pushes.get(f"{ref}@{digest}")
            if expected is None:
                bad.append(f"{ref}@{digest}: no verified push of that ref at that digest (config {config})")
            elif config != expected:
                bad.append(f"{ref}@{digest}: config {config}, but the verified image is {expected}")
            else:
                good.append(f"{ref}@{digest}: config {config} = verified image")
    return good, bad


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when every tag matches a verified push, 1 when one does not, 2 on bad input."""
    parser = argparse.ArgumentParser(prog="python -m tests.image.readback", description=__doc__.splitlines()[0])
    parser.add_argument("host", help="the registry, e.g. 127.0.0.1:5000 (plain HTTP, loopback)")
    parser.add_argument("summary", type=Path, nargs="?", help="build.py --json output")
    parser.add_argument("--records", type=Path, help="a directory of bakery.release verified records")
    parser.add_argument("--prefix", default="", help="only the repositories whose name starts with this")
    args = parser.parse_args(argv)
    if shutil.which("skopeo") is None:
        print("readback: skopeo is not installed: apt-get install skopeo (scripts/setup-host)", file=sys.stderr)
        return 2
    if args.summary is None and args.records is None:
        print("readback: give build.py's --json summary, --records DIR, or both", file=sys.stderr)
        return 2
    pushes: dict[str, str] = {}
    try:
        if args.summary is not None:
            pushes.update(verified_pushes(json.loads(args.summary.read_text(encoding="utf-8"))))
        if args.records is not None:
            pushes.update(record_pushes(args.records))
    except (OSError, json.JSONDecodeError) as exc:
        print(f"readback: {args.summary}: not a build.py --json summary: {exc}", file=sys.stderr)
        return 2
    except BakeryError as exc:
        print(f"readback: {exc}", file=sys.stderr)
        return 2
    good, bad = readback(args.host, pushes, args.prefix)
    for line in good:
        print(f"ok   {line}")
    for line in bad:
        print(f"BAD  {line}")
    if not good and not bad:
        print(f"BAD  {args.host} holds no tags")
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
