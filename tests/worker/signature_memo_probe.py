"""Run inside the worker venv (PYTHONPATH=worker/): the signature memo on a real SDK Worker.

    <venv>/bin/python signature_memo_probe.py

Builds a Worker as core.run() does (core.install_parts: every layer of the signature check), gives it
a key, and counts the RSA verifications the SDK's own check makes (its backend module's pkcs1_15) for
a sequence of checks. Prints one JSON object; tests/worker/test_signature_memo.py asserts it.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from typing import Any

ENV = {"CONTAINER_ID": "5", "REPORT_ADDR": "http://127.0.0.1:9", "PUBLIC_IPADDR": "203.0.113.7",
       "WORKER_PORT": "3000", "VAST_TCP_PORT_3000": "41234", "USE_SSL": "false", "UNSECURED": "false",
       "MODEL_LOG": "/dev/null"}


class CountingPkcs1:
    """Stands for the SDK backend module's `pkcs1_15`: the same scheme, each verification counted."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.verifications = 0

    def new(self, key: Any) -> Any:
        scheme = self.real.new(key)
        outer = self

        class Counted:
            def verify(self, digest: Any, signature: bytes) -> None:
                outer.verifications += 1
                scheme.verify(digest, signature)

        return Counted()


def sign(key: Any, url: str) -> str:
    from Crypto.Hash import SHA256
    from Crypto.Signature import pkcs1_15

    digest = SHA256.new(json.dumps({"url": url}, indent=4, sort_keys=True).encode())
    return base64.b64encode(pkcs1_15.new(key).sign(digest)).decode()


def main() -> int:
    os.environ.update(ENV)
    import vastai
    from Crypto.PublicKey import RSA
    from vastai.serverless.server.lib import backend as backend_module
    from vastai.serverless.server.lib import data_types

    from app import core
    from control import sdk_seam
    from policy import signature_memo
    from workers.llama.worker import DEFAULTS

    cfg = core.load_config(DEFAULTS, os.environ)
    sdk_config, _ = core.build_worker_config(cfg.settings, vastai, ["word"])
    worker = vastai.Worker(sdk_config)
    core.install_parts(worker, cfg, core.endpoint_handlers(sdk_config))
    backend = worker.backend
    counter = CountingPkcs1(backend_module.pkcs1_15)
    backend_module.pkcs1_15 = counter
    key, other_key = RSA.generate(2048), RSA.generate(2048)
    sdk_seam.put(backend, "pubkey", key.publickey())
    own = backend.metrics.url
    signature = sign(key, own)
    flipped = base64.b64encode(bytes([base64.b64decode(signature)[0] ^ 1]) + base64.b64decode(signature)[1:]).decode()

    def check(url: str, sig: str, reqnum: int = 1) -> dict[str, Any]:
        before = counter.verifications
        valid = sdk_seam.check_signature(backend, data_types.AuthData(
            cost="1", endpoint="e", reqnum=reqnum, request_idx=reqnum, signature=sig, url=url))
        return {"valid": valid, "rsa": counter.verifications - before, "reqnum": backend.reqnum}

    facts: dict[str, Any] = {"own": own}
    facts["first"] = check(own, signature, 10)
    facts["again"] = [check(own, signature, n) for n in (50, 20, 30)]
    facts["flipped"] = [check(own, flipped, 99) for _ in range(3)]
    facts["other_key"] = [check(own, sign(other_key, own), 99) for _ in range(2)]
    facts["other_url"] = check("http://198.51.100.1:1", sign(key, "http://198.51.100.1:1"), 99)
    # The key changes (a rotation installs a new key object): the pair is checked again, under it.
    sdk_seam.put(backend, "pubkey", other_key.publickey())
    facts["after_rotation_old_signature"] = [check(own, signature, 60) for _ in range(2)]
    new_signature = sign(other_key, own)
    facts["after_rotation_new_signature"] = [check(own, new_signature, 61) for _ in range(2)]
    # The same key material in a new object is a new key to the memo: checked once more, then remembered.
    sdk_seam.put(backend, "pubkey", RSA.import_key(other_key.publickey().export_key()))
    facts["same_key_new_object"] = [check(own, new_signature, 62) for _ in range(2)]
    # A bounded memo: MAX_PAIRS + 1 accepted pairs (each a different signed URL, accepted with the URL
    # check out of the way) push the first one out.
    inner_counts = []
    bare_backend_check = type(backend)._Backend__check_signature
    bounded = signature_memo.memo(lambda auth: bare_backend_check(backend, auth), backend)
    urls = [f"http://203.0.113.{i}:1" for i in range(signature_memo.MAX_PAIRS + 1)]
    signatures = {url: sign(other_key, url) for url in urls}

    def bounded_check(url: str) -> tuple[bool, int]:
        before = counter.verifications
        valid = bounded(data_types.AuthData(cost="1", endpoint="e", reqnum=1, request_idx=1,
                                            signature=signatures[url], url=url))
        return valid, counter.verifications - before

    for url in urls:
        inner_counts.append(bounded_check(url))
    facts["bounded_fill"] = inner_counts
    facts["bounded_last_again"] = bounded_check(urls[-1])
    facts["bounded_first_again"] = bounded_check(urls[0])
    # What pkcs1.py cannot judge (not canonical base64) goes to the SDK's check (own_url refuses it
    # before, when installed; here the memo wraps the bare check).
    before = counter.verifications
    odd = bounded(data_types.AuthData(cost="1", endpoint="e", reqnum=1, request_idx=1, signature="!!", url=urls[0]))
    facts["undecodable"] = [odd, counter.verifications - before]
    # guards.auth_data_maker makes what AuthData.from_json_msg makes (and fails as it fails).
    from policy import guards

    make = guards.auth_data_maker(data_types.AuthData)
    full = {"cost": "8", "endpoint": "e", "reqnum": 3, "request_idx": 4, "signature": "s", "url": "u"}
    shapes = [full, {**full, "extra": [1]}, dict(reversed(list(full.items()))), {**full, "reqnum": "not checked"}]
    facts["auth_data_same"] = [make(shape) == data_types.AuthData.from_json_msg(shape) for shape in shapes]
    missing = {k: v for k, v in full.items() if k != "url"}
    errors = []
    for build in (make, data_types.AuthData.from_json_msg):
        try:
            build(missing)
            errors.append(None)
        except Exception as exc:  # noqa: BLE001 - the SDK's JsonDataException is compared
            errors.append([type(exc).__name__, str(exc)])
    facts["auth_data_missing"] = errors
    # UNSECURED: the SDK's check is called as it is, every time.
    backend.unsecured = True
    facts["unsecured"] = [check(own, "", 70) for _ in range(2)]
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
