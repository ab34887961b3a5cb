"""Uploads in the JSON envelope -> multipart parts, and every refusal (config/uploads.py).

Pure functions, no SDK: each refusal is an UploadError naming the field, which the SDK payload
class turns into a 422 (tests/worker/test_routes_sdk.py proves that part on the real SDK).
"""

from __future__ import annotations

import base64
import json

import pytest

import tests.worker.helpers  # noqa: F401 (puts worker/ on sys.path first)
from config import uploads
from config.uploads import UploadError, UploadLimits

WAV = b"RIFF\x24\x00\x00\x00WAVEfmt "
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 20
LIMITS = UploadLimits()
TRANSCRIBE, EDIT, VIDEO = "/v1/audio/transcriptions", "/v1/images/edits", "/v1/videos/sync"


def b64(data: bytes = WAV) -> str:
    return base64.b64encode(data).decode()


def split(route: str, body: object, limits: UploadLimits = LIMITS) -> tuple[dict, dict]:
    return uploads.split_upload(route, body, limits)


def refused(route: str, body: object, field: str, limits: UploadLimits = LIMITS) -> str:
    """The refusal's message, after checking it names `field`."""
    with pytest.raises(UploadError) as caught:
        split(route, body, limits)
    assert caught.value.field == field, caught.value
    return caught.value.message


# --------------------------------------------------------------------------- accepted


def test_a_base64_file_becomes_a_file_part_and_the_rest_form_fields() -> None:
    fields, files = split(TRANSCRIBE, {"file": b64(), "filename": "clip.mp3", "language": "en",
                                       "model": "m", "temperature": 0.2})
    assert files == {"file": ("clip.mp3", WAV, "audio/mpeg")}
    assert fields == {"language": "en", "model": "m", "temperature": 0.2}


def test_an_input_object_is_unwrapped() -> None:
    fields, files = split(TRANSCRIBE, {"input": {"file": b64(), "language": "de"}})
    assert files["file"] == ("audio.wav", WAV, "audio/wav")
    assert fields == {"language": "de"}


@pytest.mark.parametrize("value", [f"data:audio/wav;base64,{b64()}", f"DATA:audio/wav;base64,{b64()}",
                                   base64.encodebytes(WAV * 20).decode()])
def test_data_uris_and_line_wrapped_base64_are_accepted(value: str) -> None:
    assert split(TRANSCRIBE, {"file": value})[1]["file"][1] in (WAV, WAV * 20)


@pytest.mark.parametrize(("given", "expected"), [
    ("../../etc/cron.d/x.wav", "x.wav"),
    ("C:\\Users\\me\\a b.wav", "a_b.wav"),
    ('a"\r\nX: 1.wav', "a___X__1.wav"),
    (".hidden.wav", "hidden.wav"),
    (None, "audio.wav"),
    ("a" * 140 + ".wav", "a" * 128 + ".wav"),
])
def test_the_filename_is_reduced_to_a_safe_basename(given: str | None, expected: str) -> None:
    assert split(TRANSCRIBE, {"file": b64(), "filename": given})[1]["file"][0] == expected


def test_edit_images_become_repeated_parts_with_their_own_names() -> None:
    fields, files = split(EDIT, {"image": [b64(PNG), b64(PNG)], "filename": ["a.png", "b.jpg"],
                                 "mask": b64(PNG), "mask_filename": "m.webp", "prompt": "p"})
    assert [(f[0], f[2]) for f in files["image"]] == [("a.png", "image/png"), ("b.jpg", "image/jpeg")]
    assert files["mask"] == ("m.webp", PNG, "image/webp")
    assert fields == {"prompt": "p"}
    _, files = split(EDIT, {"image": [b64(PNG), b64(PNG)], "filename": "a.png", "prompt": "p"})
    assert [f[0] for f in files["image"]] == ["a.png", "image.png"]


def test_an_edit_url_stands_in_for_an_upload_and_an_empty_one_is_dropped() -> None:
    fields, files = split(EDIT, {"url": "https://x/a.png", "prompt": "p"})
    assert (fields["url"], files) == ("https://x/a.png", {})
    fields, _ = split(EDIT, {"image": b64(PNG), "url": "", "prompt": "p"})
    assert "url" not in fields


def test_video_uploads_each_take_their_own_name_and_types() -> None:
    mask = b64(json.dumps({"frames": [0]}).encode())
    fields, files = split(VIDEO, {
        "prompt": "a cat", "num_frames": 33, "input_reference": b64(PNG), "input_reference_filename": "cat.png",
        "input_references": [b64(PNG), b64(WAV)], "input_references_filename": ["clip.mp4", "voice.wav"],
        "source_audio": b64(WAV), "video_noise_mask": mask})
    assert files["input_reference"][0::2] == ("cat.png", "image/png")
    assert [f[2] for f in files["input_references"]] == ["video/mp4", "audio/wav"]
    assert files["source_audio"][2] == "audio/wav"
    assert files["video_noise_mask"][0::2] == ("mask.json", "application/json")
    assert fields == {"prompt": "a cat", "num_frames": 33}


def test_a_list_of_video_references_is_one_json_field() -> None:
    refs = [{"image_url": "https://x/a.png"}, {"file_id": "file-1"}]
    fields, _ = split(VIDEO, {"prompt": "p", "image_reference": refs, "video_reference": {"file_id": "f"}})
    assert json.loads(fields["image_reference"]) == refs
    assert fields["video_reference"] == {"file_id": "f"}


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(("body", "says"), [
    ({"model": "m"}, "field missing"),
    ({"file": 123}, "base64 string"),
    ({"file": "!!!"}, "not valid base64"),
    ({"file": ""}, "empty"),
])
def test_a_bad_file_is_refused_naming_the_field(body: dict, says: str) -> None:
    assert says in refused(TRANSCRIBE, body, "file")


@pytest.mark.parametrize("payload", [["a"], "x", None])
def test_a_payload_that_is_not_an_object_is_refused(payload: object) -> None:
    for route in (TRANSCRIBE, EDIT, VIDEO):
        refused(route, payload, "payload")


@pytest.mark.parametrize("route", [TRANSCRIBE, EDIT, VIDEO])
def test_an_input_that_is_not_an_object_is_refused(route: str) -> None:
    """No upload route has an `input` field: a string there is a wrongly built request (a 422, not a 500)."""
    refused(route, {"input": "text", "prompt": "p"}, "input")


@pytest.mark.parametrize("name", ["clip.unknown", "clip.html", "clip", "clip.png"])
def test_a_wrong_file_type_is_refused_naming_the_filename_field(name: str) -> None:
    assert "unsupported file type" in refused(TRANSCRIBE, {"file": b64(), "filename": name}, "filename")


def test_each_video_field_takes_only_its_formats() -> None:
    refused(VIDEO, {"source_audio": b64(PNG), "source_audio_filename": "x.png"}, "source_audio_filename")
    refused(VIDEO, {"control_reference": b64(PNG), "control_reference_filename": "x.wav"},
            "control_reference_filename")
    refused(EDIT, {"image": b64(PNG), "filename": "x.wav"}, "filename")
    refused(EDIT, {"image": b64(PNG), "mask": b64(PNG), "mask_filename": "m.mp3"}, "mask_filename")


def test_an_oversized_upload_is_refused_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_decoding(*_args: object, **_kwargs: object) -> bytes:
        raise AssertionError("decoded before its size was checked")

    monkeypatch.setattr(uploads.base64, "b64decode", no_decoding)
    message = refused(TRANSCRIBE, {"file": "A" * 10_000}, "file", UploadLimits(file_bytes=1024))
    assert "larger than 1024 bytes" in message and uploads.MAX_UPLOAD_BYTES_VAR in message


def test_the_size_limit_is_exact() -> None:
    limits = UploadLimits(file_bytes=1000)
    assert len(split(TRANSCRIBE, {"file": b64(b"x" * 1000)}, limits)[1]["file"][1]) == 1000
    refused(TRANSCRIBE, {"file": b64(b"x" * 1001)}, "file", limits)


def test_an_oversized_data_uri_header_is_refused() -> None:
    huge = "data:" + "A" * 1000 + "," + b64()
    assert "data: URI" in refused(TRANSCRIBE, {"file": huge}, "file")


def test_uploads_over_the_request_budget_are_refused_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uploads.base64, "b64decode", lambda *_a, **_k: pytest.fail("decoded"))
    ref = "A" * 4096
    limits = UploadLimits(request_bytes=8000)
    assert "in total" in refused(EDIT, {"image": [ref] * 3, "prompt": "p"}, "image", limits)
    assert "in total" in refused(VIDEO, {"input_references": [ref, ref], "video_reference":
                                         {"video_url": "data:video/mp4;base64," + ref}},
                                 "input_reference", limits)
    with pytest.raises(UploadError, match="in total"):
        uploads.check_speech("/v1/audio/speech", {"input": "hi", "ref_audio": [ref, ref], "ref_audio_2": ref},
                             limits)


def test_too_many_files_or_a_list_where_one_file_goes_are_refused() -> None:
    refused(EDIT, {"image": [b64(PNG)] * 17, "prompt": "p"}, "image")
    refused(EDIT, {"image": b64(PNG), "mask": [b64(PNG)] * 2}, "mask")
    refused(VIDEO, {"prompt": "p", "source_video": [b64(PNG)] * 2}, "source_video")


def test_an_edit_needs_an_image_or_a_url() -> None:
    refused(EDIT, {"prompt": "p"}, "image")


@pytest.mark.parametrize("bad", [["not an object"], "https://x/a.png"])
def test_a_video_reference_must_be_an_object(bad: object) -> None:
    refused(VIDEO, {"prompt": "p", "image_reference": bad}, "image_reference")


# --------------------------------------------------------------------------- references

INLINE = b64(b"RIFF" + b"\x00" * 200)
ALLOWED = ["https://x/a.png", "http://x/a.png", f"data:audio/wav;base64,{INLINE}",
           f"DATA:audio/wav;base64,{INLINE}", "HTTPS://example.com:8443/a.wav?x=1"]
# bare base64 is refused too: "/" is a base64 character, so a path can pass for base64
REFUSED = ["file:///root/.ssh/id_rsa", "file:/etc/passwd", "ftp://x/a", "/etc/passwd", "../../workspace/x.wav",
           "\\\\host\\share\\a.wav", "http://[::1", "http:/etc/passwd", "https:///etc/passwd", INLINE,
           "/" * 78 + "etc/passwd", "data:no-comma", 7, ["https://x/a"]]


def _speech(route: str, body: dict) -> None:
    uploads.check_speech(route, body, LIMITS)


PLACES = {
    "url": lambda v: split(EDIT, {"url": v, "prompt": "p"}),
    "url[]": lambda v: split(EDIT, {"url[]": [v], "prompt": "p"}),
    "ref_audio": lambda v: _speech("/v1/audio/speech", {"input": "hi", "ref_audio": v}),
    "ref_audio_2": lambda v: _speech("/v1/audio/speech", {"input": "hi", "ref_audio_2": v}),
    "references.audio_path": lambda v: _speech("/v1/audio/speech", {"input": "hi", "references": [{"audio_path": v}]}),
    "batch ref_audio": lambda v: _speech("/v1/audio/speech/batch", {"items": [{"input": "a"}], "ref_audio": v}),
    "item ref_audio": lambda v: _speech("/v1/audio/speech/batch", {"items": [{"input": "a", "ref_audio": v}]}),
    "image_reference.image_url": lambda v: split(VIDEO, {"prompt": "p", "image_reference": [{"image_url": v}]}),
    "video_reference.video_url": lambda v: split(VIDEO, {"prompt": "p", "video_reference": {"video_url": v}}),
}


@pytest.mark.parametrize("place", list(PLACES))
def test_every_reference_field_takes_http_urls_and_data_uris_only(place: str) -> None:
    send = PLACES[place]
    for value in ALLOWED:
        send(value)
    expected = place.split(" ")[-1]
    for value in REFUSED:
        if isinstance(value, list) and place in ("ref_audio", "url"):
            continue  # a list of references is allowed there (each item checked: see url[])
        with pytest.raises(UploadError) as caught:
            send(value)
        assert caught.value.field == expected, (place, value)


def test_a_path_is_refused_with_a_line_saying_so() -> None:
    with pytest.raises(UploadError) as caught:
        split(EDIT, {"url": "/etc/passwd", "prompt": "p"})
    assert str(caught.value) == ("url: must be an http(s) URL or a data: URI, never a path on the instance")


def test_an_oversized_data_uri_reference_is_refused() -> None:
    big = "data:audio/wav;base64," + "A" * 2000
    with pytest.raises(UploadError, match="larger than 1000"):
        uploads.check_speech("/v1/audio/speech", {"input": "hi", "ref_audio": big}, UploadLimits(file_bytes=1000))


def test_an_empty_speech_reference_is_dropped() -> None:
    assert "ref_audio" not in uploads.check_speech("/v1/audio/speech", {"input": "hi", "ref_audio": ""}, LIMITS)
    assert "ref_audio_2" not in uploads.check_speech("/v1/audio/speech", {"input": "hi", "ref_audio_2": ""}, LIMITS)
    batch = uploads.check_speech("/v1/audio/speech/batch", {"items": [{"input": "a", "ref_audio": ""}],
                                                            "ref_audio": ""}, LIMITS)
    assert "ref_audio" not in batch and "ref_audio" not in batch["items"][0]


@pytest.mark.parametrize("body", [{"items": [{"input": "a", "ref_audio": ["https://x/a.wav"]}]},
                                  {"items": {"input": "a"}}, {"items": ["a"]}])
def test_a_speech_batch_takes_objects_and_one_reference_string_each(body: dict) -> None:
    with pytest.raises(UploadError):
        uploads.check_speech("/v1/audio/speech/batch", body, LIMITS)
