"""python -m bakery.upkeep.bump against recorded release feeds (tests/unit/fixtures/bump/) served on loopback:
nothing newer leaves a spec byte for byte; a newer release is an exact, minimal textual edit; pre-, dev
and yanked releases are ignored; a malformed feed is one line and exit 2.

Each test bumps a copy of the real spec pinned a known release behind (so the tests stay true after the
real specs are bumped), never images/ itself.
"""

from __future__ import annotations

import copy
import difflib
import json
import shutil
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from bakery.errors import InputError
from bakery.spec.engine_spec import IMAGES_DIR, REPO_ROOT, load_engine, load_spec_file
from bakery.upkeep import bump
from bakery.upkeep import feeds as upstream_feeds

FIXTURES = Path(__file__).parent / "fixtures" / "bump"
PYPI_VLLM = json.loads((FIXTURES / "pypi-vllm.json").read_text())
PYPI_SGLANG = json.loads((FIXTURES / "pypi-sglang.json").read_text())
LLAMA_TAGS = json.loads((FIXTURES / "registry-llama.cpp-tags.json").read_text())["tags"]
TOKEN = "anonymous-pull-token"  # noqa: S105 - the loopback registry's test token, no secret
PAGE = 2  # tags per page: far below the client's n, so the prefix's range spans several Link pages


class Feeds:
    """A loopback stand-in for PyPI's JSON API and a token-authenticated registry's tag list."""

    def __init__(self) -> None:
        self.pypi: dict[str, Any] = {"vllm": PYPI_VLLM, "sglang": PYPI_SGLANG}
        self.raw_pypi: dict[str, bytes] = {}
        self.tags: list[str] = list(LLAMA_TAGS)
        self.requests: list[str] = []
        feeds = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                feeds.requests.append(self.path)
                parts = url.path.strip("/").split("/")
                if parts[0] == "pypi" and len(parts) == 3 and parts[2] == "json":
                    project = parts[1]
                    if project in feeds.raw_pypi:
                        return self.send(200, feeds.raw_pypi[project])
                    if project not in feeds.pypi:
                        return self.send(404, b'{"message": "Not Found"}')
                    return self.send(200, json.dumps(feeds.pypi[project]).encode())
                if url.path == "/token":
                    ok = query == {"service": "test-registry", "scope": "repository:ggml-org/llama.cpp:pull"}
                    return self.send(200 if ok else 400, json.dumps({"token": TOKEN} if ok else {}).encode())
                if url.path == "/v2/ggml-org/llama.cpp/tags/list":
                    if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                        challenge = (f'Bearer realm="{feeds.url}/token",service="test-registry",'
                                     'scope="repository:ggml-org/llama.cpp:pull"')
                        return self.send(401, b'{"errors": [{"code": "UNAUTHORIZED"}]}',
                                         {"WWW-Authenticate": challenge})
                    after = [t for t in sorted(feeds.tags) if t > query.get("last", "")]
                    page, rest = after[:PAGE], after[PAGE:]
                    headers = {}
                    if rest:
                        headers["Link"] = f'</v2/ggml-org/llama.cpp/tags/list?n={PAGE}&last={page[-1]}>; rel="next"'
                    return self.send(200, json.dumps({"name": "ggml-org/llama.cpp", "tags": page}).encode(), headers)
                return self.send(404, b"{}")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def env(self) -> dict[str, str]:
        return {upstream_feeds.PYPI_URL_VAR: f"{self.url}/pypi", upstream_feeds.REGISTRY_URL_VAR: self.url}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def feeds(monkeypatch: pytest.MonkeyPatch) -> Iterator[Feeds]:
    served = Feeds()
    for name, value in served.env().items():
        monkeypatch.setenv(name, value)
    yield served
    served.close()


def pinned_copy(tmp_path: Path, engine: str, version: str) -> Path:
    """images/ copied to tmp_path, with `engine` pinned at `version` wherever the real spec names its own."""
    images = tmp_path / "images"
    shutil.copytree(IMAGES_DIR, images)
    spec = load_engine(engine)
    path = images / f"{engine}.yaml"
    path.write_text(path.read_text().replace(spec.version, version))
    assert load_spec_file(path).version == version
    return images


def run(images: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bakery.upkeep.bump", "--images-dir", str(images), *args],
                          cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120, check=False,
                          env={"PATH": "/usr/bin:/bin", **env})


def changed_lines(before: str, after: str) -> list[tuple[str, str]]:
    """(old, new) for each line that differs; the texts must have the same line structure."""
    old, new = before.splitlines(), after.splitlines()
    assert len(old) == len(new), "a bump adds or removes no line"
    return [(a, b) for a, b in zip(old, new, strict=True) if a != b]


def test_nothing_newer_leaves_every_spec_byte_for_byte(tmp_path: Path, feeds: Feeds) -> None:
    images = pinned_copy(tmp_path, "vllm", "v0.33.0")  # PyPI's newest in the recording
    before = (images / "vllm.yaml").read_bytes()
    proc = run(images, "--engine", "vllm", env=feeds.env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "vllm: v0.33.0 is current (PyPI vllm newest: 0.33.0)\n"
    assert (images / "vllm.yaml").read_bytes() == before


def test_a_newer_release_is_an_exact_minimal_edit(tmp_path: Path, feeds: Feeds) -> None:
    images = pinned_copy(tmp_path, "vllm", "v0.32.0")
    path = images / "vllm.yaml"
    before = path.read_text()
    summary = tmp_path / "summary.md"
    proc = run(images, "--engine", "vllm", "--summary", str(summary), env=feeds.env())
    assert proc.returncode == 0, proc.stderr
    # vLLM's CUDA 12.9 line (base.cuda_lines) names the release in its own base's tag: it moves too.
    assert proc.stdout == (f"{path}: version v0.32.0 -> v0.33.0; "
                           "base.image vllm/vllm-openai:v0.32.0 -> vllm/vllm-openai:v0.33.0; "
                           "base.cuda_lines.1.image vllm/vllm-openai:v0.32.0-cu129 -> vllm/vllm-openai:v0.33.0-cu129\n")
    after = path.read_text()
    assert changed_lines(before, after) == [("version: v0.32.0", "version: v0.33.0"),
                                            ("  image: vllm/vllm-openai:v0.32.0", "  image: vllm/vllm-openai:v0.33.0"),
                                            ('    - {cuda: "12.9", image: "vllm/vllm-openai:v0.32.0-cu129"}',
                                             '    - {cuda: "12.9", image: "vllm/vllm-openai:v0.33.0-cu129"}')]
    diff = [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert len(diff) == 6, diff  # three lines out, three in: every comment and key order kept
    assert load_spec_file(path).version == "v0.33.0"
    assert [v.image for v in load_spec_file(path).base.cuda_variants] == ["vllm/vllm-openai:v0.33.0",
                                                                         "vllm/vllm-openai:v0.33.0-cu129"]
    assert "- **vllm** 0.32.0 -> 0.33.0 (PyPI vllm):" in summary.read_text()


def test_pre_dev_and_yanked_releases_are_ignored(tmp_path: Path, feeds: Feeds) -> None:
    feed = copy.deepcopy(PYPI_VLLM)
    wheel = {"filename": "vllm-x.whl", "packagetype": "bdist_wheel", "yanked": False, "upload_time": "2026-11-20"}
    for name in ("0.34.0rc1", "0.34.0a2", "0.34.0b1", "0.34.0.dev20261120", "1.0.0rc0"):
        feed["releases"][name] = [wheel]
    feed["releases"]["0.35.0"] = [{**wheel, "yanked": True}]  # withdrawn: every file yanked
    feed["releases"]["0.36.0"] = []  # announced, nothing uploaded
    feed["releases"]["not-a-version"] = [wheel]
    feeds.pypi["vllm"] = feed
    images = pinned_copy(tmp_path, "vllm", "v0.33.0")
    before = (images / "vllm.yaml").read_bytes()
    proc = run(images, "--engine", "vllm", env=feeds.env())
    assert (proc.returncode, proc.stdout) == (0, "vllm: v0.33.0 is current (PyPI vllm newest: 0.33.0)\n"), proc.stderr
    assert (images / "vllm.yaml").read_bytes() == before
    # a post release is a release
    feed["releases"]["0.33.0.post1"] = [wheel]
    assert upstream_feeds.newest_pypi_release(feed, "PyPI vllm") == "0.33.0.post1"


@pytest.mark.parametrize("body, message", [
    (b"<html>Service Unavailable</html>", "malformed feed: {url}/pypi/vllm/json did not answer JSON"),
    (b'{"info": {"name": "vllm"}}', "malformed feed: no 'releases' object (is it PyPI's /pypi/<project>/json?)"),
    (b'{"releases": {"0.34.0": "vllm-0.34.0.tar.gz"}}', "malformed feed: release '0.34.0' is not a list of files"),
    (b'{"releases": {"0.34.0rc1": [{"yanked": false}]}}',
     "the feed lists no stable release (only pre-releases, yanked or empty ones)"),
])
def test_a_malformed_feed_is_one_line_and_exit_2(tmp_path: Path, feeds: Feeds, body: bytes, message: str) -> None:
    feeds.raw_pypi["vllm"] = body
    images = pinned_copy(tmp_path, "vllm", "v0.32.0")
    before = (images / "vllm.yaml").read_bytes()
    proc = run(images, "--all", env=feeds.env())
    assert proc.returncode == 2
    assert proc.stderr == f"bakery.upkeep.bump: PyPI vllm: {message.format(url=feeds.url)}\n"
    assert (images / "vllm.yaml").read_bytes() == before, "a failed run writes no spec"


def test_an_unreachable_feed_is_one_line_and_exit_2(tmp_path: Path, feeds: Feeds) -> None:
    images = pinned_copy(tmp_path, "vllm", "v0.32.0")
    proc = run(images, "--engine", "vllm", env={**feeds.env(), upstream_feeds.PYPI_URL_VAR: f"{feeds.url}/nowhere"})
    assert (proc.returncode, proc.stderr) == (
        2, f"bakery.upkeep.bump: PyPI vllm: {feeds.url}/nowhere/vllm/json answered HTTP 404 Not Found\n")


def test_llama_follows_the_registry_tags_through_token_and_pages(tmp_path: Path, feeds: Feeds) -> None:
    images = pinned_copy(tmp_path, "llama", "b11400")
    path = images / "llama.yaml"
    before = path.read_text()
    proc = run(images, "--engine", "llama", env=feeds.env())
    assert proc.returncode == 0, proc.stderr
    after = path.read_text()
    # server-b11515 is the newest server image; full-/server-cuda-/branch tags and server-v0.5.0 do not count
    assert changed_lines(before, after) == [
        ("version: b11400", "version: b11515"),
        ("  image: ghcr.io/ggml-org/llama.cpp:server-b11400", "  image: ghcr.io/ggml-org/llama.cpp:server-b11515")]
    tag_requests = [r for r in feeds.requests if r.startswith("/v2/")]
    assert tag_requests[0] == f"/v2/ggml-org/llama.cpp/tags/list?n={upstream_feeds.PAGE_SIZE}&last=server-b"
    assert len(tag_requests) >= 3, "the token retry and at least one Link page were followed"
    assert "/token?service=test-registry&scope=repository%3Aggml-org%2Fllama.cpp%3Apull" in feeds.requests


def test_paging_is_bounded(feeds: Feeds, monkeypatch: pytest.MonkeyPatch) -> None:
    feeds.tags = [f"server-a{i:04d}" for i in range(100)]  # all before the prefix: no page ends the search
    monkeypatch.setattr(upstream_feeds, "MAX_PAGES", 3)
    monkeypatch.setattr(upstream_feeds, "PAGE_SIZE", 1)
    with pytest.raises(InputError, match="more than 3 pages of tags; refusing to page on"):
        upstream_feeds.registry_tags("ghcr.io/ggml-org/llama.cpp", "server-a{release}", "feed")


def _lines_at(spec, version: str) -> list:
    """The spec's CUDA lines with each own base's tag moved to `version`."""
    return [line.model_copy(update={"image": line.image.replace(spec.version, version)}) if line.image else line
            for line in spec.base.cuda_lines]


def test_a_pinned_digest_is_dropped_and_upstream_tag_follows() -> None:
    spec = load_engine("vllm")
    lines = _lines_at(spec, "v0.32.0")
    pinned = spec.model_copy(update={
        "version": "v0.32.0",
        "base": spec.base.model_copy(update={"image": "vllm/vllm-openai:v0.32.0@sha256:" + "a" * 64,
                                             "cuda_lines": lines}),
        "upstream": spec.upstream.model_copy(update={"tag": "release/v0.32.0"}),
    })
    line_changes = tuple(bump.Change(f"base.cuda_lines.{index}.image", line.image,
                                     line.image.replace("v0.32.0", "v0.33.0"))
                         for index, line in enumerate(lines) if line.image)
    assert line_changes, "vllm carries a CUDA line besides its default one"
    assert bump.plan(pinned, "0.33.0") == (
        bump.Change("version", "v0.32.0", "v0.33.0"),
        bump.Change("base.image", "vllm/vllm-openai:v0.32.0@sha256:" + "a" * 64, "vllm/vllm-openai:v0.33.0"),
        *line_changes,
        bump.Change("upstream.tag", "release/v0.32.0", "release/v0.33.0"),
    )
    assert bump.plan(pinned, "0.32.0") == ()
    assert bump.plan(pinned, "0.31.0") == (), "an older feed never moves a spec back"


@pytest.mark.parametrize("update, message", [
    ({"version": "0.32.0"}, "images/vllm.yaml: version: '0.32.0' is not spelled as upstream.releases.version "
                            "'v{release}'; make them agree"),
    ({"version": "v0.32.0", "image": "vllm/vllm-openai:latest"},
     "images/vllm.yaml: base.image: the tag 'latest' does not contain the version 'v0.32.0', so the new tag "
     "cannot be derived; set base.image by hand"),
])
def test_a_spec_the_rule_cannot_bump_is_refused(update: dict[str, str], message: str) -> None:
    spec = load_engine("vllm")
    changed = spec.model_copy(update={"version": update["version"]})
    changed = changed.model_copy(update={"base": spec.base.model_copy(
        update={"cuda_lines": _lines_at(spec, update["version"])})})
    if "image" in update:
        changed = changed.model_copy(update={"base": spec.base.model_copy(update={"image": update["image"]})})
    with pytest.raises(InputError) as raised:
        bump.plan(changed, "0.33.0")
    assert str(raised.value) == message


def test_a_cuda_line_whose_tag_lacks_the_version_is_refused() -> None:
    spec = load_engine("vllm")
    index = next(i for i, line in enumerate(spec.base.cuda_lines) if line.image)
    lines = list(spec.base.cuda_lines)
    lines[index] = lines[index].model_copy(update={"image": "vllm/vllm-openai:latest-cu129"})
    changed = spec.model_copy(update={"version": "v0.32.0", "base": spec.base.model_copy(
        update={"image": "vllm/vllm-openai:v0.32.0", "cuda_lines": lines})})
    with pytest.raises(InputError) as raised:
        bump.plan(changed, "0.33.0")
    assert str(raised.value) == (f"images/vllm.yaml: base.cuda_lines.{index}.image: the tag 'latest-cu129' does not "
                                 "contain the version 'v0.32.0', so the new tag cannot be derived; set it by hand")


def test_rewrite_touches_only_the_value_even_when_quoted_or_commented() -> None:
    text = ('name: x  # v1.0 is mentioned here too\nversion: "v1.0"   # pinned\nbase:\n'
            "  image: 'repo/x:v1.0'  # tag\n")
    out = bump.rewrite(text, (bump.Change("version", "v1.0", "v1.1"), bump.Change("base.image", "repo/x:v1.0",
                                                                                  "repo/x:v1.1")), "x.yaml")
    assert out == ('name: x  # v1.0 is mentioned here too\nversion: "v1.1"   # pinned\nbase:\n'
                   "  image: 'repo/x:v1.1'  # tag\n")


def test_the_real_specs_follow_a_feed_and_read_back() -> None:
    for engine in ("vllm", "sglang", "llama"):
        spec = load_engine(engine)
        assert spec.upstream.releases is not None, f"{engine} names no release feed"
        release = bump.release_of(spec, spec.upstream.releases)
        assert spec.upstream.releases.version.format(release=release) == spec.version


def test_no_engine_is_bad_input() -> None:
    proc = subprocess.run([sys.executable, "-m", "bakery.upkeep.bump"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=60, check=False)
    assert (proc.returncode, proc.stderr) == (2, "bakery.upkeep.bump: no engine chosen: pass --engine NAME or --all\n")
