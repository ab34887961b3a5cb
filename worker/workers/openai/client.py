#!/usr/bin/env python3
"""Demo client for every bakery worker (vllm, sglang, llama, openai): stdlib only.

    python3 worker/workers/openai/client.py http://127.0.0.1:3000 [--model ID] [--max-tokens N] [--stream]
    python3 worker/workers/openai/client.py URL --chat-stream | --interactive | --chat | --tools | --completion
    python3 worker/workers/openai/client.py URL --embeddings | --rerank | --score | --chat-batch
    python3 worker/workers/openai/client.py URL --speech [--voice V] | --speech-batch | --audio-generate [--seconds S]
    python3 worker/workers/openai/client.py URL --transcribe CLIP | --translate CLIP | --image | --edit PICTURE
    python3 worker/workers/openai/client.py URL --video [--image-file FIRST_FRAME]   [--out DIR]

Without a mode it sends one completion and one chat request and prints both answers. Each request is
wrapped in the SDK's envelope (`{"auth_data": {...}, "payload": <OpenAI body>}`); uploads go base64'd
in the JSON, as the worker expects. Media answers (speech, images, video) are saved under --out.
Exits 1 if a request fails. The worker must run with UNSECURED=true (a local container): the auth_data here is unsigned.
The model id defaults to the first non-empty of MODEL_NAME, VLLM_MODEL, SGLANG_MODEL, LLAMA_MODEL;
without one the field is left out (llama.cpp ignores it; vLLM and SGLang use their served model).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MODEL_ID_VARS = ("MODEL_NAME", "VLLM_MODEL", "SGLANG_MODEL", "LLAMA_MODEL")


def envelope(payload: dict[str, Any], route: str, reqnum: int) -> dict[str, Any]:
    """Wrap an OpenAI body the way the serverless router delivers it to a worker."""
    auth = {"cost": str(payload.get("max_tokens", 0)), "endpoint": "bakery-demo", "reqnum": reqnum,
            "request_idx": reqnum, "signature": "", "url": route}
    return {"auth_data": auth, "payload": payload}


def post(base: str, route: str, payload: dict[str, Any], reqnum: int, timeout: float) -> tuple[int, bytes]:
    """POST the enveloped payload to the worker; return (status, body). Raises OSError offline."""
    data = json.dumps(envelope(payload, route, reqnum)).encode()
    request = urllib.request.Request(  # noqa: S310 (main() accepts http(s) URLs only)
        base.rstrip("/") + route, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (http(s) only)
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def answer_text(route: str, body: bytes) -> str:
    """The generated text of a completion or chat answer, plain JSON or a server-sent-event stream."""
    text = body.decode("utf-8", "replace")
    if text.lstrip().startswith("data:"):
        pieces = []
        for line in text.splitlines():
            chunk = line.removeprefix("data:").strip()
            if not line.startswith("data:") or chunk == "[DONE]" or not chunk:
                continue
            choice = (json.loads(chunk).get("choices") or [{}])[0]
            pieces.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
        return "".join(pieces)
    choice = (json.loads(text).get("choices") or [{}])[0]
    if route.endswith("/chat/completions"):
        return (choice.get("message") or {}).get("content") or ""
    return choice.get("text") or ""


def post_stream(base: str, route: str, payload: dict[str, Any], reqnum: int, timeout: float) -> Iterator[str]:
    """POST a streaming request; yield each server-sent event's data as it arrives. Raises OSError
    offline and RuntimeError on an HTTP error."""
    data = json.dumps(envelope(payload, route, reqnum)).encode()
    request = urllib.request.Request(  # noqa: S310 (main() accepts http(s) URLs only)
        base.rstrip("/") + route, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        response = urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 (http(s) only)
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"HTTP {err.code}: {err.read()[:500].decode('utf-8', 'replace')}") from None
    with response:
        for raw in response:
            line = raw.decode("utf-8", "replace").strip()
            if line.startswith("data:"):
                chunk = line.removeprefix("data:").strip()
                if chunk == "[DONE]":
                    return
                yield chunk


def stream_chat(args: argparse.Namespace, messages: list[dict[str, Any]], reqnum: int) -> str:
    """Stream a chat answer to stdout as it is generated; return the whole answer."""
    payload = {**_model(args), "messages": messages, "max_tokens": args.max_tokens, "stream": True}
    pieces = []
    for chunk in post_stream(args.url, "/v1/chat/completions", payload, reqnum, args.timeout):
        choice = (json.loads(chunk).get("choices") or [{}])[0]
        piece = (choice.get("delta") or {}).get("content") or ""
        print(piece, end="", flush=True)
        pieces.append(piece)
    print()
    return "".join(pieces)


def _model(args: argparse.Namespace) -> dict[str, Any]:
    return {"model": args.model} if args.model else {}


def _call(args: argparse.Namespace, route: str, payload: dict[str, Any], reqnum: int = 1) -> tuple[bytes, str]:
    """One request; (body, content type) on 200, else RuntimeError with the worker's answer."""
    data = json.dumps(envelope(payload, route, reqnum)).encode()
    request = urllib.request.Request(  # noqa: S310 (main() accepts http(s) URLs only)
        args.url.rstrip("/") + route, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as response:  # noqa: S310 (http(s) only)
            return response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"{route}: HTTP {err.code}: {err.read()[:500].decode('utf-8', 'replace')}") from None


def _save(args: argparse.Namespace, name: str, data: bytes) -> str:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_bytes(data)
    return f"saved {len(data)} bytes to {path}"


def _upload(path: str) -> dict[str, str]:
    """A local file as the worker takes it: base64 content and its name (which sets the type)."""
    raw = Path(path).read_bytes()
    return {"data": base64.b64encode(raw).decode("ascii"), "name": Path(path).name}


def interactive(args: argparse.Namespace) -> int:
    """A chat session in the terminal: `clear` forgets the history, `quit` (or end of input) leaves."""
    history: list[dict[str, Any]] = []
    reqnum = 0
    print("Interactive chat: type `clear` to clear the history, `quit` to leave.")
    while True:
        try:
            line = input("you> ").strip()
        except EOFError:
            print()
            return 0
        if line == "quit":
            return 0
        if line == "clear":
            history.clear()
            print("(history cleared)")
            continue
        if not line:
            continue
        history.append({"role": "user", "content": line})
        reqnum += 1
        print("model> ", end="", flush=True)
        try:
            history.append({"role": "assistant", "content": stream_chat(args, history, reqnum)})
        except (OSError, RuntimeError) as err:
            history.pop()
            print(f"\nrequest failed: {err}", file=sys.stderr)


LIST_TOOL = {"type": "function", "function": {
    "name": "list_directory", "description": "List the names of the files in a directory on the client.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "the directory"}},
                   "required": ["path"]}}}


def tools(args: argparse.Namespace) -> str:
    """Tool use: the model may call list_directory; the client runs it and sends the result back."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Which files are in the current directory? "
                                       "Use the list_directory tool, then summarise."}]
    body, _ = _call(args, "/v1/chat/completions", {**_model(args), "messages": messages, "tools": [LIST_TOOL],
                                                   "tool_choice": "auto", "max_tokens": args.max_tokens})
    message = (json.loads(body).get("choices") or [{}])[0].get("message") or {}
    calls = message.get("tool_calls") or []
    if not calls:
        return f"(no tool call) {message.get('content') or ''}".strip()
    messages.append(message)
    for call in calls:
        arguments = json.loads(call["function"].get("arguments") or "{}")
        names = sorted(os.listdir(arguments.get("path") or "."))
        print(f"tool call: list_directory({arguments.get('path', '.')!r}) -> {len(names)} entries")
        messages.append({"role": "tool", "tool_call_id": call.get("id"), "content": json.dumps(names)})
    body, _ = _call(args, "/v1/chat/completions", {**_model(args), "messages": messages, "tools": [LIST_TOOL],
                                                   "max_tokens": args.max_tokens}, 2)
    return answer_text("/v1/chat/completions", body)


def one_route(args: argparse.Namespace, mode: str) -> str:
    """The request of one route mode; a line describing the answer."""
    model = _model(args)
    if mode == "chat":
        body, _ = _call(args, "/v1/chat/completions", {**model, "max_tokens": args.max_tokens,
                                                       "messages": [{"role": "user", "content": "Say hello."}]})
        return answer_text("/v1/chat/completions", body)
    if mode == "completion":
        body, _ = _call(args, "/v1/completions", {**model, "prompt": "The three primary colours are",
                                                  "max_tokens": args.max_tokens})
        return answer_text("/v1/completions", body)
    if mode == "chat_batch":
        convos = [[{"role": "user", "content": q}] for q in ("Name a colour.", "Name a fruit.")]
        body, _ = _call(args, "/v1/chat/completions/batch", {**model, "messages": convos,
                                                             "max_tokens": args.max_tokens})
        return " | ".join(c["message"]["content"] for c in json.loads(body)["choices"])
    if mode == "embeddings":
        data = json.loads(_call(args, "/v1/embeddings", {**model, "input": ["a red apple", "a green pear"]})[0])
        return f"{len(data['data'])} embeddings of {len(data['data'][0]['embedding'])} dimensions"
    if mode == "rerank":
        docs = ["Paris is the capital of France.", "Bananas are yellow.", "France borders Spain."]
        data = json.loads(_call(args, "/v1/rerank", {**model, "query": "What is France's capital?",
                                                     "documents": docs})[0])
        return "; ".join(f"{r['relevance_score']:.3f} {docs[r['index']]}" for r in data["results"])
    if mode == "score":
        data = json.loads(_call(args, "/v1/score", {**model, "text_1": "What is France's capital?",
                                                    "text_2": ["Paris is the capital of France.",
                                                               "Bananas are yellow."]})[0])
        return ", ".join(f"{d['score']:.3f}" for d in data["data"])
    if mode == "speech":
        voice = {"voice": args.voice} if args.voice else {}
        audio, ctype = _call(args, "/v1/audio/speech", {**model, **voice, "response_format": "wav",
                                                        "input": "Hello from a bakery worker."})
        return f"{ctype}: " + _save(args, "speech.wav", audio)
    if mode == "speech_batch":
        data = json.loads(_call(args, "/v1/audio/speech/batch", {**model, "response_format": "wav", "items": [
            {"input": "First sentence."}, {"input": "Second sentence."}]})[0])
        saved = [_save(args, f"speech-{r['index']}.wav", base64.b64decode(r["audio_data"]))
                 for r in data["results"] if r.get("status") == "success"]
        return f"{data.get('succeeded', len(saved))} of {data.get('total', len(saved))} items; " + "; ".join(saved)
    if mode == "audio_generate":
        audio, ctype = _call(args, "/v1/audio/generate", {**model, "input": "Gentle rain on a tin roof",
                                                          "audio_length": args.seconds})
        return f"{ctype}: " + _save(args, "generated.wav", audio)
    if mode in ("transcribe", "translate"):
        clip = _upload(args.transcribe or args.translate)
        route = "/v1/audio/transcriptions" if mode == "transcribe" else "/v1/audio/translations"
        body, _ = _call(args, route, {**model, "file": clip["data"], "filename": clip["name"]})
        return json.loads(body).get("text", "")
    if mode == "image":
        data = json.loads(_call(args, "/v1/images/generations", {**model, "prompt": "a loaf of bread, watercolour",
                                                                 "size": "512x512", "n": 1})[0])
        return _save(args, "image.png", base64.b64decode(data["data"][0]["b64_json"]))
    if mode == "edit":
        picture = _upload(args.edit)
        data = json.loads(_call(args, "/v1/images/edits", {**model, "image": picture["data"],
                                                           "filename": picture["name"],
                                                           "prompt": "add a small hat", "size": "512x512"})[0])
        return _save(args, "edited.png", base64.b64decode(data["data"][0]["b64_json"]))
    if mode == "video":
        payload: dict[str, Any] = {**model, "prompt": "a cat walking on a beach", "num_frames": 33}
        if args.image_file:
            frame = _upload(args.image_file)
            payload.update(input_reference=frame["data"], input_reference_filename=frame["name"])
        video, ctype = _call(args, "/v1/videos/sync", payload)
        return f"{ctype}: " + _save(args, "video.mp4", video)
    raise ValueError(mode)


ROUTE_MODES = ("chat", "completion", "chat_batch", "embeddings", "rerank", "score", "speech", "speech_batch",
               "audio_generate", "transcribe", "translate", "image", "edit", "video")


def demo(args: argparse.Namespace) -> int:
    """The default: one completion and one chat request; 0 when both answer 200."""
    common: dict[str, Any] = {"max_tokens": args.max_tokens, "temperature": 0.7, "stream": args.stream}
    if args.model:
        common["model"] = args.model
    requests = [
        ("/v1/completions", {**common, "prompt": "The three primary colours are"}),
        ("/v1/chat/completions", {**common, "messages": [{"role": "user", "content": "Say hello in one line."}]}),
    ]
    failed = 0
    for reqnum, (route, payload) in enumerate(requests, start=1):
        try:
            status, body = post(args.url, route, payload, reqnum, args.timeout)
        except OSError as err:
            print(f"{route}: request failed: {err}", file=sys.stderr)
            failed += 1
            continue
        if status != 200:
            print(f"{route}: HTTP {status}: {body[:500].decode('utf-8', 'replace')}", file=sys.stderr)
            failed += 1
            continue
        try:
            text = answer_text(route, body)
        except (ValueError, AttributeError, IndexError) as err:
            print(f"{route}: unreadable answer ({err}): {body[:500]!r}", file=sys.stderr)
            failed += 1
            continue
        print(f"{route}: {text.strip()}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """Run the chosen mode (default: the completion + chat demo); 0 on success, 1 on a failed request."""
    parser = argparse.ArgumentParser(description="Call a bakery worker: a completion and a chat by default, "
                                                 "or one of the modes below.")
    parser.add_argument("url", help="the worker's URL, e.g. http://127.0.0.1:3000")
    parser.add_argument("--model", default=next((v for n in MODEL_ID_VARS if (v := os.environ.get(n))), None))
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--stream", action="store_true", help="ask for streamed answers (default demo)")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--out", default=".", help="where media answers are saved (default: here)")
    parser.add_argument("--voice", help="speech voice (engines name voices differently)")
    parser.add_argument("--seconds", type=float, default=5.0, help="audio length for --audio-generate")
    parser.add_argument("--image-file", help="first frame for --video")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--chat-stream", action="store_true", help="one chat, printed as it streams")
    modes.add_argument("--interactive", action="store_true", help="a streamed chat session")
    modes.add_argument("--tools", action="store_true", help="a chat with a tool the model may call")
    for mode in ROUTE_MODES:
        if mode in ("transcribe", "translate"):
            modes.add_argument(f"--{mode}", metavar="CLIP", help=f"{mode} an audio file")
        elif mode == "edit":
            modes.add_argument("--edit", metavar="PICTURE", help="edit a PNG/JPEG/WebP picture")
        else:
            modes.add_argument(f"--{mode.replace('_', '-')}", action="store_true", help=f"one {mode} call")
    args = parser.parse_args(argv)
    if not args.url.startswith(("http://", "https://")):
        parser.error(f"the worker URL must start with http:// or https://, got {args.url!r}")
    try:
        if args.interactive:
            return interactive(args)
        if args.chat_stream:
            stream_chat(args, [{"role": "user", "content": "Tell me a short story about bread."}], 1)
            return 0
        if args.tools:
            print(tools(args))
            return 0
        mode = next((m for m in ROUTE_MODES if getattr(args, m)), None)
        if mode is None:
            return demo(args)
        print(one_route(args, mode))
        return 0
    except (OSError, RuntimeError) as err:
        print(f"request failed: {err}", file=sys.stderr)
        return 1
    except (ValueError, KeyError, IndexError, TypeError) as err:
        print(f"unreadable answer: {err!r}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
