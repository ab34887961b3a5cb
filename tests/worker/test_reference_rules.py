"""The reference rules without the SDK (policy/references.py, uploads.check_reference).

Fast: the address classifier, the URL syntax that two parsers could read apart, where references
are found in a payload and how they are named, resolution (with a resolver made here: a name's
answer is the test's to choose, and no test resolves anything but a literal), the allowlist and
the variables. tests/worker/test_references.py proves the same on the real SDK.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import json
import time

import pytest

import tests.worker.helpers  # noqa: F401 (puts worker/ on sys.path first)
from config.uploads import UploadError, UploadLimits, check_reference
from policy import references
from policy.references import Policy, Refused


@pytest.mark.parametrize(("address", "kind"), [
    ("127.0.0.1", "loopback"), ("127.255.0.9", "loopback"), ("::1", "loopback"),
    ("169.254.169.254", "link-local"), ("fe80::1", "link-local"),
    ("10.1.2.3", "private"), ("172.31.255.255", "private"), ("192.168.0.1", "private"), ("fd12::1", "private"),
    ("fec0::1", "private"), ("100.64.0.1", "shared"), ("100.127.255.254", "shared"),
    ("0.0.0.0", "unspecified"), ("0.1.2.3", "unspecified"), ("::", "unspecified"),  # noqa: S104 (judged, not bound)
    ("224.0.0.1", "multicast"), ("239.1.1.1", "multicast"), ("ff02::1", "multicast"), ("ff0e::1", "multicast"),
    ("240.0.0.1", "reserved"), ("255.255.255.255", "reserved"), ("192.0.0.8", "reserved"),
    ("192.0.2.1", "reserved"), ("198.18.0.1", "reserved"), ("2001:db8::1", "reserved"), ("100::1", "reserved"),
    # IPv6 forms of an IPv4 address are judged by the address they stand for.
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:a9fe:a9fe", "link-local"), ("::10.0.0.1", "private"),
    ("64:ff9b::7f00:1", "loopback"), ("2002:a9fe:a9fe::1", "link-local"), ("2002:c0a8:101::", "private"),
])
def test_each_non_public_address_is_refused_with_its_kind(address: str, kind: str) -> None:
    why = references.address_refusal(ipaddress.ip_address(address))
    assert why is not None and kind in why, why


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "93.184.215.14", "2606:4700:4700::1111",
                                     "2a00:1450:4001::200e", "::ffff:8.8.8.8", "2002:808:808::", "64:ff9b::808:808"])
def test_a_public_address_passes(address: str) -> None:
    assert references.address_refusal(ipaddress.ip_address(address)) is None


def test_an_allowed_range_passes_and_covers_the_ipv4_an_ipv6_form_stands_for() -> None:
    allowed = (ipaddress.ip_network("10.20.0.0/16"), ipaddress.ip_network("fd00::/8"))
    for address in ("10.20.3.4", "::ffff:10.20.3.4", "fd00::5"):
        assert references.address_refusal(ipaddress.ip_address(address), allowed) is None, address
    for address in ("10.21.0.1", "127.0.0.1", "fe80::1"):
        assert references.address_refusal(ipaddress.ip_address(address), allowed), address


# --------------------------------------------------------------------------- syntax


@pytest.mark.parametrize(("url", "host"), [("https://x/a.png", "x"), ("HTTP://Example.COM:8080/a?b#c", "example.com"),
                                           ("http://127.0.0.1./", "127.0.0.1"), ("http://[::1]/", "::1"),
                                           ("http://xn--fa-hia.de/", "xn--fa-hia.de"), ("data:,x", None)])
def test_check_reference_gives_the_host_the_engine_reaches(url: str, host: str | None) -> None:
    assert check_reference(url, "f", UploadLimits()) == host


@pytest.mark.parametrize(("url", "says"), [
    ("http://2130706433/", "four decimal"), ("http://0x7f.1/", "four decimal"), ("http://0177.0.0.1/", "four decimal"),
    ("http://127.1/", "four decimal"), ("http://1.2.3.4.5/", "four decimal"), ("http://010.0.0.1/", "four decimal"),
    ("http://8.8.8.8@127.0.0.1/", "user name"), ("http://u:p@8.8.8.8/", "user name"),
    ("http://8.8.8.8\\@127.0.0.1/", "backslash"), ("http://a b/", "blanks"), ("http://a/\x00", "control"),
    ("http://a/\x85x", "control"), ("http://%6c%6fcalhost/", "plain DNS name"), ("http://faß.de/", "xn--"),
    ("http://ⓛocalhost/", "xn--"), ("http://[fe80::1%25eth0]/", "zone"), ("http://x:99999/", "port"),
    ("http://a..b/", "plain DNS name"), ("file:///etc/passwd", "never a path"), ("gopher://x/", "never a path"),
    ("//x/a", "never a path"), ("http:/x", "never a path"),
])
def test_a_url_two_parsers_could_read_apart_is_refused(url: str, says: str) -> None:
    with pytest.raises(UploadError) as caught:
        check_reference(url, "f", UploadLimits())
    assert says in caught.value.message, caught.value.message


# --------------------------------------------------------------------------- finding and naming


def found(body: object) -> list[tuple[str, object]]:
    walk = references.walk(body)
    assert walk.step(None)
    return [(references.show(walk.path_of(ref)), ref.value) for ref in walk.found]


def test_references_are_found_everywhere_an_engine_looks_and_named_in_payload_order() -> None:
    body = {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "http://127.0.0.1/ in text"},
                                     {"type": "image_url", "image_url": {"url": "u1", "detail": "low"}},
                                     {"type": "image_url", "image_url": "u2"},
                                     {"type": "audio_url", "audio_url": {"url": "u3"}},
                                     {"type": "video_url", "video_url": "u4"},
                                     {"type": "input_audio", "input_audio": {"data": "u5", "format": "wav"}},
                                     {"type": "file", "file": {"file_data": "u6"}},
                                     {"type": "image", "image": "u7"}, {"image": "not typed: no fetch"}]}],
        "documents": [{"content": [{"type": "image_url", "image_url": {"url": "u8"}}]}],
        "ref_audio": "u9", "references": [{"audio_path": "u10"}], "we ird": {"image_url": "u11"}}
    assert found(body) == [
        ("payload.ref_audio", "u9"),
        ("payload.messages[0].content[1].image_url.url", "u1"), ("payload.messages[0].content[2].image_url", "u2"),
        ("payload.messages[0].content[3].audio_url.url", "u3"), ("payload.messages[0].content[4].video_url", "u4"),
        ("payload.messages[0].content[5].input_audio.data", "u5"),
        ("payload.messages[0].content[6].file.file_data", "u6"),
        ("payload.messages[0].content[7].image", "u7"),
        ("payload.documents[0].content[0].image_url.url", "u8"), ("payload.references[0].audio_path", "u10"),
        ('payload["we ird"].image_url', "u11")]


def test_a_chat_batch_and_a_speech_batch_are_named_by_their_indices() -> None:
    assert found({"messages": [[{"content": "a"}], [{"content": [{"image_url": {"url": "u"}}]}]]}) == [
        ("payload.messages[1][0].content[0].image_url.url", "u")]
    assert found({"items": [{"input": "a"}, {"input": "b", "ref_audio": ["u", "v"]}]}) == [
        ("payload.items[1].ref_audio[0]", "u"), ("payload.items[1].ref_audio[1]", "v")]


def test_multipart_fields_name_the_edit_url_and_the_video_references() -> None:
    refs = references.multipart_references({
        "url": ["a", "b"], "prompt": "p", "image_reference": json.dumps([{"image_url": "c"}, {"file_id": "f"}]),
        "video_reference": {"video_url": "d"}})
    assert [(references.show(r.path or ()), r.value) for r in refs] == [
        ("payload.url[0]", "a"), ("payload.url[1]", "b"), ("payload.image_reference[0].image_url", "c"),
        ("payload.video_reference.video_url", "d")]


def test_a_large_body_is_walked_in_bounded_steps() -> None:
    """The event loop walks at most INLINE_WALK_NODES values; the rest goes to the pool."""
    body = {"prompt": list(range(references.INLINE_WALK_NODES * 3)),
            "messages": [{"content": [{"image_url": {"url": "u"}}]}]}
    walk = references.walk(body)
    assert walk.step(references.INLINE_WALK_NODES) is False
    assert walk.step(None) is True
    assert [(references.show(walk.path_of(r)), r.value) for r in walk.found] == [
        ("payload.messages[0].content[0].image_url.url", "u")]


# --------------------------------------------------------------------------- judging, with a resolver made here


def judge(urls: list[object], answers: dict[str, list[str]] | None = None, policy: Policy | None = None,
          delay: float = 0.0, inline: bool = False) -> str | None:
    """The refusal (field: why) of a request carrying `urls`, names resolving to `answers`; None: accepted."""
    asked: list[str] = []

    async def resolve(host: str) -> list[str]:
        asked.append(host)
        await asyncio.sleep(delay)
        if host not in (answers or {}):
            raise OSError("no such name")
        return (answers or {})[host]

    refs = [references.Found(url, inline, path=((), i)) for i, url in enumerate(urls)]
    try:
        asyncio.run(references.check(refs, policy or Policy(), resolve))
    except Refused as exc:
        return f"{references.show(exc.ref.path or ())}: {exc.message}"
    return None


def test_every_address_a_name_resolves_to_must_be_public() -> None:
    assert judge(["http://cdn.example/a.png"], {"cdn.example": ["8.8.8.8", "2606:4700::1111"]}) is None
    why = judge(["http://cdn.example/a.png"], {"cdn.example": ["8.8.8.8", "10.0.0.7"]})
    assert why and "cdn.example resolves to 10.0.0.7, a private address" in why, why
    why = judge(["http://x.example/"], {"x.example": ["::ffff:169.254.169.254"]})
    assert why and "link-local" in why, why
    assert "does not resolve" in (judge(["http://gone.example/"]) or "")
    why = judge(["http://localhost/"], {"localhost": ["127.0.0.1", "::1"]})
    assert why and "localhost resolves to 127.0.0.1, a loopback address" in why, why


def test_metadata_and_loopback_names_are_refused_without_resolving() -> None:
    for name in ("metadata.google.internal", "metadata.goog", "api.localhost", "instance-data"):
        why = judge([f"http://{name}/"], {name: ["8.8.8.8"]})
        assert why and ("metadata" in why or "loopback" in why), why


def test_names_resolve_at_once_within_the_timeout() -> None:
    started = time.monotonic()
    answers = {f"h{i}.example": ["8.8.8.8"] for i in range(5)}
    assert judge([f"http://h{i}.example/" for i in range(5)], answers, delay=0.2) is None
    assert time.monotonic() - started < 0.9  # five names of 0.2 s each, resolved together
    started = time.monotonic()
    why = judge(["http://slow.example/"], {"slow.example": ["8.8.8.8"]}, Policy(timeout=0.2), delay=5)
    assert why and "did not resolve within 0.2 s" in why and "BAKERY_REFERENCE_RESOLVE_TIMEOUT" in why, why
    assert time.monotonic() - started < 2


def test_a_request_carries_at_most_max_references_urls() -> None:
    urls = ["http://8.8.8.8/a"] * 4 + ["data:,x"] * 10
    assert judge(urls, policy=Policy(max_references=4)) is None  # data: URIs are not fetched
    why = judge([*urls, "http://8.8.4.4/b"], policy=Policy(max_references=4))
    assert why and why.startswith("payload[14]: more than 4 URLs") and "BAKERY_MAX_REFERENCES" in why, why


def test_an_allowed_host_is_not_resolved_and_an_allowed_range_passes() -> None:
    policy = Policy(hosts=frozenset({"minio.internal"}), networks=(ipaddress.ip_network("10.0.0.0/8"),))
    assert judge(["http://minio.internal:9000/b/a.png"], {}, policy) is None
    assert judge(["http://10.1.2.3/a.png", "http://store.example/"], {"store.example": ["10.9.9.9"]}, policy) is None
    assert judge(["http://192.168.1.1/"], policy=policy)


def test_inline_fields_take_base64_but_not_a_path_or_an_internal_url() -> None:
    assert judge(["UklGRiQAAABXQVZF"], inline=True) is None
    assert judge(["A" * 5000], inline=True) is None  # longer than a path can be
    assert judge(["/etc/passwd"], inline=True)
    assert judge(["file:///etc/passwd"], inline=True)
    assert judge(["http://127.0.0.1/"], inline=True)
    assert judge(["data:audio/wav;base64,UklG"], inline=True) is None


def test_the_refusal_is_a_422_naming_the_field_both_ways() -> None:
    answer = references.Refusal("payload.messages[0]", "127.0.0.1 is a loopback address")
    body = json.loads(asyncio.run(answer.read()))
    assert answer.status == 422 and answer.content_type == "application/json"
    assert body == {"error": "payload.messages[0]: 127.0.0.1 is a loopback address",
                    "payload": {"messages[0]": "127.0.0.1 is a loopback address"}}


def test_refusal_resolves_on_the_pool_and_passes_a_clean_payload() -> None:
    class Payload:
        def __init__(self, body: dict) -> None:
            self.body = body

        def generate_payload_multipart(self) -> None:
            return None

        def generate_payload_json(self) -> dict:
            return self.body

    pool = concurrent.futures.ThreadPoolExecutor(1)

    async def resolve(host: str) -> list[str]:
        return await references.resolve_with(pool, host)

    try:
        clean = Payload({"messages": [{"content": [{"image_url": {"url": "http://8.8.8.8/a"}}]}]})
        assert asyncio.run(references.refusal(clean, Policy(), pool, resolve)) is None
        dirty = Payload({"messages": [{"content": [{"image_url": {"url": "http://127.0.0.1/a"}}]}]})
        answer = asyncio.run(references.refusal(dirty, Policy(), pool, resolve))
        assert answer is not None and "loopback" in answer.text
        # A body too large to walk on the loop is walked, and its refusal named, on the pool.
        large = Payload({"prompt": list(range(references.INLINE_WALK_NODES * 2)), **dirty.body})
        answer = asyncio.run(references.refusal(large, Policy(), pool, resolve))
        assert answer is not None and answer.text.startswith("payload.messages[0].content[0].image_url.url: 127.0.0.1")
    finally:
        pool.shutdown()


# --------------------------------------------------------------------------- the variables


def test_the_allowlist_reads_names_addresses_and_ranges() -> None:
    hosts, networks = references.parse_allowlist(" Minio.Internal. ,10.0.0.0/8, fd00::/8,192.168.1.5,[fd01::1]")
    assert hosts == {"minio.internal"}
    assert [str(n) for n in networks] == ["10.0.0.0/8", "fd00::/8", "192.168.1.5/32", "fd01::1/128"]


@pytest.mark.parametrize(("name", "raw"), [
    ("BAKERY_ALLOW_PRIVATE_REFERENCES", "10.0.0.0/33"), ("BAKERY_ALLOW_PRIVATE_REFERENCES", "http://minio:9000"),
    ("BAKERY_ALLOW_PRIVATE_REFERENCES", "minio:9000"), ("BAKERY_ALLOW_PRIVATE_REFERENCES", "a b"),
    ("BAKERY_REFERENCE_RESOLVE_TIMEOUT", "0"), ("BAKERY_REFERENCE_RESOLVE_TIMEOUT", "soon"),
    ("BAKERY_MAX_REFERENCES", "0"), ("BAKERY_MAX_REFERENCES", "many"),
])
def test_a_bad_variable_is_one_line_naming_it(name: str, raw: str) -> None:
    _, errors = references.load({name: raw}, UploadLimits())
    assert len(errors) == 1 and errors[0].startswith(f"{name}"), errors


def test_the_defaults() -> None:
    policy, errors = references.load({}, UploadLimits())
    assert errors == []
    assert (policy.timeout, policy.max_references, policy.hosts, policy.networks) == (3.0, 32, set(), ())
    assert "public addresses only" in references.describe(policy)
