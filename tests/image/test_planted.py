"""The gate can fail: defects planted in a rendered Dockerfile, and worker guards taken out of an
image, are each caught, by a named check.

Built on the SGLang stand-in base (the fastest engine to boot). A defect in the rendered Dockerfile is
built from a whole build context (the layers before it come from the cache); a guard taken out and a
step added at the end change only the pristine image's last layer, so they are built as one step FROM
the pristine image (the same image a context rebuild would give, without sending the context again).
"""

from __future__ import annotations

import ast
import os
import re
import uuid
from pathlib import Path

import pytest

from bakery.bases import make as bases
from bakery.build.builder import build_args, context_dir
from bakery.build.verify import run_gate
from bakery.docker.build import build
from bakery.host.wheelhouse import wheelhouse
from bakery.recipe.render import RenderOptions, render, write_context
from bakery.spec.engine_spec import REPO_ROOT, load_engine
from tests.image.conftest import LEFTOVER_NOTE, SUITE_TAG
from tests.image.launch import RUN_ID_VAR, leftover_containers

pytestmark = pytest.mark.planted

ENGINE = "sglang"
# One context directory per checkout (BAKERY_SUITE_TAG), so two checkouts' planted runs never share one.
PLANTED_CONTEXT = f"planted-{ENGINE}-{SUITE_TAG}"


def _drop_env(name: str):
    def plant(dockerfile: str) -> str:
        lines = dockerfile.split("\n")
        index = next(i for i, line in enumerate(lines) if f"{name}=" in line)
        line = lines[index]
        if line.startswith("ENV "):  # first of a continued ENV: keep the instruction, drop the pair
            lines[index + 1] = "ENV " + lines[index + 1].strip()
        elif not line.rstrip().endswith("\\"):  # last pair: end the instruction on the line before
            lines[index - 1] = lines[index - 1].rstrip().removesuffix("\\").rstrip()
        del lines[index]
        return "\n".join(lines)
    return plant


# defect name -> (how to plant it, the checks that must catch it)
DEFECTS = {
    "no BACKEND": (_drop_env("BACKEND"), {"test_baked_env_is_exact", "test_backend_resolves_to_worker"}),
    "wrong MODEL_LOG": (lambda d: d.replace(f"/var/log/portal/{ENGINE}.log", "/var/log/portal/wrong.log"),
                        {"test_baked_env_is_exact"}),
    "no EXPOSE": (lambda d: d.replace("\nEXPOSE 3000\n", "\n"), {"test_worker_port_exposed"}),
    "missing worker": (lambda d: d.replace("COPY --from=worker-build /opt/bakery-worker/ /opt/bakery/worker/\n", ""),
                       {"test_backend_resolves_to_worker", "test_worker_listens_on_3000"}),
    "no HEALTHCHECK": (lambda d: re.sub(r"\nHEALTHCHECK [^\n]*\\\n[^\n]*\n", "\n", d),
                       {"test_healthcheck_runs_the_health_command"}),
    "engine not on 18000": (lambda d: d.replace('"--port","18000"', '"--port","18001"'),
                            {"test_engine_listens_on_18000", "test_worker_reports_ready"}),
}


def gate_run(image_id: str, monkeypatch: pytest.MonkeyPatch, docker_client, catchers: set[str] | None = None, *,
             engine: str = ENGINE, baked_digest: str | None = None):
    """run_gate on `image_id` of `engine` (only `catchers` when given; `baked_digest`: the model the build baked)
    as a run of its own, which must leave no container behind: none of its label remains, and its fixtures
    removed them (no backstop sweep)."""
    run_id = f"planted-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(RUN_ID_VAR, run_id)
    extra = ["-k", " or ".join(sorted(catchers))] if catchers else None
    gate = run_gate(image_id, engine, variant="local", quiet=True, extra=extra, baked_digest=baked_digest)
    monkeypatch.delenv(RUN_ID_VAR)
    assert not leftover_containers(docker_client, run_id), f"the gate left containers behind: {gate.output[-2000:]}"
    assert LEFTOVER_NOTE not in gate.output, f"a check left containers for the sweep to remove:\n{gate.output[-2000:]}"
    return gate


def assert_caught(gate, defect: str, catchers: set[str]) -> None:
    """A gate run on an image with `defect` ran checks, and every one of `catchers` failed."""
    assert gate.ran, f"no check ran with {defect!r}:\n{gate.output[-3000:]}"
    assert not gate.passed, f"the gate passed an image with {defect!r}"
    failed = {name.split("[")[0] for name in gate.failed}
    assert catchers <= failed, f"{defect!r}: expected {sorted(catchers)} to fail, failed: {sorted(failed)}"


@pytest.fixture(scope="module")
def pristine(docker_client):
    spec = load_engine(ENGINE)
    bases.ensure_base("debian")
    return render(spec, RenderOptions(base_image=bases.ensure_base(spec.base.local)))


# The classic builder reads `FROM sha256:...` as a registry name: the pristine image gets a test tag.
PRISTINE_TAG = f"bakery-test/planted-pristine:{SUITE_TAG}"


@pytest.fixture(scope="module")
def pristine_image(pristine, docker_client) -> str:
    """The pristine image, built once from its whole build context as build.py builds it, and tagged
    PRISTINE_TAG (a test tag) so that overlays can build FROM it."""
    context = write_context(pristine, context_dir(PLANTED_CONTEXT), wheelhouse())
    image_id = build(context, lambda _m: None, buildargs=build_args()).image_id
    repository, _, tag = PRISTINE_TAG.rpartition(":")
    docker_client.images.get(image_id).tag(repository, tag)
    return image_id


def overlay(tmp_path: Path, step: str, files: dict[str, str] | None = None) -> str:
    """An image FROM the pristine one with one more step (a COPY of `files`, or a RUN): the defect only."""
    for name, text in (files or {}).items():
        (tmp_path / name).write_text(text)
    (tmp_path / "Dockerfile").write_text(f"FROM {PRISTINE_TAG}\n{step}\n")
    return build(tmp_path, lambda _m: None).image_id


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_planted_defect_is_caught(defect: str, pristine, monkeypatch: pytest.MonkeyPatch, docker_client) -> None:
    plant, catchers = DEFECTS[defect]
    planted = plant(pristine.dockerfile)
    assert planted != pristine.dockerfile, f"the defect {defect!r} was not planted"
    context = write_context(pristine, context_dir(PLANTED_CONTEXT), wheelhouse())
    (context / "Dockerfile").write_text(planted)
    image_id = build(context, lambda _m: None, buildargs=build_args()).image_id
    # A broken worker never gets ready: a short bound keeps each defect's gate run quick. Only the
    # defect's catchers run (the rest of the image is the pristine one's, which the control passes).
    monkeypatch.setenv("BAKERY_GATE_READY_TIMEOUT", os.environ.get("BAKERY_PLANTED_READY_TIMEOUT", "40"))
    try:
        gate = gate_run(image_id, monkeypatch, docker_client, catchers)
    finally:
        docker_client.images.remove(image_id, force=True)
    assert_caught(gate, defect, catchers)


def test_pristine_image_passes_the_same_gate(pristine_image: str, monkeypatch: pytest.MonkeyPatch,
                                            docker_client) -> None:
    # The control: without a defect the very same path passes, so the failures above are the defects'.
    gate = gate_run(pristine_image, monkeypatch, docker_client)
    assert gate.passed, f"failed: {gate.failed}\n{gate.output[-3000:]}"


# ---- worker guards taken out -----------------------------------------------------------------------
# worker/policy/guards.py names its guards in a module-level tuple ACTIVE; removing a name
# disables exactly that guard. Each guard taken out of the image must fail these platform checks.
GUARDS_FILE = Path("worker") / "policy" / "guards.py"
IMAGE_WORKER = "/opt/bakery/worker"  # where templates/base.Dockerfile.j2 copies worker/
GUARD_CATCHERS = {
    "own_url": {"test_bad_signatures_refused_401", "test_request_outcomes_reported"},
    "sessions": {"test_unsigned_sessions_refused"},
    "self_update": {"test_self_update_refused"},
    "limits": {"test_oversized_body_refused_413"},
    "not_ready": {"test_requests_get_503_until_ready"},
    "envelope": {"test_malformed_envelopes_refused_422"},
    "pubkey_retry": {"test_key_served_late_is_picked_up"},
    "log_hygiene": {"test_query_strings_not_logged"},
    "http_listener": {"test_only_worker_port_listens_outside"},
    # Forged requests add no load without it too since signed_first (the envelope guard) reports an
    # unsigned request as Rejected with no load itself (fresh run M, 0a6fead: the planted run showed it).
    "outcomes": {"test_request_outcomes_reported"},
}


def active_guards(source: str) -> tuple[tuple[str, ...], ast.expr]:
    """The names in guards.py's module-level `ACTIVE = (...)`, and the tuple's node."""
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, (ast.Tuple, ast.List))
                and any(isinstance(t, ast.Name) and t.id == "ACTIVE" for t in node.targets)):
            return tuple(ast.literal_eval(node.value)), node.value
    raise AssertionError(f"{GUARDS_FILE} has no module-level ACTIVE tuple of guard names")


def without_guard(source: str, name: str) -> str:
    """guards.py's source with `name` taken out of ACTIVE (everything else byte for byte)."""
    names, node = active_guards(source)
    assert name in names, f"{name!r} is not in ACTIVE {names}"
    data = source.encode()  # the node's offsets count UTF-8 bytes
    lines = data.splitlines(keepends=True)
    start = sum(len(line) for line in lines[:node.lineno - 1]) + node.col_offset
    end = sum(len(line) for line in lines[:node.end_lineno - 1]) + (node.end_col_offset or 0)
    return (data[:start] + repr(tuple(n for n in names if n != name)).encode() + data[end:]).decode()


def test_every_guard_has_a_catcher() -> None:
    # A new guard needs a named check that fails without it (and one taken out needs its entry gone).
    names, _ = active_guards((REPO_ROOT / GUARDS_FILE).read_text())
    assert set(names) == set(GUARD_CATCHERS), \
        f"ACTIVE {sorted(names)} differs from the planted expectations {sorted(GUARD_CATCHERS)}"


@pytest.mark.parametrize("guard", sorted(GUARD_CATCHERS))
def test_missing_guard_is_caught(guard: str, pristine_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                docker_client) -> None:
    planted = without_guard((REPO_ROOT / GUARDS_FILE).read_text(), guard)
    assert guard not in active_guards(planted)[0]
    image_id = overlay(tmp_path, f"COPY guards.py {IMAGE_WORKER}/{GUARDS_FILE.relative_to('worker')}",
                       {"guards.py": planted})
    # 40 s: with the guard in place each catcher passes well within it (the late key comes at ~20 s).
    monkeypatch.setenv("BAKERY_GATE_READY_TIMEOUT", os.environ.get("BAKERY_PLANTED_READY_TIMEOUT", "40"))
    try:
        # Only the guard's own checks run: everything else in the image is the pristine one's.
        gate = gate_run(image_id, monkeypatch, docker_client, GUARD_CATCHERS[guard])
    finally:
        docker_client.images.remove(image_id, force=True)
    assert gate.ran, f"no platform check ran without {guard!r}:\n{gate.output[-3000:]}"
    failed = {name.split("[")[0] for name in gate.failed}
    catchers = GUARD_CATCHERS[guard]
    assert catchers <= failed, f"without {guard!r}: expected {sorted(catchers)} to fail, failed: {sorted(failed)}"


# ---- what the image carries: a defect added on top of the pristine image -----------------------------
# Each is one RUN appended to the rendered Dockerfile; only its catchers run (everything else is the
# pristine image's).
SITE_PACKAGES = "$(ls -d /opt/bakery/venv/lib/python3*/site-packages)"
CONTENT_DEFECTS = {
    # A distribution the SBOM does not list (as if installed after make-sbom.sh ran).
    "unlisted distribution": (
        f'RUN d={SITE_PACKAGES}/planted-1.0.dist-info && mkdir "$d" && '
        "printf 'Metadata-Version: 2.1\\nName: planted\\nVersion: 1.0\\n' > \"$d/METADATA\"",
        {"test_sbom_lists_exactly_the_worker_venv"}),
    "setuid and world-writable": (
        "RUN chmod u+s /opt/bakery/worker/start_server.sh && mkdir -p /var/lib/bakery/shared && "
        "chmod 777 /var/lib/bakery/shared",
        {"test_bakery_files_add_no_setuid_or_world_writable"}),
    "worker writable by a group": (
        "RUN chmod g+w /opt/bakery/worker/boot/entrypoint.py",
        {"test_worker_files_writable_by_root_only"}),
}


@pytest.mark.parametrize("defect", sorted(CONTENT_DEFECTS))
def test_content_defect_is_caught(defect: str, pristine_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  docker_client) -> None:
    step, catchers = CONTENT_DEFECTS[defect]
    image_id = overlay(tmp_path, step)  # the step appended after the pristine image's last
    try:
        gate = gate_run(image_id, monkeypatch, docker_client, catchers)
    finally:
        docker_client.images.remove(image_id, force=True)
    assert_caught(gate, defect, catchers)
