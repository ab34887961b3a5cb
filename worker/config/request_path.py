"""Port 3000's request path, declared once: every stage a request meets, in order, what it refuses and
where its code lives.

The worker runs this list: the middlewares' order is their order here (RANK), and each layer of the
signature check and of the engine call is tagged with its stage (`layer`), so tests/worker/test_request_path.py
reads the chains a real worker installed and holds them to STAGES. Standard library only. docs/security.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar


@dataclass(frozen=True)
class Stage:
    """One step of a request at :3000. `kind` is how the worker runs it: "listener" (on the connection,
    before any request), "middleware" (aiohttp.web's chain, outermost first; the wire front checks the
    same before it serves a request itself), "handler" (the route's handler), "signature" (a layer of
    the signature check, outermost first), "engine" (a layer of the engine call, outermost first),
    "answer" (the answer on its way back)."""

    name: str
    kind: str
    refuses: str
    code: str


# The middlewares' order: refusals that need no body before those that read it. admission's 503 and 415
# come before any body is read (and outcomes must not read a body admission refused to buffer); outcomes
# sits outside the drain, so it sees every refusal, the drain's 503 included.
STAGES: tuple[Stage, ...] = (
    Stage("connection_cap", "listener", "a connection over BAKERY_MAX_CONNECTIONS: 503 + Retry-After, before "
          "aiohttp makes a protocol for it", "policy/admission.py Connections"),
    Stage("send_bound", "listener", "a client that takes no byte of an answer for BAKERY_SEND_TIMEOUT, in any "
          "state: its connection is reset", "policy/admission.py SendWatch"),
    Stage("head", "listener", "a head not whole within BAKERY_HEADER_TIMEOUT: closed. A plain signed request "
          "the signature memo knows is served by the wire front, anything else by aiohttp.web",
          "front/wire.py WireProtocol"),
    Stage("admission", "middleware", "a Content-Encoding on a request: 415; the body budget "
          "(BAKERY_MAX_BUFFERED_BYTES) full: 503 + Retry-After", "policy/admission.py admission_middleware"),
    Stage("outcomes", "middleware", "nothing: reports the 422 and 503 of an envelope signed for this worker, "
          "which the SDK never sees", "policy/guards.py _install_outcomes"),
    Stage("drain", "middleware", "any request once SIGTERM came: 503 + Retry-After, Connection: close",
          "policy/drain.py Drain.middleware"),
    Stage("self_update", "middleware", "/pyworker/*: 403", "policy/rules.py self_update_middleware"),
    Stage("limits_body", "middleware", "a body over BAKERY_MAX_BODY_BYTES: 413; one not read within "
          "BAKERY_BODY_TIMEOUT: 408", "policy/rules.py limits_body_middleware"),
    Stage("sessions", "middleware", "/session/*: 404 unless BAKERY_SESSIONS; a call not signed for this "
          "worker: 401 before its payload is parsed", "policy/signed_first.py sessions_middleware"),
    Stage("not_ready", "middleware", "a model route before the model is loaded: 503 + Retry-After",
          "policy/rules.py not_ready_middleware"),
    Stage("envelope", "middleware", "a malformed envelope: 422; one not signed for this worker: 401, before "
          "anything parses its payload", "policy/signed_first.py envelope_middleware"),
    Stage("limits_engine", "middleware", "an engine call that timed out: 504 (not 500)",
          "policy/rules.py limits_engine_middleware"),
    Stage("parse", "handler", "a payload the route's parser refuses: 422; a request bound to a session goes to "
          "the SDK's handler (sessions are the SDK's)", "control/own_handler.py handle_request"),
    Stage("outcomes_mark", "signature", "nothing: marks a forged request so its refusal counts no load",
          "policy/guards.py _install_outcomes"),
    Stage("pubkey_retry", "signature", "nothing: counts failures under the key (a run of them fetches it "
          "again)", "policy/key_rotation.py counting"),
    Stage("own_url", "signature", "a signature for another worker's URL, or one that is not canonical base64 of "
          "the key's size: 401", "policy/guards.py _install_own_url"),
    Stage("signature_memo", "signature", "nothing: a pair accepted before under the key is accepted without "
          "the RSA step", "policy/signature_memo.py memo"),
    Stage("verify", "signature", "a signature that does not verify under the platform's key (or none loaded): "
          "401", "policy/signature.py verify"),
    Stage("queue", "handler", "a request over the route's max_queue_time: 429", "control/own_handler.py serve"),
    Stage("references", "engine", "a reference to an address the engine must not fetch: 4xx without an engine "
          "call", "policy/references.py install"),
    Stage("engine_close", "engine", "nothing: the engine's answer is closed when its request ends",
          "engine/engine_close.py install"),
    Stage("engine_timeouts", "engine", "an engine that does not connect in BAKERY_ENGINE_CONNECT_TIMEOUT or is "
          "silent for BAKERY_ENGINE_IDLE_TIMEOUT: recorded, answered 504", "policy/guards.py _install_limits"),
    Stage("forward", "engine", "nothing: bakery's own engine client sends the request and reads the answer's head "
          "(a multipart one goes by aiohttp's client)", "engine/forward.py install"),
    Stage("relay", "answer", "nothing: a streamed body after its head goes by bakery-relay, under the send bound",
          "engine/native_relay.py, worker/relay/bakery_relay.c"),
    Stage("outcome", "answer", "nothing: the request's outcome (served, errored 500, canceled 499) is reported",
          "control/own_handler.py serve"),
)
BY_NAME = {stage.name: stage for stage in STAGES}


def order(kind: str) -> tuple[str, ...]:
    """The names of the stages of `kind`, in the order a request meets them."""
    return tuple(stage.name for stage in STAGES if stage.kind == kind)


# aiohttp.web's middlewares run in this order (rank 0 outermost; sdk_seam.WebShim sorts by rank).
RANK: dict[str, int] = {name: index for index, name in enumerate(order("middleware"))}

F = TypeVar("F", bound=Callable[..., Any])


def middleware(stage: str, made: Any) -> tuple[int, Any]:
    """(its rank, `made`) for the guards' Context: `made`, aiohttp middleware of the stage `stage`, tagged."""
    made.bakery_stage = stage
    return RANK[stage], made


def layer(stage: str, made: F, inner: Any) -> F:
    """Tag `made`, a layer wrapped around `inner`, as the stage `stage` (a signature or engine stage)."""
    if stage not in BY_NAME:
        raise KeyError(f"{stage!r} is no stage of config/request_path.py STAGES")
    made.bakery_stage = stage  # type: ignore[attr-defined]
    made.__wrapped__ = inner  # type: ignore[attr-defined]
    return made


def chain(outer: Any) -> tuple[str, ...]:
    """The stages of a chain of tagged layers, outermost first, down to the first untagged callable."""
    names = []
    while outer is not None and getattr(outer, "bakery_stage", None) is not None:
        names.append(outer.bakery_stage)
        outer = getattr(outer, "__wrapped__", None)
    return tuple(names)
