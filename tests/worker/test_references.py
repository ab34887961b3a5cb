"""No internal address through a reference, through the real SDK (policy/references.py).

One secured worker (signatures checked) serves the routes that carry references, in front of the
vLLM stand-in recording what it receives (STANDIN_RECORD): a refused reference must be a 422 naming
its field by its path into the payload and never reach the engine; a public one must reach it as
sent. Nothing here connects to a non-loopback address: public literals are only judged (the
stand-in receives the request; nothing fetches the URL), and the one name the worker resolves is
`localhost` (/etc/hosts).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.worker.helpers import SDK_READY, Harness, Proc, SigningKey, make_signing_key, post_enveloped

ROUTES = ",".join(["/v1/completions", "/v1/chat/completions", "/v1/chat/completions/batch", "/v1/embeddings",
                   "/v1/audio/speech", "/v1/audio/speech/batch", "/v1/images/edits", "/v1/videos/sync"])
ALLOWED_RANGE = "10.20.0.0/16"  # the private range this deployment's BAKERY_ALLOW_PRIVATE_REFERENCES lists
PUBLIC = "http://8.8.8.8/cat.png"  # judged, never fetched
CHAT = "/v1/chat/completions"
IMAGE_FIELD = "messages[0].content[1].image_url.url"


@dataclass
class Worker:
    """The module's secured worker and what the tests need to talk to it."""

    port: int
    key: SigningKey
    record: Path
    proc: Proc

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def post(self, route: str, payload: dict[str, Any], signed: bool = True) -> tuple[int, Any]:
        """POST `payload` in an envelope signed for this worker (or signed for another URL: forged)."""
        signature = self.key.sign(self.url if signed else "http://127.0.0.1:1")
        status, body, _ = post_enveloped(self.port, route, payload, timeout=60,
                                         auth={"url": self.url, "signature": signature})
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body

    def received(self) -> list[dict[str, Any]]:
        """What the engine received so far (one record per request)."""
        text = self.record.read_text() if self.record.exists() else ""
        return [json.loads(line) for line in text.splitlines()]


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory, worker_python: Path) -> Iterator[Worker]:
    key = make_signing_key(worker_python)
    with Harness(tmp_path_factory.mktemp("references"), worker_python, key.pem) as harness:
        record = harness.tmp / "engine.jsonl"
        served = harness.worker("vllm", harness.standin("vllm", STANDIN_RECORD=str(record)),
                                VLLM_MODEL="standin-model", OPENAI_ROUTES=ROUTES, UNSECURED=None,
                                BAKERY_ALLOW_PRIVATE_REFERENCES=f"{ALLOWED_RANGE},files.example.internal")
        served.worker.wait_for(SDK_READY, timeout=90)
        harness.reports.wait_loaded(timeout=60)
        yield Worker(served.port, key, record, served.worker)


def chat_image(url: Any) -> dict[str, Any]:
    return {"model": "standin-model", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": url}}]}]}


def refused(worker: Worker, route: str, payload: dict[str, Any], field: str) -> str:
    """Assert a 422 naming `field` (its path into the payload) that never reached the engine; the reason."""
    before = len(worker.received())
    status, body = worker.post(route, payload)
    assert status == 422, (route, payload, status, body)
    assert isinstance(body, dict) and list(body["payload"]) == [field], body
    assert body["error"].startswith(f"payload.{field}: "), body
    assert len(worker.received()) == before, "a refused reference reached the engine"
    return body["payload"][field]


def accepted(worker: Worker, route: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Assert the engine answered and received the request; what it received."""
    before = len(worker.received())
    status, body = worker.post(route, payload)
    assert status == 200, (route, status, body)
    sent = worker.received()
    assert len(sent) == before + 1, sent[before:]
    return sent[-1]


# --------------------------------------------------------------------------- each family, on chat


@pytest.mark.slow
@pytest.mark.parametrize("url", ["file:///etc/passwd", "gopher://8.8.8.8/x", "ftp://8.8.8.8/a.png",
                                 "//8.8.8.8/a.png", "/etc/passwd", "javascript:alert(1)", "jar:http://8.8.8.8/!/a"])
def test_a_scheme_other_than_http_https_data_is_refused(worker: Worker, url: str) -> None:
    assert "http(s) URL or a data: URI" in refused(worker, CHAT, chat_image(url), IMAGE_FIELD)


@pytest.mark.slow
@pytest.mark.parametrize("url", ["http://127.0.0.1/a.png", "http://127.0.0.1:18000/v1/models", "https://127.9.9.9/",
                                 "http://[::1]/a.png", "http://0.0.0.0:8080/"])
def test_a_loopback_or_unspecified_literal_is_refused(worker: Worker, url: str) -> None:
    why = refused(worker, CHAT, chat_image(url), IMAGE_FIELD)
    assert "loopback address" in why or "unspecified address" in why, why


@pytest.mark.slow
@pytest.mark.parametrize(("url", "kind"), [
    ("http://10.0.0.1/a.png", "private"), ("http://172.16.5.4/", "private"), ("http://192.168.1.1/", "private"),
    ("http://100.64.0.1/", "shared"), ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://224.0.0.1/", "multicast"), ("http://240.0.0.1/", "reserved"), ("http://10.21.0.1/", "private"),
])
def test_a_private_link_local_shared_or_reserved_literal_is_refused(worker: Worker, url: str, kind: str) -> None:
    why = refused(worker, CHAT, chat_image(url), IMAGE_FIELD)
    assert kind in why and "BAKERY_ALLOW_PRIVATE_REFERENCES" in why, why


@pytest.mark.slow
@pytest.mark.parametrize("url", ["http://2130706433/", "http://0x7f.1/", "http://0x7f000001/", "http://0177.0.0.1/",
                                 "http://127.1/", "http://017700000001/", "http://169.254.43518/",
                                 "http://8.8.8.8@127.0.0.1/", "http://127.0.0.1@8.8.8.8/", "http://8.8.8.8\\@127.0.0.1/",
                                 "http://127.0.0.1%2f@8.8.8.8/", "http://%31%32%37.0.0.1/", "http://127.0.0.1\t/",
                                 "http://127.0.0.1./"])
def test_numeric_encodings_userinfo_and_escapes_are_refused(worker: Worker, url: str) -> None:
    why = refused(worker, CHAT, chat_image(url), IMAGE_FIELD)
    assert any(word in why for word in ("numeric host", "user name", "backslash", "plain DNS name", "loopback")), why


@pytest.mark.slow
@pytest.mark.parametrize(("url", "kind"), [
    ("http://[::ffff:127.0.0.1]/", "loopback"), ("http://[::ffff:7f00:1]/", "loopback"),
    ("http://[::ffff:169.254.169.254]/", "link-local"), ("http://[::127.0.0.1]/", "loopback"),
    ("http://[64:ff9b::a9fe:a9fe]/", "link-local"), ("http://[2002:a00:1::]/", "private"),
    ("http://[fd00::1]/", "private"), ("http://[fe80::1]/", "link-local"), ("http://[fe80::1%25eth0]/", "zone"),
    ("http://[::]/", "unspecified"), ("http://[ff02::1]/", "multicast"),
])
def test_ipv6_and_the_ipv4_it_embeds_are_judged(worker: Worker, url: str, kind: str) -> None:
    assert kind in refused(worker, CHAT, chat_image(url), IMAGE_FIELD)


@pytest.mark.slow
def test_a_name_that_resolves_to_loopback_is_refused(worker: Worker) -> None:
    """`localhost` is resolved (getaddrinfo, /etc/hosts) and refused for the address it gives."""
    for name in ("localhost", "LOCALHOST."):
        why = refused(worker, CHAT, chat_image(f"http://{name}:18000/v1/models"), IMAGE_FIELD)
        assert why.startswith("localhost resolves to ") and "a loopback address" in why, why
    assert "loopback" in refused(worker, CHAT, chat_image("http://engine.localhost:18000/"), IMAGE_FIELD)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["metadata.google.internal", "METADATA.GOOGLE.INTERNAL.", "metadata.goog",
                                  "metadata", "instance-data"])
def test_metadata_names_are_refused(worker: Worker, name: str) -> None:
    url = f"http://{name}/computeMetadata/v1/instance/service-accounts/default/token"
    assert "metadata service" in refused(worker, CHAT, chat_image(url), IMAGE_FIELD)


@pytest.mark.slow
def test_the_allowlist_lets_its_range_and_host_through(worker: Worker) -> None:
    for url in ("http://10.20.3.4/a.png", "http://[::ffff:10.20.3.4]/a.png", "http://files.example.internal/a.png"):
        sent = accepted(worker, CHAT, chat_image(url))
        assert sent["json"]["messages"][0]["content"][1]["image_url"]["url"] == url


@pytest.mark.slow
def test_a_public_address_is_accepted_and_forwarded_as_sent(worker: Worker) -> None:
    for url in (PUBLIC, "https://[2606:4700:4700::1111]:8443/a.png?sig=x", "data:image/png;base64,iVBORw0KGgo="):
        sent = accepted(worker, CHAT, chat_image(url))
        assert sent["json"]["messages"][0]["content"][1]["image_url"]["url"] == url
    # A URL in text is not fetched by anyone: not judged.
    sent = accepted(worker, "/v1/completions", {"prompt": "summarise http://127.0.0.1/ please", "max_tokens": 4})
    assert "127.0.0.1" in sent["json"]["prompt"]


# --------------------------------------------------------------------------- every place, every route


@pytest.mark.slow
def test_every_media_field_of_chat_is_judged(worker: Worker) -> None:
    loop = "http://127.0.0.1/x"
    parts = [({"type": "image_url", "image_url": loop}, "image_url"),
             ({"type": "audio_url", "audio_url": {"url": loop}}, "audio_url.url"),
             ({"type": "video_url", "video_url": {"url": loop}}, "video_url.url"),
             ({"type": "input_audio", "input_audio": {"data": loop, "format": "wav"}}, "input_audio.data"),
             ({"type": "input_audio", "input_audio": {"data": "/etc/passwd", "format": "wav"}}, "input_audio.data"),
             ({"type": "file", "file": {"file_data": "file:///etc/passwd"}}, "file.file_data"),
             ({"type": "image", "image": loop}, "image")]
    for part, where in parts:
        payload = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": ["hi", part]}]}
        refused(worker, CHAT, payload, f"messages[1].content[1].{where}")
    # The default routes carry a reference anywhere the engine would look, the first route too.
    refused(worker, "/v1/completions", {"prompt": "p", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": loop}}]}]}, "messages[0].content[0].image_url.url")
    accepted(worker, CHAT, {"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "UklGRiQAAABXQVZF", "format": "wav"}}]}]})


@pytest.mark.slow
def test_every_route_that_carries_a_reference_judges_it(worker: Worker) -> None:
    loop = "http://169.254.169.254/latest"
    refused(worker, "/v1/chat/completions/batch", {"messages": [[{"role": "user", "content": "a"}], [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": loop}}]}]]},
        "messages[1][0].content[0].image_url.url")
    refused(worker, "/v1/embeddings", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": loop}}]}]}, "messages[0].content[0].image_url.url")
    refused(worker, "/v1/audio/speech", {"input": "hi", "ref_audio": loop}, "ref_audio")
    refused(worker, "/v1/audio/speech", {"input": "hi", "references": [{"audio_path": loop}]},
            "references[0].audio_path")
    refused(worker, "/v1/audio/speech/batch", {"items": [{"input": "a"}, {"input": "b", "ref_audio": loop}]},
            "items[1].ref_audio")
    refused(worker, "/v1/images/edits", {"prompt": "p", "url": [PUBLIC, loop]}, "url[1]")
    refused(worker, "/v1/videos/sync", {"prompt": "p", "image_reference": [{"image_url": PUBLIC},
                                                                           {"image_url": loop}]},
            "image_reference[1].image_url")
    refused(worker, "/v1/videos/sync", {"prompt": "p", "video_reference": {"video_url": loop}},
            "video_reference.video_url")
    sent = accepted(worker, "/v1/audio/speech", {"input": "hi", "ref_audio": PUBLIC})
    assert sent["json"]["ref_audio"] == PUBLIC
    sent = accepted(worker, "/v1/images/edits", {"prompt": "p", "url": PUBLIC})
    assert sent["form"]["url"] == PUBLIC


@pytest.mark.slow
def test_a_request_carries_at_most_the_bound_of_urls(worker: Worker) -> None:
    parts = [{"type": "image_url", "image_url": {"url": f"http://8.8.8.{i}/a.png"}} for i in range(1, 34)]
    why = refused(worker, CHAT, {"messages": [{"role": "user", "content": parts}]},
                  "messages[0].content[32].image_url.url")
    assert "more than 32" in why and "BAKERY_MAX_REFERENCES" in why


@pytest.mark.slow
def test_the_check_comes_after_the_signature(worker: Worker) -> None:
    """A forged request is the SDK's 401, whatever its references: nothing is judged or resolved for it."""
    status, _ = worker.post(CHAT, chat_image("http://127.0.0.1/"), signed=False)
    assert status == 401
