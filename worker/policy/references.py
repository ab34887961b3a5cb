"""No internal address through a reference: the URLs a signed request makes the engine fetch.

The engine runs inside the instance, so each reference must be a `data:` URI or an http(s) URL whose host
resolves only to public addresses (BAKERY_ALLOW_PRIVATE_REFERENCES allows more), else 422 naming the field.
Checked after the signature, names resolved off the loop. Stdlib only. docs/security.md says what remains.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import ipaddress
import json
import logging
import re
import socket
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from config import request_path, table, uploads
from config.uploads import UploadError, UploadLimits

ALLOW_VAR = "BAKERY_ALLOW_PRIVATE_REFERENCES"
TIMEOUT_VAR = "BAKERY_REFERENCE_RESOLVE_TIMEOUT"
MAX_VAR = "BAKERY_MAX_REFERENCES"
RESOLVER_THREADS = 4  # its own pool: slow names never hold the loop's default executor
INLINE_WALK_NODES = 20_000  # a body with more values is walked on the pool, so the loop is not held
PATH_MAX = 4096  # Linux: a longer value cannot name a file

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolve = Callable[[str], Awaitable[list[str]]]

# Keys whose value the engine fetches: a URL string, or an object whose `url` is one (vLLM, SGLang,
# llama.cpp chat parts; vLLM's simple forms {"image_url": "..."}; vLLM-Omni's speech references).
URL_KEYS = frozenset({"image_url", "audio_url", "video_url", "file_url", "ref_audio", "ref_audio_2", "audio_path"})
# Objects whose inner field is inline base64 by the OpenAI API, or a URI some engines fetch.
DATA_KEYS = {"input_audio": "data", "file": "file_data"}
# {"type": "image", "image": "<url>"}: the typed parts some engines take.
TYPED_KEYS = frozenset({"image", "video", "audio"})
_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# A cloud's metadata service by name, whatever DNS says of it (Equinix's answers on a public address).
METADATA_NAMES = frozenset({
    "metadata", "metadata.google.internal", "metadata.goog", "instance-data", "instance-data.ec2.internal",
    "metadata.azure.com", "metadata.tencentyun.com", "metadata.platformequinix.com", "metadata.packet.net",
})

# Ranges refused by name, whatever this Python's ipaddress thinks (its flags changed between 3.10
# and 3.13: 192.0.0.8, fec0::1, ff02::1 and 224.0.0.1 are "global" on 3.11).
_RANGES: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "unspecified"), ("::/128", "unspecified"),
    ("127.0.0.0/8", "loopback"), ("::1/128", "loopback"),
    ("169.254.0.0/16", "link-local (the cloud metadata service's)"), ("fe80::/10", "link-local"),
    ("10.0.0.0/8", "private"), ("172.16.0.0/12", "private"), ("192.168.0.0/16", "private"),
    ("fc00::/7", "private (unique local)"), ("fec0::/10", "private (site-local)"),
    ("100.64.0.0/10", "shared (carrier-grade NAT)"),
    ("224.0.0.0/4", "multicast"), ("ff00::/8", "multicast"),
    *((net, "reserved") for net in ("192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "198.18.0.0/15",
                                    "198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4", "64:ff9b:1::/48",
                                    "100::/64", "2001::/23", "2001:db8::/32")),
)
REFUSED_RANGES: tuple[tuple[Network, str], ...] = tuple((ipaddress.ip_network(n), why) for n, why in _RANGES)
# The same as integer bounds by IP version: a request's addresses are judged without ipaddress's
# per-network property calls.
_BOUNDS: dict[int, tuple[tuple[int, int, str], ...]] = {
    version: tuple((int(n.network_address), int(n.broadcast_address), why)
                   for n, why in REFUSED_RANGES if n.version == version) for version in (4, 6)}
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

log = logging.getLogger("bakery.references")


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Policy:
    """What a reference may reach: `hosts` and `networks` allowed though not public
    (BAKERY_ALLOW_PRIVATE_REFERENCES), the resolution time of a request, the references it may carry,
    and the upload limits (a `data:` URI is bounded like an upload)."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = ()
    timeout: float = table.BY_NAME[TIMEOUT_VAR].default
    max_references: int = table.BY_NAME[MAX_VAR].default
    limits: UploadLimits = field(default_factory=UploadLimits)


def parse_allowlist(raw: str) -> tuple[frozenset[str], tuple[Network, ...]]:
    """Comma-separated host names, addresses and CIDR ranges -> (names, networks).

    Raises ValueError with one line naming the variable and the first item that is none of them.
    """
    hosts: set[str] = set()
    networks: list[Network] = []
    for item in raw.split(","):
        entry = item.strip().lower()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            continue
        except ValueError:
            pass
        url = f"http://{entry}/"
        if any(ch in entry for ch in "/:@[]") or uploads.reference_host_problem(url, urlsplit(url)):
            raise ValueError(f"{ALLOW_VAR}={raw!r} is not a list of hosts: {item.strip()!r} is neither a host "
                             "name nor an address or CIDR range; list them comma-separated, e.g. "
                             "minio.internal,10.0.0.0/8,fd00::/8")
        hosts.add(entry.rstrip("."))
    return frozenset(hosts), tuple(networks)


def load(env: Mapping[str, str], limits: UploadLimits) -> tuple[Policy, list[str]]:
    """The Policy from `env` (unset or blank: the defaults), and one error line per bad variable."""
    errors: list[str] = []
    hosts: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = ()
    raw = table.text(env, ALLOW_VAR)
    if raw is not None:
        try:
            hosts, networks = parse_allowlist(raw)
        except ValueError as exc:
            errors.append(str(exc))
    timeout = table.read(env, TIMEOUT_VAR, errors=errors)
    most = table.read(env, MAX_VAR, errors=errors)
    return Policy(hosts, networks, timeout, most, limits), errors


def describe(policy: Policy) -> str:
    """The startup line: what a reference may reach."""
    allowed = sorted(policy.hosts) + [str(n) for n in policy.networks]
    return (f"bakery-worker: references: public addresses only{', and ' + ','.join(allowed) if allowed else ''} "
            f"({ALLOW_VAR}); resolved within {policy.timeout:g}s ({TIMEOUT_VAR}); at most "
            f"{policy.max_references} per request ({MAX_VAR})")


# --------------------------------------------------------------------------- addresses


def embedded(address: Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address stands for or routes to: mapped (::ffff:a.b.c.d), compatible
    (::a.b.c.d), NAT64 (64:ff9b::a.b.c.d), 6to4 (2002:aabb:ccdd::)."""
    if not isinstance(address, ipaddress.IPv6Address):
        return []
    value = int(address)
    found = []
    if address.ipv4_mapped is not None:
        found.append(address.ipv4_mapped)
    elif value >> 32 == 0 and value > 1:
        found.append(ipaddress.IPv4Address(value & 0xFFFFFFFF))
    if address in _NAT64:
        found.append(ipaddress.IPv4Address(value & 0xFFFFFFFF))
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    return found


@functools.lru_cache(maxsize=4096)  # the same CDN addresses again and again; bounded
def address_refusal(address: Address, allowed: tuple[Network, ...] = ()) -> str | None:
    """Why the engine must not reach `address` ("a loopback address", ...), or None when it may:
    it is public, or it (or the IPv4 address it embeds) is in an `allowed` range."""
    forms: list[Address] = [*embedded(address), address]
    if any(form.version == net.version and form in net for form in forms for net in allowed):
        return None
    for form in forms:
        number = int(form)
        why = next((why for low, high, why in _BOUNDS[form.version] if low <= number <= high),
                   None if form.is_global and not form.is_multicast else "non-public")
        if why:
            article = "an" if why[0] in "aeiou" else "a"
            return f"{article} {why} address" + ("" if form is address else f" (it stands for {form})")
    return None


def parse_address(host: str) -> Address | None:
    """`host` as an address literal (IPv4 dotted quad or IPv6), or None for a name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def name_refusal(host: str) -> str | None:
    """Why a host name is refused before any resolution: a metadata name, or a name under
    `localhost.` (RFC 6761 lets a resolver answer those itself, so the engine's may say loopback
    where this one asked DNS). `localhost` itself is resolved like any name (/etc/hosts: loopback)."""
    if host.endswith(".localhost"):
        return f"{host} is the instance's own name (loopback)"
    if host in METADATA_NAMES:
        return f"{host} is a cloud metadata service"
    return None


async def resolve_with(pool: concurrent.futures.Executor, host: str) -> list[str]:
    """Every address getaddrinfo gives for `host` (what the engine's library resolves), on `pool`."""
    loop = asyncio.get_running_loop()
    infos = await loop.run_in_executor(pool, socket.getaddrinfo, host, None, 0, socket.SOCK_STREAM)
    return [str(info[4][0]).partition("%")[0] for info in infos]


# --------------------------------------------------------------------------- finding references

Path = tuple[Any, ...]  # (parent path, key or index): built only when a field is named


def show(path: Path) -> str:
    """`payload.messages[0].content[1].image_url.url` for a path (Walk.path_of, multipart_references)."""
    parts: list[str] = []
    node: Any = path
    while node:  # as deep as the body nests (front.MAX_JSON_DEPTH bounds it)
        node, key = node
        if isinstance(key, int):
            parts.append(f"[{key}]")
        elif _KEY.fullmatch(key):
            parts.append(f".{key}")
        else:
            parts.append(f"[{json.dumps(key)}]")
    return "payload" + "".join(reversed(parts))


@dataclass(frozen=True)
class Found:
    """One reference in a payload: its value, whether bare base64 is allowed there, and where it is:
    `holder[key]` (found by a Walk, which names it only when it is refused) or `path`."""

    value: Any
    inline: bool = False
    holder: Any = None
    key: Any = None
    path: Path | None = None


_CONTAINERS = (dict, list)
WATCHED = URL_KEYS | DATA_KEYS.keys() | TYPED_KEYS


@dataclass
class Walk:
    """A walk over a JSON body, resumable: `step(budget)` looks at about `budget` values at most.

    It allocates nothing per value (a stack of the body's own containers), so a large body costs
    no garbage collection; the path of a reference is found again only when it is refused (path).
    """

    root: Any
    stack: list[Any]  # dicts and lists of the body, the next to visit last
    found: list[Found] = field(default_factory=list)

    def step(self, budget: int | None) -> bool:
        """Visit containers until none are left (True) or `budget` values were looked at (False)."""
        stack, found, seen = self.stack, self.found, 0
        while stack:  # each container of the body is pushed once
            value = stack[-1]
            seen += len(value)  # what visiting it costs: each of its items is looked at
            if budget is not None and seen > budget:
                return False
            stack.pop()
            # Children are pushed last first, so that they are visited (and found) in payload order.
            if type(value) is list:
                stack.extend([item for item in reversed(value) if type(item) in _CONTAINERS])
                continue
            if not WATCHED.isdisjoint(value):
                typed = value.get("type")
                for key, item in value.items():
                    if key in URL_KEYS or (key in TYPED_KEYS and key == typed):
                        _url_value(item, value, key, found)
                    elif key in DATA_KEYS and type(item) is dict and DATA_KEYS[key] in item:
                        found.append(Found(item[DATA_KEYS[key]], True, item, DATA_KEYS[key]))
            stack.extend([item for item in reversed(value.values()) if type(item) in _CONTAINERS])
        return True

    def path_of(self, ref: Found) -> Path:
        """The path of `ref` from the root: a depth-first search for ref's holder that keeps only the
        keys down to where it is (no path per value: a large body costs no garbage collection)."""
        if ref.path is not None:
            return ref.path
        keys: list[Any] = []  # the keys down to the container iters[-1] walks
        iters = [_items(self.root)]
        while iters:  # each container once; as deep as the body nests
            step = next(iters[-1], None)
            if step is None:
                iters.pop()
                if keys:
                    keys.pop()
                continue
            key, item = step
            if item is ref.holder:
                path: Path = ()
                for at in (*keys, key, ref.key):
                    path = (path, at)
                return path
            if type(item) in _CONTAINERS:
                keys.append(key)
                iters.append(_items(item))
        return ((), ref.key)  # the root itself holds it


def _items(value: Any) -> Iterator[tuple[Any, Any]]:
    return enumerate(value) if type(value) is list else iter(value.items())


def _url_value(item: Any, holder: Any, key: Any, found: list[Found]) -> None:
    """A URL key's value (`holder[key]`): a string, an object with `url`, or a list of either."""
    for at, index, one in ([(item, i, x) for i, x in enumerate(item)] if type(item) is list
                           else [(holder, key, item)]):
        if type(one) is dict:
            if "url" in one:
                found.append(Found(one["url"], False, one, "url"))
        elif one is not None:
            found.append(Found(one, False, at, index))


def walk(body: Any) -> Walk:
    """A Walk over a JSON body (not started)."""
    return Walk(body, [body] if type(body) in _CONTAINERS else [])


def multipart_references(fields: Mapping[str, Any]) -> list[Found]:
    """The references of a multipart request's form fields: the edit's `url`/`url[]`, the video
    reference objects (a list of them arrives as one JSON field, see uploads._video_references)."""
    found: list[Found] = []
    for key in ("url", "url[]"):
        value = fields.get(key)
        for index, one in enumerate(value) if isinstance(value, list) else [(None, value)]:
            if one is not None:
                found.append(Found(one, path=((), key) if index is None else (((), key), index)))
    for key, inner in uploads.VIDEO_REFERENCE_FIELDS.items():
        value = fields.get(key)
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                continue
        for index, ref in enumerate(value) if isinstance(value, list) else [(None, value)]:
            if isinstance(ref, dict) and ref.get(inner) is not None:
                at = ((), key) if index is None else (((), key), index)
                found.append(Found(ref[inner], path=(at, inner)))
    return found


# --------------------------------------------------------------------------- judging


class Refused(Exception):
    """A reference the engine must not fetch: `ref` is it, `message` says why (the 422)."""

    def __init__(self, ref: Found, message: str) -> None:
        super().__init__(message)
        self.ref = ref
        self.message = message


def host_of(ref: Found, limits: UploadLimits) -> str | None:
    """The host `ref` makes the engine reach (None: inline data), or Refused."""
    value = ref.value
    if ref.inline and isinstance(value, str) and not _SCHEME.match(value[:64]):
        # Inline data, which must not be a path either: longer than PATH_MAX it cannot name a file,
        # shorter it must be whole base64 (a length of 4n), which "/etc/passwd" is not.
        if len(value) > PATH_MAX or (_BASE64.fullmatch(value) and len("".join(value.split())) % 4 == 0):
            return None
        raise Refused(ref, "must be base64, a data: URI or an http(s) URL")
    try:
        return uploads.check_reference(value, "", limits)  # the field is named by the caller
    except UploadError as exc:
        raise Refused(ref, exc.message) from None


def _hint() -> str:
    return f"a private deployment lists what its engine may reach in {ALLOW_VAR}"


async def check(found: list[Found], policy: Policy, resolve: Resolve) -> None:
    """Raise Refused for the first reference of `found` the engine must not fetch.

    Syntax and literal addresses first, in payload order; then every name left is resolved (all at
    once, within policy.timeout) and each of its addresses must pass address_refusal.
    """
    names: dict[str, Found] = {}
    urls = 0
    for ref in found:
        host = host_of(ref, policy.limits)
        if host is None:
            continue
        urls += 1
        if urls > policy.max_references:
            raise Refused(ref, f"more than {policy.max_references} URLs in one request (the limit is {MAX_VAR})")
        address = parse_address(host)
        if address is not None:
            why = address_refusal(address, policy.networks)
            if why:
                raise Refused(ref, f"{host} is {why} ({_hint()})")
        elif host not in policy.hosts:
            why = name_refusal(host)
            if why:
                raise Refused(ref, why)
            names.setdefault(host, ref)
    if not names:
        return
    tasks = {host: asyncio.ensure_future(resolve(host)) for host in names}
    _, pending = await asyncio.wait(tasks.values(), timeout=policy.timeout)
    for task in pending:
        task.cancel()
    for host, task in tasks.items():  # payload order
        ref = names[host]
        if task in pending:
            raise Refused(ref, f"{host} did not resolve within {policy.timeout:g} s (the limit is {TIMEOUT_VAR})")
        error = task.exception()
        if error is not None:
            raise Refused(ref, f"{host} does not resolve ({type(error).__name__})")
        for text in task.result():
            address = parse_address(text)
            why = "not an address" if address is None else address_refusal(address, policy.networks)
            if why:
                raise Refused(ref, f"{host} resolves to {text}, {why} ({_hint()})")


# --------------------------------------------------------------------------- the engine call


class Refusal:
    """The 422 of a refused reference, shaped as the engine answers the routes' response generator
    (forward.respond) writes to the client: status, content type, headers, read()."""

    status = 422
    content_type = "application/json"

    def __init__(self, field: str, message: str) -> None:
        inner = field.removeprefix("payload").lstrip(".")
        self.text = f"{field}: {message}"
        self._body = json.dumps({"error": self.text, "payload": {inner: message}}).encode()
        self.headers: dict[str, str] = {"Content-Type": self.content_type}

    async def read(self) -> bytes:
        return self._body


async def refusal(payload: Any, policy: Policy, pool: concurrent.futures.Executor,
                  resolve: Resolve) -> Refusal | None:
    """The 422 for an SDK payload carrying a reference the engine must not fetch, else None.

    A multipart payload's references are its form fields'; a JSON body is walked, on the event loop
    up to INLINE_WALK_NODES values and on `pool` beyond (naming a refused one there too).
    """
    fields = payload.generate_payload_multipart()
    walker = None if fields is not None else walk(payload.generate_payload_json())
    large = False
    if walker is None:
        refs = multipart_references(fields)
    else:
        if not walker.step(INLINE_WALK_NODES):  # a huge body: the rest off the event loop
            large = True
            await asyncio.get_running_loop().run_in_executor(pool, walker.step, None)
        refs = walker.found
    if not refs:
        return None
    try:
        await check(refs, policy, resolve)
    except Refused as exc:
        if walker is None or exc.ref.path is not None:
            path = exc.ref.path
        elif large:
            path = await asyncio.get_running_loop().run_in_executor(pool, walker.path_of, exc.ref)
        else:
            path = walker.path_of(exc.ref)
        return Refusal(show(path or ()), exc.message)
    return None


def install(ctx: Any, policy: Policy) -> concurrent.futures.ThreadPoolExecutor:
    """Check every engine call (ctx.call_engine, the guards' Context) against `policy`: the outermost
    layer (install after the others), reached only by a request whose signature was verified. Returns
    the resolver pool."""
    from policy.guards import now_and_then  # the guards' rule for refusal warnings

    pool = concurrent.futures.ThreadPoolExecutor(RESOLVER_THREADS, thread_name_prefix="bakery-resolve")
    refused = [0]

    async def resolve(host: str) -> list[str]:
        return await resolve_with(pool, host)

    inner = ctx.call_engine

    async def call_engine(*args: Any, **kwargs: Any) -> Any:
        payload = kwargs.get("payload", args[1] if len(args) > 1 else None)
        if payload is not None:
            answer = await refusal(payload, policy, pool, resolve)
            if answer is not None:
                refused[0] += 1
                if now_and_then(refused[0]):  # escaped and cut: the path holds the caller's keys
                    log.warning("refused %d request(s) with a reference the engine must not fetch (last: %s)",
                                refused[0], ascii(answer.text)[:300])
                return answer
        return await inner(*args, **kwargs)

    ctx.call_engine = request_path.layer("references", call_engine, inner)
    return pool
