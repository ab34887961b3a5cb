"""bakery.docker.build.read_build_stream: the one reader of the engine's build output (builder and bases).

The chunks are the shapes Docker 20.10's classic builder sends through the SDK (`decode=True`):
`stream` lines, an `aux` record with the image id, an `error` record (with `errorDetail`) on failure.
tests/image/ builds real images through the same reader.
"""

from __future__ import annotations

import pytest

from bakery.docker.build import read_build_stream
from bakery.errors import BuildError

IMAGE = "sha256:" + "c" * 64


def chunks(*lines: str, error: str | None = None, image: str | None = IMAGE) -> list[dict]:
    out: list[dict] = [{"stream": line + "\n"} for line in lines]
    if error is not None:
        out.append({"errorDetail": {"message": error}, "error": error})
    elif image:
        out.append({"aux": {"ID": image}})
    return out


def test_steps_cache_hits_log_and_id() -> None:
    seen: list[str] = []
    result = read_build_stream(chunks("Step 1/3 : FROM x", " ---> Using cache", " ---> abc", "Step 2/3 : RUN a",
                                      "\x1b[91mwarning: coloured\x1b[0m", "", "Step 3/3 : LABEL a=b",
                                      " ---> Using cache"), seen.append, "")
    assert seen == ["Step 1/3 : FROM x", "Step 2/3 : RUN a", "Step 3/3 : LABEL a=b"]
    assert (result.image_id, result.steps, result.cached_steps) == (IMAGE, 3, 2)
    assert "warning: coloured" in result.log and "" not in result.log  # colour codes and blank lines dropped


def test_an_error_names_the_failing_step_and_shows_its_output(capsys: pytest.CaptureFixture) -> None:
    stream = chunks("Step 1/2 : FROM x", "Step 2/2 : RUN false", "it broke here",
                    error="The command '/bin/sh -c false' returned a non-zero code: 1")
    with pytest.raises(BuildError) as err:
        read_build_stream(stream, lambda _line: None, " of bakery-local/x:1")
    assert str(err.value) == ("docker build of bakery-local/x:1 failed at Step 2/2 : RUN false: "
                              "The command '/bin/sh -c false' returned a non-zero code: 1")
    shown = capsys.readouterr().err
    assert shown == "  | Step 2/2 : RUN false\n  | it broke here\n", "only the failing step's output"


def test_an_error_before_any_step_and_a_stream_without_an_id() -> None:
    with pytest.raises(BuildError, match="failed at the start: Cannot locate specified Dockerfile"):
        read_build_stream(chunks(error="Cannot locate specified Dockerfile: Dockerfile"), lambda _l: None, "")
    assert read_build_stream(chunks("Step 1/1 : FROM x", image=None), lambda _l: None, "").image_id == ""
