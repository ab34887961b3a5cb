"""The engines' release feeds: which stable release a spec's `upstream.releases` feed announces last.

Two kinds of feed (bakery/spec/engine_spec.py, `ReleaseFeed`):

- `pypi: <project>`: PyPI's JSON API (`<PYPI_URL>/<project>/json`). A release counts when its version is
  a PEP 440 final or post release (no a/b/rc/dev) and at least one of its files is not yanked.
- `registry: <host>/<owner>/<name>` with `tag: <prefix>{release}<suffix>`: the repository's tag list
  (Docker Registry HTTP API v2, `/v2/<owner>/<name>/tags/list`, anonymous bearer token as the registry's
  401 asks for it, pages followed through `Link: <...>; rel="next"`). A tag counts when it is the
  template with a release made of digits and dots (llama.cpp's `server-b11434`); the newest is the
  highest such release.

The parsing is pure (`newest_pypi_release`, `newest_tagged_release`) so tests feed it recorded answers;
the fetching follows `BAKERY_BUMP_PYPI_URL` and `BAKERY_BUMP_REGISTRY_URL` (instead of `https://<host>`)
so tests and mirrors can point it at a local server. Every loop is bounded (MAX_PAGES).
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from typing import Any

from packaging.version import InvalidVersion, Version

from bakery.errors import InputError
from bakery.spec.engine_spec import ReleaseFeed

PYPI_URL_VAR = "BAKERY_BUMP_PYPI_URL"
PYPI_URL = "https://pypi.org/pypi"
REGISTRY_URL_VAR = "BAKERY_BUMP_REGISTRY_URL"
TIMEOUT_SECONDS = 60
PAGE_SIZE = 1000
MAX_PAGES = 200  # 200 000 tags: far more than any engine's repository holds
RELEASE_IN_TAG = r"(?P<release>\d+(?:\.\d+)*)"
MAX_BYTES = 64 * 1024 * 1024
USER_AGENT = "bakery-bump"


def describe(feed: ReleaseFeed) -> str:
    """The feed as messages name it: `PyPI vllm` or `ghcr.io/ggml-org/llama.cpp tags server-b{release}`."""
    return f"PyPI {feed.pypi}" if feed.pypi else f"{feed.registry} tags {feed.tag}"


def newest_pypi_release(data: Any, where: str) -> str:
    """The highest stable, not fully yanked release in a PyPI JSON answer (`where` names the feed)."""
    releases = data.get("releases") if isinstance(data, dict) else None
    if not isinstance(releases, dict):
        raise InputError(f"{where}: malformed feed: no 'releases' object (is it PyPI's /pypi/<project>/json?)")
    stable: list[Version] = []
    for name, files in releases.items():
        if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
            raise InputError(f"{where}: malformed feed: release {name!r} is not a list of files")
        try:
            version = Version(str(name))
        except InvalidVersion:
            continue  # a legacy non-PEP 440 name is never newer than a real release
        if version.is_prerelease or version.is_devrelease or not any(not f.get("yanked", False) for f in files):
            continue
        stable.append(version)
    if not stable:
        raise InputError(f"{where}: the feed lists no stable release (only pre-releases, yanked or empty ones)")
    return str(max(stable))


def tag_pattern(template: str) -> re.Pattern[str]:
    """The regular expression of a tag template (`server-b{release}` -> `server-b(?P<release>...)`)."""
    before, _, after = template.partition("{release}")
    return re.compile(re.escape(before) + RELEASE_IN_TAG + re.escape(after))


def newest_tagged_release(tags: Iterable[str], template: str, where: str) -> str:
    """The highest release among `tags` that are exactly `template` with a numeric release."""
    pattern = tag_pattern(template)
    found = [m.group("release") for tag in tags if (m := pattern.fullmatch(tag))]
    if not found:
        raise InputError(f"{where}: no tag matches {template!r}")
    return max(found, key=Version)


def newest_release(feed: ReleaseFeed) -> str:
    """Ask the feed (network) for its newest stable release."""
    where = describe(feed)
    if feed.pypi is not None:
        base = os.environ.get(PYPI_URL_VAR, PYPI_URL).rstrip("/")
        data, _ = _get_json(f"{base}/{urllib.parse.quote(feed.pypi)}/json", where)
        return newest_pypi_release(data, where)
    assert feed.registry is not None and feed.tag is not None  # ReleaseFeed validates the pair
    return newest_tagged_release(registry_tags(feed.registry, feed.tag, where), feed.tag, where)


def registry_tags(registry: str, template: str, where: str) -> list[str]:
    """The repository's tags from the one that sorts just before the template's fixed prefix on."""
    host, _, repository = registry.partition("/")
    base = os.environ.get(REGISTRY_URL_VAR, f"https://{host}").rstrip("/")
    prefix = template.partition("{release}")[0]
    # Tags come in lexical order, so `last` skips straight to the prefix's range (a registry that ignores
    # it is simply paged through from the start).
    url: str | None = f"{base}/v2/{repository}/tags/list?" + urllib.parse.urlencode({"n": PAGE_SIZE, "last": prefix})
    token: str | None = None
    tags: list[str] = []
    for _ in range(MAX_PAGES):
        if url is None:
            return tags
        data, headers, token = _get_registry_page(url, token, where)
        page = data.get("tags") if isinstance(data, dict) else None
        if page is None and isinstance(data, dict) and "tags" in data:
            page = []  # a repository without tags answers "tags": null
        if not isinstance(page, list) or not all(isinstance(t, str) for t in page):
            raise InputError(f"{where}: malformed feed: no 'tags' list in {url}")
        tags += page
        if page and page[-1] > prefix and not page[-1].startswith(prefix):
            return tags  # past the prefix's range: no later page can match
        url = _next_link(headers.get("Link"), url)
    raise InputError(f"{where}: more than {MAX_PAGES} pages of tags; refusing to page on")


def _get_registry_page(url: str, token: str | None, where: str) -> tuple[Any, Any, str | None]:
    """One page of tags; on a 401 asking for a bearer token, get an anonymous pull token and retry once."""
    try:
        data, headers = _get_json(url, where, token=token, raise_401=True)
        return data, headers, token
    except _Unauthorized as exc:
        token = _bearer_token(exc.challenge, where)
        data, headers = _get_json(url, where, token=token)
        return data, headers, token


class _Unauthorized(Exception):
    def __init__(self, challenge: str) -> None:
        super().__init__(challenge)
        self.challenge = challenge


def _bearer_token(challenge: str, where: str) -> str:
    """An anonymous token from the realm a `WWW-Authenticate: Bearer realm=...,service=...,scope=...` names."""
    scheme, _, params = challenge.partition(" ")
    fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
    if scheme.lower() != "bearer" or "realm" not in fields:
        raise InputError(f"{where}: the registry wants {scheme or 'unknown'} authentication, not an anonymous "
                         "bearer token; the feed must be a public repository")
    query = urllib.parse.urlencode({k: v for k, v in fields.items() if k in ("service", "scope")})
    data, _ = _get_json(fields["realm"] + ("?" + query if query else ""), where)
    token = (data.get("token") or data.get("access_token")) if isinstance(data, dict) else None
    if not isinstance(token, str) or not token:
        raise InputError(f"{where}: malformed token answer from {fields['realm']} (no 'token')")
    return token


def _next_link(link: str | None, current: str) -> str | None:
    """The `rel="next"` target of a Link header, resolved against the current URL."""
    for part in (link or "").split(","):
        match = re.fullmatch(r'\s*<([^>]+)>\s*;\s*rel="?next"?\s*', part)
        if match:
            return urllib.parse.urljoin(current, match.group(1))
    return None


def _get_json(url: str, where: str, token: str | None = None, raise_401: bool = False) -> tuple[Any, Any]:
    # Only http(s): a token realm or a Link a registry sends must not make this read a local file.
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise InputError(f"{where}: refusing to fetch {url!r}: only http and https feeds are followed")
    request = urllib.request.Request(  # noqa: S310 - the scheme is checked just above
        url, headers={"Accept": "application/json", "User-Agent": USER_AGENT})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:  # noqa: S310 - checked above
            body = response.read(MAX_BYTES + 1)
            headers = response.headers
    except urllib.error.HTTPError as exc:
        if exc.code == 401 and raise_401 and exc.headers.get("WWW-Authenticate"):
            raise _Unauthorized(exc.headers["WWW-Authenticate"]) from None
        raise InputError(f"{where}: {url} answered HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise InputError(f"{where}: cannot reach {url}: {reason}") from None
    if len(body) > MAX_BYTES:
        raise InputError(f"{where}: {url} answered more than {MAX_BYTES} bytes")
    try:
        return json.loads(body), headers
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InputError(f"{where}: malformed feed: {url} did not answer JSON") from None
