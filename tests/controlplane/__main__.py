"""Command line of the control-plane stand-in (see README.md next to this file).

    python -m controlplane serve [--port 18200] [--withhold | --withhold-for N [--hold]]
    python -m controlplane release | lift-hold | withhold [--status 503]
    python -m controlplane sign URL
    python -m controlplane post [--route /v1/completions] [--payload JSON] [--signature valid]
    python -m controlplane probe CASES_JSON
    python -m controlplane stall [--seconds 60]
    python -m controlplane records [--path /worker_status/]

Every command takes --state DIR (default $BAKERY_CONTROLPLANE_STATE, else /tmp/bakery-controlplane):
the key, the withhold switch and the records live there, so one command talks to another's server.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import signing, stall
from .probe import envelope, run_case
from .server import State, serve

DEFAULT_PORT = 18200
DEFAULT_STATE = "/tmp/bakery-controlplane"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="controlplane", description="The control-plane stand-in (tests only).")
    parser.add_argument("--state", default=os.environ.get("BAKERY_CONTROLPLANE_STATE", DEFAULT_STATE),
                        help="directory of the key, the withhold switch and the records")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="serve /pubkey/ and record reports (loopback only)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--withhold", action="store_true", help="start with the key withheld (503) until `release`")
    p.add_argument("--withhold-for", type=int, metavar="N", help="withhold the key from the first N fetches only")
    p.add_argument("--hold", action="store_true",
                   help="with --withhold-for: keep withholding after those N fetches until `lift-hold`")
    p = sub.add_parser("withhold", help="make /pubkey/ answer an error until `release`")
    p.add_argument("--status", type=int, default=503)
    p.add_argument("--times", type=int, help="only for the next N fetches")
    sub.add_parser("release", help="serve the key from now on")
    sub.add_parser("lift-hold", help="end a --hold: serve the key once the counted fetches are withheld")
    p = sub.add_parser("sign", help="print the platform's signature of a worker URL")
    p.add_argument("url")
    p = sub.add_parser("envelope", help="print a signed request body")
    _case_args(p)
    p = sub.add_parser("post", help="send one signed request to the worker; print the answer as JSON")
    _case_args(p)
    p.add_argument("--worker", default="http://127.0.0.1:3000")
    p.add_argument("--route", default="/v1/completions")
    p.add_argument("--timeout", type=float, default=120.0)
    p = sub.add_parser("probe", help="send a JSON list of probe cases; print a JSON list of results")
    p.add_argument("cases", help="JSON list of cases (see probe.py)")
    p.add_argument("--worker", default="http://127.0.0.1:3000")
    p.add_argument("--timeout", type=float, default=120.0)
    p = sub.add_parser("stall", help="a client that reads nothing: print how long the worker kept its connection")
    p.add_argument("--worker", default="http://127.0.0.1:3000")
    p.add_argument("--seconds", type=float, default=60.0)
    p = sub.add_parser("records", help="print the recorded requests, one JSON object a line")
    p.add_argument("--path", help="only this path, e.g. /worker_status/")
    return parser


def _case_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--payload", help="the OpenAI body as JSON (default: a short completion)")
    p.add_argument("--signature", default="valid", choices=["valid", "empty", "other-key", "flipped", "none"])
    p.add_argument("--sign-url", help="the URL to sign (default: the worker's own, from its latest report)")
    p.add_argument("--request-idx", type=int, default=1)


def _case(args: argparse.Namespace) -> dict:
    case: dict = {"signature": args.signature, "sign_url": args.sign_url, "request_idx": args.request_idx}
    if args.payload:
        case["payload"] = json.loads(args.payload)
    if getattr(args, "route", None):
        case["route"] = args.route
    return case


def main(argv: list[str] | None = None) -> int:
    """Run one command; 0 on success, 2 on bad input (one line naming what to fix)."""
    args = _parser().parse_args(argv)
    state = State(Path(args.state))
    try:
        if args.command == "serve":
            state.dir.mkdir(parents=True, exist_ok=True)
            if args.withhold_for is not None and args.withhold_for < 1:
                raise ValueError(f"--withhold-for must be a positive number of fetches, got {args.withhold_for}")
            if args.hold and not args.withhold_for:
                raise ValueError("--hold goes with --withhold-for N")
            if args.withhold or args.withhold_for:
                state.withhold(times=None if args.withhold else args.withhold_for, hold=args.hold)
            serve(state, args.host, args.port)
        elif args.command == "withhold":
            state.withhold(args.status, args.times)
        elif args.command == "release":
            state.release()
        elif args.command == "lift-hold":
            state.lift_hold()
        elif args.command == "sign":
            print(signing.sign(state.key(), args.url))
        elif args.command == "envelope":
            print(json.dumps(envelope(state, _case(args))))
        elif args.command == "post":
            print(json.dumps(run_case(state, args.worker, _case(args), args.timeout)))
        elif args.command == "probe":
            cases = json.loads(args.cases)
            print(json.dumps([run_case(state, args.worker, case, args.timeout) for case in cases]))
        elif args.command == "stall":
            stall.main(state, args.worker, args.seconds)
        elif args.command == "records":
            for entry in state.records():
                if not args.path or entry.get("path") == args.path:
                    print(json.dumps(entry, sort_keys=True))
    except (ValueError, LookupError) as exc:  # JSON errors are ValueErrors
        print(f"controlplane {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
