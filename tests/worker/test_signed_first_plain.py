"""signed_first.read_plain (one typed decode for the envelope the platform sends) gives read_careful's
Envelope on every body it answers, and answers the platform's own shape.

Differential: a seeded corpus of bodies (every auth_data field given every kind of JSON value, fields
missing or repeated, escapes, surrogates, long strings, numbers at the 64-bit edges, payloads of every
type, session_id, other keys, broken text) goes to the worker venv (msgspec), where each is read both
ways; the two Envelopes must be equal wherever read_plain answers (problem, auth, checkable, utf8).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

from tests.worker.helpers import WORKER_DIR

PROBE = r"""
import json, sys
from policy import signed_first
bodies = [text.encode("latin-1") for text in json.load(sys.stdin)]
diffs, answered = [], 0
for body in bodies:
    plain = signed_first.read_plain(body, None)
    if plain is None:
        continue
    answered += 1
    careful = signed_first.read_careful(body, None)
    if plain != careful:
        diffs.append([body[:200].decode("latin-1"), repr(plain)[:300], repr(careful)[:300]])
platform = signed_first.read_plain(json.dumps({"auth_data": {"cost": "8", "endpoint": "e", "reqnum": 3,
    "request_idx": 4, "signature": "c2ln", "url": "http://127.0.0.1:3000"}, "payload": {"prompt": "x"}}).encode(), None)
print(json.dumps({"compared": len(bodies), "answered": answered, "diffs": diffs,
                  "platform": None if platform is None else platform.auth}))
"""

GOOD = {"cost": "8", "endpoint": "e", "reqnum": 1, "request_idx": 2, "signature": "c2ln", "url": "http://x:3000"}
VALUES: list[object] = [0, -0, 1, -5, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 10**30, 1.0, 1.5, 1e5, True,
                        False, None, "", "s", "é", "\u2028", "\\", '"', "x" * 24, "x" * 25, "x" * 1365, "x" * 1366,
                        "x" * 20000, "\U0001f600" * 1400, [], [1], {}, {"a": 1}]


def corpus(seed: int = 24, n: int = 1500) -> list[str]:
    """Bodies as text (latin-1 round trip of their bytes)."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible corpus, not a secret
    texts: list[str] = []

    def add(value: object) -> None:
        texts.append(json.dumps(value, ensure_ascii=rng.random() < 0.5).encode().decode("latin-1"))

    for field in GOOD:
        for value in VALUES:
            add({"auth_data": {**GOOD, field: value}, "payload": {}})
        add({"auth_data": {k: v for k, v in GOOD.items() if k != field}, "payload": {}})
    for value in VALUES:
        add({"auth_data": GOOD, "payload": value})
        add({"auth_data": GOOD, "payload": {}, "session_id": value})
        add({"auth_data": GOOD, "payload": {}, "session_auth": value, "other": value})
        add({"auth_data": value, "payload": {}})
    for _ in range(n):  # random mixes of the values above
        auth = {k: (rng.choice(VALUES) if rng.random() < 0.3 else v) for k, v in GOOD.items() if rng.random() < 0.95}
        body: dict[str, object] = {"auth_data": auth, "payload": rng.choice([{}, {"p": rng.choice(VALUES)}, []])}
        if rng.random() < 0.1:
            body["session_id"] = rng.choice(VALUES)
        add(body)
    good = json.dumps(GOOD)
    raw = [  # what json.dumps does not write
        '{"auth_data": ' + good + ', "payload": {}, "auth_data": {"url": 1}}',
        '{"auth_data": {"url": "a", "url": "b", "cost": 1, "endpoint": 1, "reqnum": 1, "request_idx": 1, '
        '"signature": "s"}, "payload": {}}',
        '{"auth_data": ' + good.replace('"c2ln"', '"\\ud800"') + ', "payload": {}}',
        '{"auth_data": ' + good.replace('"c2ln"', '"\\ud83d\\ude00"') + ', "payload": {}}',
        '{"auth_data": ' + good.replace('"reqnum": 1', '"reqnum": 1e0') + ', "payload": {}}',
        '{"auth_data": ' + good.replace('"reqnum": 1', '"reqnum": -0') + ', "payload": {}}',
        '{"auth_data": ' + good + ', "payload": {"x": NaN}}',
        '{"auth_data": ' + good + ', "payload": ' + "[" * 5000 + "]" * 5000 + "}",
        ' \n{"auth_data": ' + good + ', "payload": {}}\n ',
        '\ufeff{"auth_data": ' + good + ', "payload": {}}',
        '{"auth_data": ' + good + ', "payload": {}',
        '{"auth_data": ' + good + ', "payload": {}}x',
        '{"auth_data": ' + good.replace("http://x:3000", "h\xff") + ', "payload": {}}',
    ]
    texts += [text.encode().decode("latin-1") for text in raw]
    texts.append(('{"auth_data": ' + good + ', "payload": {}}').replace("c2ln", "c2l\xff").encode("latin-1")
                 .decode("latin-1"))  # a byte that is not UTF-8
    return texts


def test_read_plain_answers_as_read_careful_does(worker_python: Path) -> None:
    bodies = corpus()
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(WORKER_DIR), "PYTHONNOUSERSITE": "1"}
    out = subprocess.run([str(worker_python), "-c", PROBE], input=json.dumps(bodies), capture_output=True, text=True,
                         env=env, timeout=300, check=True).stdout
    result = json.loads(out)
    assert result["compared"] == len(bodies) > 1500
    assert result["answered"] > 300  # it does answer a good share of the corpus ...
    assert result["diffs"] == [], result["diffs"][:5]  # ... and always as read_careful does
    assert result["platform"] == {"cost": "8", "endpoint": "e", "reqnum": 3, "request_idx": 4, "signature": "c2ln",
                                  "url": "http://127.0.0.1:3000"}
