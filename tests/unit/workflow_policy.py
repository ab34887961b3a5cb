"""The supply-chain rules every GitHub workflow of this repository keeps (tests/unit/test_workflows.py).

`violations()` takes the workflow files' texts (name -> YAML text) and returns one line per broken
rule, so a test can plant a broken copy and see the rule fire:

- no `pull_request_target`; a top-level `permissions` with read/none values only (a reusable
  workflow, `on: workflow_call`, declares none at all: it inherits its caller's job permissions);
- a job that grants any write permission can never run for a pull request: its workflow has no
  pull_request trigger, or its `if` has `github.event_name != 'pull_request'` as a conjunct; and no
  job of a `workflow_run` workflow writes at all (it runs with the base repository's token after a
  pull request's workflow, on whatever that run left behind, and its event name is never
  pull_request, so the `if` above would not keep it out);
- a job that can run for a pull request passes no `secrets: inherit`, and no workflow that a pull
  request can run names a secret other than GITHUB_TOKEN;
- every actions/checkout sets `persist-credentials: false`;
- every action is pinned by a full 40-hex commit SHA with its version in a comment (`# v1.2.3`);
  local actions/workflows (`./...`) excepted; `docker://` and service/container images by digest;
- every `pip install`/`pip download` in a `run:` script uses `--require-hashes`;
- the release path (`release_violations`, for image-build.yml and images.yml): images leave only
  through `python -m bakery.release` (no `docker push`, no buildx push or imagetools create in a
  script); the release push asks for the builder's provenance (`verify --push --provenance`, whose
  read-back compares the config digest before recording); the verified image's SBOM is extracted
  from the record's image after the gate and kept as an artifact; every `cosign sign`/`attest`
  comes after `bakery.release assemble` in its job, takes its refs from the verified records, is
  keyless, and the SBOM attestation is CycloneDX; each cosign call is, word for word, the keyless
  form of the call `bakery.release.sign` makes (sign_command, attest_command), which
  tests/image/test_cosign_registry.py runs for real with a key pair; `id-token: write` only where
  cosign runs.

`lock_problems()` checks that requirements-dev.lock pins every requirement of requirements-dev.txt
to a version it allows, with at least one hash per entry.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from bakery.release.sign import attest_command, sign_command

PR_EVENTS = {"pull_request", "pull_request_target"}
AFTER_PR_EVENTS = {"workflow_run"}  # runs with the base token after (possibly) a pull request's workflow
NOT_PR = "github.event_name != 'pull_request'"
USES_LINE = re.compile(r"^\s*(?:-\s+)?uses:\s*(?P<ref>[^\s#]+)\s*(?:#\s*(?P<comment>.*))?$")
PINNED_ACTION = re.compile(r"^[\w.-]+/[\w.-]+(?:/[\w./-]+)?@[0-9a-f]{40}$")
VERSION_COMMENT = re.compile(r"^v\d+(?:\.\d+)*\b")
IMAGE_BY_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
SECRET = re.compile(r"secrets\.([A-Za-z_][A-Za-z0-9_]*)")


def _load(text: str) -> dict[str, Any]:
    data = yaml.safe_load(text) or {}
    if True in data:  # YAML 1.1 reads the key `on` as True
        data["on"] = data.pop(True)
    return data


def _triggers(flow: dict[str, Any]) -> set[str]:
    on = flow.get("on") or {}
    if isinstance(on, str):
        return {on}
    if isinstance(on, list):
        return set(on)
    return set(on)


def _writes(permissions: Any) -> list[str]:
    """The scopes a permissions block grants write on (`write-all` counts as everything)."""
    if permissions is None:
        return []
    if isinstance(permissions, str):
        return ["everything"] if permissions != "read-all" else []
    return sorted(scope for scope, level in permissions.items() if level == "write")


def _excludes_pull_requests(job: dict[str, Any]) -> bool:
    condition = str(job.get("if", "")).strip()
    if condition.startswith("${{") and condition.endswith("}}"):
        condition = condition[3:-2]
    return NOT_PR in [part.strip().strip("()").strip() for part in condition.split("&&")]


def _run_scripts(flow: dict[str, Any]) -> list[str]:
    return [str(step.get("run", "")) for job in (flow.get("jobs") or {}).values()
            for step in job.get("steps") or []]


def violations(workflows: dict[str, str]) -> list[str]:
    """Every broken rule in the given workflow files, one line each (empty: all kept)."""
    found: list[str] = []
    flows = {name: _load(text) for name, text in workflows.items()}
    # A reusable workflow is as exposed as its most exposed caller.
    called_from_pr: set[str] = set()
    for flow in flows.values():
        if _triggers(flow) & PR_EVENTS:
            for job in (flow.get("jobs") or {}).values():
                uses = str(job.get("uses", ""))
                if uses.startswith("./.github/workflows/") and not _excludes_pull_requests(job):
                    called_from_pr.add(Path(uses).name)
    for name, flow in flows.items():
        found += _flow_violations(name, flow, workflows[name], name in called_from_pr)
    return found + release_violations(flows)


def _flow_violations(name: str, flow: dict[str, Any], text: str, called_from_pr: bool) -> list[str]:
    found = []
    triggers = _triggers(flow)
    reusable = triggers == {"workflow_call"}
    pr_runs = bool(triggers & PR_EVENTS) or called_from_pr
    if "pull_request_target" in triggers:
        found.append(f"{name}: pull_request_target runs a pull request with the base repository's token")
    if reusable:
        if "permissions" in flow:
            found.append(f"{name}: a called workflow sets top-level permissions (it must inherit its caller's)")
    elif "permissions" not in flow:
        found.append(f"{name}: no top-level permissions (the default token may write)")
    elif _writes(flow["permissions"]):
        found.append(f"{name}: top-level permissions grant write on {', '.join(_writes(flow['permissions']))}")
    for job_name, job in (flow.get("jobs") or {}).items():
        writes = _writes(job.get("permissions"))
        if writes and reusable:
            found.append(f"{name}: {job_name}: a called workflow declares {', '.join(f'{w}: write' for w in writes)}")
        elif writes and triggers & AFTER_PR_EVENTS:
            found.append(f"{name}: {job_name}: grants {', '.join(f'{w}: write' for w in writes)} in a workflow_run "
                         "workflow (it runs after a pull request's workflow, with the base repository's token)")
        elif writes and pr_runs and not _excludes_pull_requests(job):
            found.append(f"{name}: {job_name}: grants {', '.join(f'{w}: write' for w in writes)} to a job a pull "
                         f"request can run (add `if: {NOT_PR}`)")
        if pr_runs and not _excludes_pull_requests(job) and job.get("secrets") == "inherit":
            found.append(f"{name}: {job_name}: secrets: inherit in a job a pull request can run")
        for step in job.get("steps") or []:
            if str(step.get("uses", "")).startswith("actions/checkout@") and \
                    (step.get("with") or {}).get("persist-credentials") not in (False, "false"):
                found.append(f"{name}: {job_name}: actions/checkout without persist-credentials: false")
        for kind, spec in [*((job.get("services") or {}).items()), ("container", job.get("container"))]:
            image = spec.get("image") if isinstance(spec, dict) else spec
            if image and not IMAGE_BY_DIGEST.search(str(image)):
                found.append(f"{name}: {job_name}: {kind} image {image} is not pinned by digest")
    if pr_runs:
        for secret in sorted(set(SECRET.findall(text)) - {"GITHUB_TOKEN"}):
            found.append(f"{name}: a pull request's run can read secrets.{secret}")
    found += _uses_violations(name, text)
    for script in _run_scripts(flow):
        joined = script.replace("\\\n", " ")
        for line in joined.splitlines():
            if re.search(r"\bpip3?\"?\s+(install|download)\b", line) and "--require-hashes" not in line:
                found.append(f"{name}: pip without --require-hashes: {line.strip()}")
    return found


def _uses_violations(name: str, text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        match = USES_LINE.match(line)
        if not match:
            continue
        ref, comment = match.group("ref").strip("'\""), (match.group("comment") or "").strip()
        if ref.startswith("./"):
            continue
        if ref.startswith("docker://"):
            if not IMAGE_BY_DIGEST.search(ref):
                found.append(f"{name}:{number}: {ref} is not pinned by digest")
            continue
        if not PINNED_ACTION.match(ref):
            found.append(f"{name}:{number}: {ref} is not pinned by a 40-hex commit SHA")
        elif not VERSION_COMMENT.match(comment):
            found.append(f"{name}:{number}: {ref} has no version comment (`# vX.Y.Z`)")
    return found


def lock_problems(requirements: Path, lock: Path) -> list[str]:
    """What keeps `lock` from being a hash lock of `requirements` (empty: none)."""
    problems = []
    entries: dict[str, tuple[str, bool]] = {}
    for block in re.split(r"\n(?=\S)", lock.read_text()):
        first = block.strip().split()[0] if block.strip() else ""
        if not first or first.startswith("#"):
            continue
        name, _, version = first.partition("==")
        if not version:
            problems.append(f"{lock.name}: {first} is not pinned with ==")
            continue
        key = re.sub(r"[-_.]+", "-", name).lower()
        entries[key] = (version, "--hash=sha256:" in block)
        if "--hash=sha256:" not in block:
            problems.append(f"{lock.name}: {name}=={version} has no --hash")
    for raw in requirements.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        key = re.sub(r"[-_.]+", "-", req.name).lower()
        if key not in entries:
            problems.append(f"{req.name} is in {requirements.name} but not in {lock.name}: regenerate the lock")
        elif not req.specifier.contains(Version(entries[key][0]), prereleases=True):
            problems.append(f"{lock.name}: {req.name}=={entries[key][0]} does not satisfy {req}: regenerate the lock")
    return problems


# ---- the release path -------------------------------------------------------------------------------

# A way out of the runner that is not bakery.release (which gates, then pushes, reads back and records).
PUSHES = re.compile(r"docker\s+push\b|buildx\s+bake\b[^\n]*--push\b|push=true|type=registry|imagetools\s+create")
VERIFIED_REFS = ('"$RECORDS_DIR"/*.json', '.repository + "@" + .digest')
# The tested cosign calls (bakery.release.sign), keyless, with the workflow's own shell variables.
TESTED_COSIGN = {"sign": sign_command("$ref"), "attest": attest_command("$ref", "$SBOM_DIR/$target.cdx.json")}


def _steps(flow: dict[str, Any], job: str) -> list[dict[str, Any]]:
    return list(((flow.get("jobs") or {}).get(job) or {}).get("steps") or [])


def _first(steps: list[dict[str, Any]], needle: str, key: str = "run") -> int | None:
    return next((i for i, step in enumerate(steps) if needle in str(step.get(key, ""))), None)


def release_violations(flows: dict[str, dict[str, Any]]) -> list[str]:
    """The release path's rules (see the module docstring); [] when kept or when the files are absent."""
    found: list[str] = []
    for name, flow in flows.items():
        for job_name, job in (flow.get("jobs") or {}).items():
            steps = job.get("steps") or []
            for step in steps:
                if PUSHES.search(str(step.get("run", ""))):
                    found.append(f"{name}: {job_name}: a step pushes an image itself ({step.get('name', 'unnamed')}); "
                                 "only python -m bakery.release publishes")
            found += _signing_violations(name, job_name, job)
    if "image-build.yml" in flows:
        found += _build_violations(flows["image-build.yml"])
    if "images.yml" in flows and "manifest" in (flows["images.yml"].get("jobs") or {}):
        steps = _steps(flows["images.yml"], "manifest")
        if _first(steps, "cosign attest") is None:
            found.append("images.yml: manifest: the verified digests get no SBOM attestation (cosign attest)")
        if _first(steps, "sbom-*", "with") is None:
            found.append("images.yml: manifest: the platform jobs' SBOM artifacts (sbom-*) are not downloaded")
    return found


def _build_violations(flow: dict[str, Any]) -> list[str]:
    found = []
    steps = _steps(flow, "build")
    verify = _first(steps, "python -m bakery.release verify")
    if verify is None:
        return ["image-build.yml: build: no `python -m bakery.release verify` step (the gate)"]
    script = str(steps[verify].get("run", ""))
    if not re.search(r"--push --provenance\b", script):
        found.append("image-build.yml: build: the release push does not ask for the builder's provenance "
                     "(verify --push --provenance)")
    sbom = _first(steps, "python -m bakery.release sbom")
    if sbom is None or sbom < verify:
        found.append("image-build.yml: build: the verified image's SBOM is not extracted after the gate "
                     "(python -m bakery.release sbom --record ...)")
    elif '--record "$RECORDS_DIR/$TARGET.json"' not in str(steps[sbom].get("run", "")):
        found.append("image-build.yml: build: the SBOM is not taken from the image the verified record names")
    upload = next((i for i, step in enumerate(steps) if str(step.get("uses", "")).startswith("actions/upload-artifact@")
                   and "SBOM_DIR" in str((step.get("with") or {}).get("path", ""))), None)
    if upload is None or sbom is None or upload < sbom or \
            (steps[upload].get("with") or {}).get("if-no-files-found") != "error":
        found.append("image-build.yml: build: the SBOM is not kept as an artifact after it is extracted "
                     "(upload-artifact, if-no-files-found: error)")
    for index in [i for i in (verify, sbom) if i is not None]:
        if steps[index].get("continue-on-error") or "always()" in str(steps[index].get("if", "")):
            found.append(f"image-build.yml: build: {steps[index].get('name')} may be passed over when it fails")
    return found


def _signing_violations(name: str, job_name: str, job: dict[str, Any]) -> list[str]:
    found = []
    steps = job.get("steps") or []
    assemble = _first(steps, "python -m bakery.release assemble")
    signing = [(i, str(step.get("run", ""))) for i, step in enumerate(steps)
               if re.search(r"\bcosign\s+(sign|attest)\b", str(step.get("run", "")))]
    for index, script in signing:
        where = f"{name}: {job_name}: step {index + 1}"
        if assemble is None or index < assemble:
            found.append(f"{where}: cosign runs before `bakery.release assemble` checked the digests")
        calls = [line.strip() for line in script.splitlines() if re.search(r"\bcosign\s+(sign|attest)\b", line)]
        if not all(needle in script for needle in VERIFIED_REFS) or \
                not all(call.endswith('"$ref"') for call in calls):
            found.append(f"{where}: cosign is not given the verified records' digests ({VERIFIED_REFS[1]}, "
                         'as "$ref")')
        if "--key" in script:
            found.append(f"{where}: cosign with --key: the release signs keylessly")
        for call in calls:
            words = shlex.split(call)
            tested = TESTED_COSIGN.get(words[1] if len(words) > 1 else "", [])
            if words != tested:
                found.append(f"{where}: `{call}` is not the tested cosign call (bakery.release.sign): "
                             f"{shlex.join(tested)}")
        if "cosign attest" in script and not ("--type cyclonedx" in script and '--predicate "$SBOM_DIR/' in script):
            found.append(f"{where}: the SBOM attestation is not the CycloneDX SBOM of $SBOM_DIR")
    if "id-token" in _writes(job.get("permissions")) and not signing:
        found.append(f"{name}: {job_name}: id-token: write in a job that signs nothing")
    return found
