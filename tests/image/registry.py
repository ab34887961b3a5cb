"""A throwaway OCI distribution registry on 127.0.0.1, just enough for `docker push` (tests only).

No registry image can be pulled here, and Docker treats 127.0.0.0/8 as an insecure (plain HTTP)
registry by default, so the engine pushes to this one as it would to any other. It keeps blobs and
manifests in memory and records every manifest PUT, so a test can read back exactly what was
published: which manifest digest, and which config (= image id) it holds.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

_BLOB = re.compile(r"^/v2/(?P<name>.+)/blobs/(?P<digest>sha256:[0-9a-f]{64})$")
_UPLOADS = re.compile(r"^/v2/(?P<name>.+)/blobs/uploads/(?P<id>[0-9a-f-]*)$")
_MANIFEST = re.compile(r"^/v2/(?P<name>.+)/manifests/(?P<ref>[^/]+)$")


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Registry:
    """Start with `with Registry() as reg:`; `reg.host` is `127.0.0.1:<port>`."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[tuple[str, str], tuple[str, bytes]] = {}  # (name, tag or digest) -> (type, body)
        self.pushed: list[dict] = []  # one entry per manifest PUT: name, ref, digest, config
        self.uploads: dict[str, bytearray] = {}
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Registry:
        self.thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def manifest(self, name: str, ref: str) -> dict:
        """The manifest stored under `name` at tag or digest `ref`, parsed."""
        return json.loads(self.manifests[(name, ref)][1])

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args) -> None:  # quiet
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    data = bytearray()
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            self.rfile.readline()
                            return bytes(data)
                        data += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
                self.send_response(code)
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_GET(self) -> None:
                path = urlsplit(self.path).path
                if path in ("/v2/", "/v2"):
                    return self._send(200, b"{}", {"Content-Type": "application/json"})
                if m := _BLOB.match(path):
                    blob = registry.blobs.get(m["digest"])
                    return self._send(200, blob) if blob is not None else self._send(404)
                if m := _MANIFEST.match(path):
                    stored = registry.manifests.get((m["name"], m["ref"]))
                    if stored is None:
                        return self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
                    media, body = stored
                    return self._send(200, body, {"Content-Type": media, "Docker-Content-Digest": sha256(body)})
                return self._send(404)

            do_HEAD = do_GET

            def do_POST(self) -> None:
                url = urlsplit(self.path)
                m = _UPLOADS.match(url.path)
                if not m:
                    return self._send(404)
                self._body()
                query = parse_qs(url.query)
                if "mount" in query and query["mount"][0] in registry.blobs:
                    digest = query["mount"][0]
                    return self._send(201, headers={"Location": f"/v2/{m['name']}/blobs/{digest}",
                                                    "Docker-Content-Digest": digest})
                upload = str(uuid.uuid4())
                registry.uploads[upload] = bytearray()
                self._send(202, headers={"Location": f"/v2/{m['name']}/blobs/uploads/{upload}",
                                         "Docker-Upload-UUID": upload, "Range": "0-0"})

            def do_PATCH(self) -> None:
                m = _UPLOADS.match(urlsplit(self.path).path)
                if not m or m["id"] not in registry.uploads:
                    return self._send(404)
                data = registry.uploads[m["id"]]
                data += self._body()
                self._send(202, headers={"Location": f"/v2/{m['name']}/blobs/uploads/{m['id']}",
                                         "Docker-Upload-UUID": m["id"], "Range": f"0-{max(len(data) - 1, 0)}"})

            def do_PUT(self) -> None:
                url = urlsplit(self.path)
                body = self._body()
                if (m := _UPLOADS.match(url.path)) and m["id"] in registry.uploads:
                    data = bytes(registry.uploads.pop(m["id"]) + body)
                    digest = parse_qs(url.query).get("digest", [""])[0]
                    if sha256(data) != digest:
                        return self._send(400, b'{"errors":[{"code":"DIGEST_INVALID"}]}')
                    registry.blobs[digest] = data
                    return self._send(201, headers={"Location": f"/v2/{m['name']}/blobs/{digest}",
                                                    "Docker-Content-Digest": digest})
                if m := _MANIFEST.match(url.path):
                    digest = sha256(body)
                    media = self.headers.get("Content-Type", "application/vnd.docker.distribution.manifest.v2+json")
                    with registry.lock:
                        registry.manifests[(m["name"], m["ref"])] = (media, body)
                        registry.manifests[(m["name"], digest)] = (media, body)
                        config = (json.loads(body).get("config") or {}).get("digest")
                        registry.pushed.append({"name": m["name"], "ref": m["ref"], "digest": digest,
                                                "config": config})
                    return self._send(201, headers={"Location": f"/v2/{m['name']}/manifests/{digest}",
                                                    "Docker-Content-Digest": digest})
                return self._send(404)

        return Handler
