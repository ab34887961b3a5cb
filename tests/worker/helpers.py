"""Helpers for the worker's host tests: real SDK, real processes on loopback, no Docker.

The worker runs through worker/start_server.sh with the lean venv of bakery.host.downloads
(WORKER_PYTHON), against the project's stand-in engines (bases/standin: vllm, sglang) or the real
llama.cpp (xllamacpp), with the offline platform environment of docs/sdk.md ("Environment read at
start"). REPORT_ADDR points at a local HTTP server that
records the SDK's status reports and serves it a real public key (so the SDK's key fetch succeeds
and does not mark the worker errored after ~15 s).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.ports import free_port, free_port_pair

REPO = Path(__file__).resolve().parents[2]
WORKER_DIR = REPO / "worker"
START_SERVER = WORKER_DIR / "start_server.sh"
HERE = Path(__file__).resolve().parent
STANDIN = REPO / "bases" / "standin" / "run_standin.py"  # the project's vLLM/SGLang stand-ins
LLAMA_ENGINE = HERE / "llama_engine.py"

if str(WORKER_DIR) not in sys.path:
    sys.path.insert(0, str(WORKER_DIR))  # `app.core` for the unit tests
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SDK_READY = "marking model as loaded"  # the SDK's debug line once benchmark and health passed
STANDIN_MODEL = "standin-model"  # the model the stand-ins serve unless told


# --------------------------------------------------------------------------- ports and processes


class Proc:
    """A child process (own process group) whose stdout+stderr go to a file that tests can wait on."""

    def __init__(self, cmd: list[str], output: Path, env: dict[str, str] | None = None, cwd: Path | None = None):
        self.output = output
        self.cmd = cmd
        self._file = open(output, "ab")  # noqa: SIM115 (closed in stop())
        self.popen = subprocess.Popen(cmd, stdout=self._file, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                      stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def text(self) -> str:
        """Everything the process wrote so far."""
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def wait_for(self, pattern: str, timeout: float = 30.0, *, regex: bool = False) -> str:
        """Wait until the output contains `pattern` (substring, or a regex); return the output."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.text
            if (re.search(pattern, text) if regex else pattern in text):
                return text
            if self.popen.poll() is not None:
                code = self.popen.returncode
                raise AssertionError(f"{self.cmd[-1]} exited {code} before {pattern!r}:\n{text[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} within {timeout} s from {self.cmd[-1]}:\n{text[-4000:]}")
            time.sleep(0.05)

    def wait_exit(self, timeout: float = 20.0) -> int:
        """Wait for the process to exit by itself; return its exit code."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.cmd[-1]} still runs after {timeout} s:\n{self.text[-4000:]}") from None

    def stop(self) -> None:
        """Terminate the process group (kill after 5 s)."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
                self.popen.wait(5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)
        self._file.close()


# --------------------------------------------------------------------------- the report server


class ReportServer:
    """Stands in for the autoscaler at REPORT_ADDR: serves /pubkey/, records every POST.

    While `key_available` is False, /pubkey/ answers 503 (a control plane that is not up yet);
    `pubkey_gets` counts the fetches; setting `pubkey` (a PEM) rotates the key it serves.
    `status_delay` holds the answer to each /worker_status/ POST for that many seconds (recorded at
    once): a slow control plane.
    """

    def __init__(self, pubkey: str, key_available: bool = True):
        self.reports: list[tuple[str, dict[str, Any]]] = []
        self.key_available = key_available
        self.status_delay = 0.0
        self.pubkey_gets = 0
        self.pubkey = pubkey
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                is_key = self.path.rstrip("/") == "/pubkey"
                if is_key:
                    with outer._lock:
                        outer.pubkey_gets += 1
                served = is_key and outer.key_available
                body = outer.pubkey.encode() if served else b"not available"
                self.send_response(200 if served else (503 if is_key else 404))
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    data = json.loads(raw or b"{}")
                except ValueError:
                    data = {"raw": raw.decode(errors="replace")}
                with outer._lock:
                    outer.reports.append((self.path, data))
                if outer.status_delay and self.path.rstrip("/") == "/worker_status":
                    time.sleep(outer.status_delay)
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"{}")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the worker gave up waiting (a held answer, status_delay): nothing to say

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def statuses(self) -> list[dict[str, Any]]:
        """The /worker_status/ reports received so far."""
        with self._lock:
            return [data for path, data in self.reports if path.rstrip("/").endswith("/worker_status")]

    def wait_status(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 30.0) -> dict[str, Any]:
        """Wait for a status report that satisfies `predicate`; return it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for status in self.statuses():
                if predicate(status):
                    return status
            time.sleep(0.1)
        raise AssertionError(f"no matching status report within {timeout} s; got {self.statuses()[-3:]}")

    def wait_loaded(self, timeout: float = 30.0) -> dict[str, Any]:
        """Wait for the report that says the worker is loaded (a load time and a benchmarked max_perf)."""
        return self.wait_status(lambda s: s.get("loadtime", 0) > 0 and s.get("max_perf", 0) > 0, timeout=timeout)

    def outcomes(self) -> dict[int, dict[str, Any]]:
        """Every request outcome posted to /delete_requests/ so far, by request_idx (the last one wins)."""
        with self._lock:
            posted = [data for path, data in self.reports if path.rstrip("/").endswith("/delete_requests")]
        return {item["request_idx"]: item for data in posted for item in data.get("requests") or []
                if isinstance(item, dict) and isinstance(item.get("request_idx"), int)}

    def wait_outcomes(self, wanted: set[int], timeout: float = 20.0) -> dict[int, dict[str, Any]]:
        """Wait until the outcome of every request_idx in `wanted` was posted; return all outcomes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not wanted <= set(self.outcomes()):
            time.sleep(0.1)
        seen = self.outcomes()
        missing = sorted(wanted - set(seen))
        assert not missing, \
            f"no /delete_requests/ outcome for request_idx {missing} within {timeout} s; got {sorted(seen)}"
        return seen

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


# --------------------------------------------------------------------------- signing


# DER prefix of a SHA-256 DigestInfo (RFC 8017 §9.2): what PKCS#1 v1.5 signs before the hash.
_SHA256_INFO = bytes.fromhex("3031300d060960864801650304020105000420")


@dataclass(frozen=True)
class SigningKey:
    """An RSA key pair made by the worker venv's pycryptodome; signs as the platform does.

    The platform signs `json.dumps({"url": url}, indent=4, sort_keys=True)` with RSA PKCS#1 v1.5 over
    SHA-256 and sends it base64-encoded; the SDK checks exactly that (docs/sdk.md, "The signed path"). Signing is
    done here with the private numbers (stdlib only: the host venv has no crypto library).
    """

    pem: str  # the public key, as /pubkey/ serves it
    n: int
    d: int

    def sign(self, url: str) -> str:
        """The base64 signature the platform would send for a request to `url`."""
        message = json.dumps({"url": url}, indent=4, sort_keys=True).encode()
        size = (self.n.bit_length() + 7) // 8
        digest = _SHA256_INFO + hashlib.sha256(message).digest()
        block = b"\x00\x01" + b"\xff" * (size - len(digest) - 3) + b"\x00" + digest
        signature = pow(int.from_bytes(block, "big"), self.d, self.n).to_bytes(size, "big")
        return base64.b64encode(signature).decode()


def probe_facts(worker_python: Path, *args: str, timeout: float = 120) -> Any:
    """Run a probe (`args`: a script of tests/worker/ or `-c` code) on the worker venv's Python with worker/
    on its path, and return the JSON its last line of output holds; the test fails on a non-zero exit."""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(WORKER_DIR), "PYTHONNOUSERSITE": "1",
           **baked_facts("vllm")}  # any engine's: a probe starts no engine
    result = subprocess.run([str(worker_python), *args], capture_output=True, text=True, env=env, timeout=timeout,
                            check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def make_signing_key(worker_python: Path, bits: int = 2048) -> SigningKey:
    """A fresh key pair from the worker venv (pycryptodome, as the SDK uses to verify)."""
    code = (f"import json; from Crypto.PublicKey import RSA; k = RSA.generate({bits}); "
            "print(json.dumps({'pem': k.publickey().export_key().decode(), 'n': k.n, 'd': k.d}))")
    out = subprocess.run([str(worker_python), "-c", code], capture_output=True, text=True, check=True).stdout
    data = json.loads(out)
    return SigningKey(data["pem"], int(data["n"]), int(data["d"]))


# --------------------------------------------------------------------------- launching


def platform_env(port: int, report_url: str) -> dict[str, str]:
    """The offline Vast.ai platform environment (docs/sdk.md, "Environment read at start") for a worker on `port`."""
    return {
        "WORKER_PORT": str(port),
        f"VAST_TCP_PORT_{port}": str(port),
        "CONTAINER_ID": "1",
        "REPORT_ADDR": report_url,
        "PUBLIC_IPADDR": "127.0.0.1",
        "UNSECURED": "true",
        "USE_SSL": "false",
    }


@functools.cache
def kept_while_unread(port: int, data: bytes, seconds: float) -> float | None:
    """Send `data` to the worker on 127.0.0.1:`port` from a socket with the least receive room, read
    nothing, and return how long after the send the worker (any process) still held its end of the
    connection: None when it still did after `seconds`."""
    from tests.controlplane.sockets import held, server_inode

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", port))
        inode = server_inode(sock.getsockname()[1], port)
        assert inode is not None, "the worker's end of the connection is not in /proc/net/tcp"
        sock.sendall(data)
        sent = time.monotonic()
        while time.monotonic() - sent < seconds:
            if not held(inode):
                return time.monotonic() - sent
            time.sleep(0.1)
    return None


def relay_program_path() -> Path:
    """bakery-relay compiled for this host (the program an image build copies in)."""
    from bakery.host.relay import relay_program

    program = relay_program()
    assert program is not None, "bakery-relay is built for x86_64 and aarch64 hosts"
    return program


# The engine's facts an image bakes from images/<engine>.yaml; the worker states none of them.
ENGINE_FACT_VARS = ("MODEL_LOG", "MODEL_LOAD_LOG_MSG", "MODEL_ERROR_LOG_MSGS", "MODEL_INFO_LOG_MSGS",
                    "MODEL_HEALTH_ENDPOINT")


@functools.cache
def baked_facts(backend: str) -> dict[str, str]:
    """What an image of the engine `backend` runs (an alias too) bakes of its facts, encoded as the image
    carries them: a worker outside an image is given them as a launch would be. {} for a backend no spec names."""
    from bakery.recipe.render import baked_env
    from bakery.spec.engine_facts import all_facts
    from bakery.spec.engine_spec import load_engine

    named = [facts.name for facts in all_facts().values() if backend in (facts.backend, *facts.aliases)]
    if not named:
        return {}
    env = baked_env(load_engine(named[0]))
    return {name: env[name] for name in ENGINE_FACT_VARS if name in env}


def worker_env_for(
    backend: str, worker_python: Path, state: Path, port: int, report_url: str, **overrides: str | None
) -> dict[str, str]:
    """A clean environment for start_server.sh: platform vars, tiny benchmark, then `overrides`.

    An override of None removes the variable.
    """
    env = {key: os.environ[key] for key in ("PATH", "HOME", "LANG", "TMPDIR") if key in os.environ}
    env.update(platform_env(port, report_url))
    env.update(baked_facts(backend))
    env.update({
        "BACKEND": backend,
        "WORKER_PYTHON": str(worker_python),
        "WORKER_STATE_DIR": str(state),
        "BAKERY_RUN_DIR": str(state / "run"),  # the ready mark: the test's own, never the host's /run/bakery
        "BENCHMARK_RUNS": "1",
        "BENCHMARK_CONCURRENCY": "1",
        "BENCHMARK_MAX_TOKENS": "8",
        "BAKERY_RELAY_PROGRAM": str(relay_program_path()),  # as an image has it (bakery.host.relay)
    })
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def start_worker(tmp_path: Path, env: dict[str, str], procs: list[Proc], name: str = "worker") -> Proc:
    """Run worker/start_server.sh with `env` (as an image's entry point does: plain sh)."""
    proc = Proc(["sh", str(START_SERVER)], tmp_path / f"{name}.out", env=env, cwd=tmp_path)
    procs.append(proc)
    return proc


def start_standin(engine: str, port: int, log: Path, procs: list[Proc], model: str = STANDIN_MODEL,
                  load_seconds: float = 0.3, **switches: str) -> Proc:
    """Run the project's vLLM/SGLang stand-in (bases/standin) on 127.0.0.1:`port`, output appended to `log`.

    It prints the engine's real log lines and mimics its /health (docs/engines.md, "What each engine
    prints"); it serves `model` and refuses requests naming another one, as vLLM does. `switches` are
    STANDIN_* variables (bases/standin/bakery_standin/core.py: records, step mode, reply length...).
    """
    args = ["vllm", "serve", model] if engine == "vllm" else ["sglang", "--model-path", model]
    env = {**os.environ, "STANDIN_LOAD_SECONDS": str(load_seconds), "STANDIN_WARMUP_SECONDS": str(load_seconds),
           **switches}
    proc = Proc([sys.executable, str(STANDIN), *args, "--host", "127.0.0.1", "--port", str(port)], log, env=env)
    procs.append(proc)
    return proc


def start_llama(llama_python: Path, model: Path, port: int, log: Path, procs: list[Proc]) -> Proc:
    """Run the real llama.cpp server on 127.0.0.1:`port`, its output appended to `log`."""
    proc = Proc([str(llama_python), str(LLAMA_ENGINE), "--model", str(model), "--port", str(port)], log)
    procs.append(proc)
    return proc


# --------------------------------------------------------------------------- the harness


@dataclass(frozen=True)
class Engine:
    """An engine on 127.0.0.1:`port` whose log (the worker's MODEL_LOG) is `log`; `proc` once started."""

    port: int
    log: Path
    proc: Proc | None = None

    @property
    def url(self) -> str:
        """What the worker's MODEL_SERVER_URL points at."""
        return f"http://127.0.0.1:{self.port}"


@dataclass(frozen=True)
class Served:
    """A worker started by a Harness: its port, its process, its report server and engine (if any)."""

    port: int
    worker: Proc
    reports: ReportServer | None
    engine: Engine | None

    @property
    def url(self) -> str:
        """The worker's own URL (what it reports, what the platform signs)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def engine_port(self) -> int:
        assert self.engine is not None, "this worker was started without an engine"
        return self.engine.port


class Harness:
    """The one place a test starts engines, report servers and workers; `close()` stops them all.

    Everything it starts is registered here and stopped on close (in reverse order: workers before
    their engines), report servers are closed and short directories removed, whatever the test did.
    Function-scoped tests get one from the `harness` fixture (conftest.py); a module-scoped fixture
    uses it as a context manager: `with Harness(tmp, worker_python, pubkey) as harness: ...`.
    """

    def __init__(self, tmp: Path, worker_python: Path, pubkey: str) -> None:
        self.tmp = tmp
        self.worker_python = worker_python
        self.pubkey = pubkey
        self.procs: list[Proc] = []
        self._servers: list[ReportServer] = []
        self._dirs: list[Path] = []
        self._reports: ReportServer | None = None

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop every process (last started first), close every report server, remove the short dirs."""
        errors: list[BaseException] = []
        for stop in [proc.stop for proc in reversed(self.procs)] + [server.close for server in self._servers]:
            try:
                stop()
            except Exception as exc:  # noqa: BLE001 (one that fails must not leave the others running)
                errors.append(exc)
        for path in self._dirs:
            shutil.rmtree(path, ignore_errors=True)
        if errors:
            raise errors[0]

    # -- report servers and directories

    def report_server(self, pubkey: str | None = None, key_available: bool = True) -> ReportServer:
        """A new report server serving `pubkey` (default: the session's); closed with the harness."""
        server = ReportServer(self.pubkey if pubkey is None else pubkey, key_available=key_available)
        self._servers.append(server)
        return server

    @property
    def reports(self) -> ReportServer:
        """The test's default report server (made on first use): where workers report unless told."""
        if self._reports is None:
            self._reports = self.report_server()
        return self._reports

    def short_dir(self, prefix: str) -> Path:
        """A short directory under /tmp (a unix socket's path must fit in 108 bytes, tmp_path's may
        not), removed with the harness."""
        path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        self._dirs.append(path)
        return path

    # -- processes

    def start(self, cmd: list[str], output: Path, env: dict[str, str] | None = None) -> Proc:
        """Any process (an entry point, another engine), registered to be stopped with the harness."""
        proc = Proc(cmd, output, env=env)
        self.procs.append(proc)
        return proc

    def slot(self, name: str) -> Engine:
        """A free port and a log path for an engine not started yet (the worker may come first)."""
        return Engine(free_port(), self.tmp / f"{name}.log")

    def standin(self, engine: str, at: Engine | None = None, load_seconds: float = 0.3,
                **switches: str) -> Engine:
        """The vLLM or SGLang stand-in (at `at`, default a fresh slot) with STANDIN_* `switches`."""
        slot = at or self.slot(engine)
        proc = start_standin(engine, slot.port, slot.log, self.procs, load_seconds=load_seconds, **switches)
        return Engine(slot.port, slot.log, proc)

    def llama(self, llama_python: Path, model: Path, at: Engine | None = None) -> Engine:
        """The real llama.cpp server on `model` (at `at`, default a fresh slot)."""
        slot = at or self.slot("llama")
        return Engine(slot.port, slot.log, start_llama(llama_python, model, slot.port, slot.log, self.procs))

    def engine(self, cmd: list[str], at: Engine, output: Path | None = None) -> Engine:
        """An engine run by `cmd` (which must serve `at`'s port and write its log); output to `at`'s log
        unless `output` is given."""
        return Engine(at.port, at.log, self.start(cmd, output or at.log))

    def worker(self, backend: str, engine: Engine | None = None, reports: ReportServer | str | None = None, *,
               port: int | None = None, name: str = "worker", python: Path | None = None,
               **env: str | None) -> Served:
        """Start worker/start_server.sh for `backend` (not waiting for anything).

        MODEL_LOG and MODEL_SERVER_URL come from `engine`; it reports to `reports` (a server, or a bare
        URL for a worker that must never reach one; default the harness's server); `env` overrides
        worker_env_for's environment (None removes a variable).
        """
        port = free_port_pair() if port is None else port
        server = self.reports if reports is None else reports
        url = server if isinstance(server, str) else server.url
        settings: dict[str, str | None] = {}
        if engine is not None:
            settings.update(MODEL_LOG=str(engine.log), MODEL_SERVER_URL=engine.url)
        settings.update(env)
        full = worker_env_for(backend, python or self.worker_python, self.tmp / "state", port, url, **settings)
        proc = start_worker(self.tmp, full, self.procs, name=name)
        return Served(port, proc, None if isinstance(server, str) else server, engine)

    def serve(self, backend: str, engine: Engine | None = None, reports: ReportServer | None = None, *,
              timeout: float = 90, **env: str | None) -> Served:
        """`worker(...)`, then wait until the SDK marked the model loaded and reported it loaded."""
        served = self.worker(backend, engine, reports, **env)
        served.worker.wait_for(SDK_READY, timeout=timeout)
        assert served.reports is not None
        served.reports.wait_loaded(timeout=60)
        return served


def post_enveloped(port: int, route: str, payload: dict[str, Any], reqnum: int = 1,
                   timeout: float = 120.0, auth: dict[str, Any] | None = None) -> tuple[int, bytes, str]:
    """POST `payload` in the SDK's auth_data/payload envelope to the worker; (status, body, type).

    `auth` overrides fields of auth_data; a None value removes the field.
    """
    import urllib.error
    import urllib.request

    fields = {"cost": "8", "endpoint": "test", "reqnum": reqnum, "request_idx": reqnum, "signature": "", "url": route}
    fields.update(auth or {})
    sent = {key: value for key, value in fields.items() if value is not None}
    data = json.dumps({"auth_data": sent, "payload": payload}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{route}", data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (loopback http)
            return response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers.get("Content-Type", "")


# --------------------------------------------------------------------------- the guard engine
# tests/worker/guard_engine.py: an engine whose answers and health a test steers; the guard, key,
# admission, loop-stall and log tests run a secured worker in front of it and talk plain HTTP to it.
GUARD_ENGINE = HERE / "guard_engine.py"


def request(port: int, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
            method: str = "POST", timeout: float = 30.0) -> tuple[int, bytes, dict[str, str]]:
    """One HTTP request to 127.0.0.1:`port`; (status, body, headers)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read(), {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()


def send(port: int, path: str, envelope: Any, **kw: Any) -> tuple[int, Any, dict[str, str]]:
    """POST `envelope` as JSON; the body comes back decoded when it is JSON."""
    status, body, headers = request(port, path, json.dumps(envelope).encode(), **kw)
    with contextlib.suppress(ValueError):
        return status, json.loads(body), headers
    return status, body, headers


def json_error(result: tuple[int, Any, dict[str, str]], status: int) -> str:
    """Assert `result` is `status` with a JSON {"error": ...} body; return the error."""
    got, body, headers = result
    assert got == status, (got, body)
    assert headers.get("content-type", "").startswith("application/json"), headers
    assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"], body
    return body["error"]


def start_engine(harness: Harness, load_seconds: float = 0.0) -> Engine:
    """The guard engine on a free loopback port; it writes its own log (the worker's MODEL_LOG)."""
    slot = harness.slot("engine")
    return harness.engine([sys.executable, str(GUARD_ENGINE), "--port", str(slot.port), "--log", str(slot.log),
                           "--load-seconds", str(load_seconds)], slot, output=harness.tmp / "engine.out")


def secured(harness: Harness, engine: Engine, reports: ReportServer | None = None, **extra: str | None) -> Served:
    """A worker with the platform's environment without UNSECURED, in front of `engine`."""
    return harness.worker("llama", engine, reports, UNSECURED=None, **extra)
