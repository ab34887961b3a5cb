"""Run inside the worker venv (PYTHONPATH=worker/): bakery's signature check on a real SDK Worker.

    <venv>/bin/python signature_memo_probe.py

Builds a Worker as core.run() does (core.install_parts: every layer of the signature check), gives it
a key, counts bakery's RSA verifications (pkcs1.Verifier.verify) for a sequence of checks, and holds
policy/signature.py's verdicts to the SDK's own check. Prints one JSON object for
tests/worker/test_signature_memo.py.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import types
from typing import Any

ENV = {"CONTAINER_ID": "5", "REPORT_ADDR": "http://127.0.0.1:9", "PUBLIC_IPADDR": "203.0.113.7",
       "WORKER_PORT": "3000", "VAST_TCP_PORT_3000": "41234", "USE_SSL": "false", "UNSECURED": "false",
       "MODEL_LOG": "/dev/null"}


def sign(key: Any, url: str) -> str:
    from Crypto.Hash import SHA256
    from Crypto.Signature import pkcs1_15

    digest = SHA256.new(json.dumps({"url": url}, indent=4, sort_keys=True).encode())
    return base64.b64encode(pkcs1_15.new(key).sign(digest)).decode()


def main() -> int:
    os.environ.update(ENV)
    import vastai
    from Crypto.PublicKey import RSA
    from vastai.serverless.server.lib import data_types

    from app import core
    from control import sdk_seam
    from policy import pkcs1, signature, signature_memo
    from workers.llama.worker import DEFAULTS

    counted = [0]
    real_verify = pkcs1.Verifier.verify

    def verify_counted(self: Any, message: bytes, raw: bytes) -> bool:
        counted[0] += 1
        return real_verify(self, message, raw)

    pkcs1.Verifier.verify = verify_counted  # type: ignore[method-assign]
    cfg = core.load_config(DEFAULTS, os.environ)
    sdk_config, _ = core.build_worker_config(cfg.settings, vastai, ["word"])
    worker = vastai.Worker(sdk_config)
    sdk_check = type(worker.backend)._Backend__check_signature  # the SDK's own, before bakery's replaces it
    ctx = core.install_parts(worker, cfg, core.endpoint_handlers(sdk_config))
    backend, platform = worker.backend, ctx.platform
    key, other_key = RSA.generate(2048), RSA.generate(2048)
    platform.set_pubkey(key.publickey())
    own = backend.metrics.url
    sig = sign(key, own)
    flipped = base64.b64encode(bytes([base64.b64decode(sig)[0] ^ 1]) + base64.b64decode(sig)[1:]).decode()

    def auth(url: Any, sig_: Any, reqnum: int = 1) -> Any:
        return data_types.AuthData(cost="1", endpoint="e", reqnum=reqnum, request_idx=reqnum, signature=sig_, url=url)

    def check(url: str, sig_: str) -> dict[str, Any]:
        before = counted[0]
        valid = ctx.check_signature(auth(url, sig_))
        return {"valid": valid, "rsa": counted[0] - before}

    facts: dict[str, Any] = {"own": own,
                             "sdk_calls_bakerys": sdk_seam._get(backend, "check_signature") is ctx.check_signature}
    facts["first"] = check(own, sig)
    facts["again"] = [check(own, sig) for _ in range(3)]
    facts["flipped"] = [check(own, flipped) for _ in range(3)]
    facts["other_key"] = [check(own, sign(other_key, own)) for _ in range(2)]
    facts["other_url"] = check("http://198.51.100.1:1", sign(key, "http://198.51.100.1:1"))
    # The key changes (a rotation installs a new key object): the pair is checked again, under it.
    platform.set_pubkey(other_key.publickey())
    facts["after_rotation_old_signature"] = [check(own, sig) for _ in range(2)]
    new_signature = sign(other_key, own)
    facts["after_rotation_new_signature"] = [check(own, new_signature) for _ in range(2)]
    # The same key material in a new object is a new key to the memo: checked once more, then remembered.
    platform.set_pubkey(RSA.import_key(other_key.publickey().export_key()))
    facts["same_key_new_object"] = [check(own, new_signature) for _ in range(2)]
    # bakery's verification against the SDK's own check (given the same key: bakery's own is not the
    # SDK's), on what each decodes loosely or refuses.
    backend._pubkey = platform.pubkey()
    bare = signature.verify(platform)
    good = sign(other_key, own)
    raw = base64.b64decode(good)
    cases = {"valid": good, "flipped": base64.b64encode(bytes([raw[0] ^ 1]) + raw[1:]).decode(),
             "other_key": sign(key, own), "newlines": "\n".join(good[i:i + 64] for i in range(0, len(good), 64)),
             "unpadded": good.rstrip("="), "junk_inside": good[:10] + "!!" + good[10:], "short": good[:40],
             "undecodable": "!!", "empty": "", "not_ascii": "\u00e9" + good, "number": 12345,
             "bytes": good.encode(), "one_byte_more": base64.b64encode(raw + b"\0").decode()}
    facts["differential"] = {name: [bare(auth(own, value)), sdk_check(backend, auth(own, value))]
                             for name, value in cases.items()}
    facts["differential_url"] = [[bare(auth(url, signed)), sdk_check(backend, auth(url, signed))]
                                 for url in (own, own + "/", 7, None) for signed in [sign(other_key, str(url))]]
    # A bounded memo: MAX_PAIRS + 1 accepted pairs (each a different signed URL, accepted with the URL
    # check out of the way) push the first one out.
    bounded = signature_memo.memo(bare, platform.pubkey, False)
    urls = [f"http://203.0.113.{i}:1" for i in range(signature_memo.MAX_PAIRS + 1)]
    signatures = {url: sign(other_key, url) for url in urls}

    def bounded_check(url: str) -> tuple[bool, int]:
        before = counted[0]
        return bounded(auth(url, signatures[url])), counted[0] - before

    facts["bounded_fill"] = [bounded_check(url) for url in urls]
    facts["bounded_last_again"] = bounded_check(urls[-1])
    facts["bounded_first_again"] = bounded_check(urls[0])
    # own_handler.auth_data makes what AuthData.from_json_msg makes (and fails as it fails); the signature check's
    # own AuthData (guards.signature_check builds it positionally) has the SDK's fields in the SDK's order.
    import dataclasses

    from control import own_handler

    def make(shape: dict[str, Any]) -> Any:
        return own_handler.auth_data(shape, data_types.JsonDataException)

    full = {"cost": "8", "endpoint": "e", "reqnum": 3, "request_idx": 4, "signature": "s", "url": "u"}
    shapes = [full, {**full, "extra": [1]}, dict(reversed(list(full.items()))), {**full, "reqnum": "not checked"}]
    facts["auth_data_same"] = [dataclasses.asdict(make(shape)) == dataclasses.asdict(
        data_types.AuthData.from_json_msg(shape)) for shape in shapes]
    facts["auth_fields"] = [list(own_handler.AUTH_FIELDS), [f.name for f in dataclasses.fields(data_types.AuthData)],
                            [f.name for f in dataclasses.fields(own_handler.AuthData)]]
    missing = {k: v for k, v in full.items() if k != "url"}
    errors = []
    for build in (make, data_types.AuthData.from_json_msg):
        try:
            build(missing)
            errors.append(None)
        except Exception as exc:  # noqa: BLE001 - the SDK's JsonDataException is compared
            errors.append([type(exc).__name__, str(exc)])
    facts["auth_data_missing"] = errors
    # No key: refused, by bakery's check and by the SDK's.
    platform.set_pubkey(None)
    backend._pubkey = None
    facts["no_key"] = [bare(auth(own, good)), sdk_check(backend, auth(own, good))]
    # UNSECURED: everything is accepted, as the SDK's check accepts it.
    backend.unsecured = True
    loose = signature.verify(types.SimpleNamespace(unsecured=True, pubkey=lambda: None))  # type: ignore[arg-type]
    facts["unsecured"] = [loose(auth(own, "")), sdk_check(backend, auth(own, ""))]
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
