"""A small stand-in for the Hugging Face Hub's file endpoints, on 127.0.0.1.

huggingface-hub's hf_hub_download makes a HEAD to ``/{repo}/resolve/{revision}/{filename}``
(reading ETag / X-Linked-Etag, X-Linked-Size, X-Repo-Commit, Content-Length) and then a GET of
the same URL, with ``Range: bytes=N-`` when it resumes after a dropped connection. It makes no
``/api/models`` call for a single file. Faults are injected per test through attributes.
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_PATH_RE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class FakeHub:
    files: dict[tuple[str, str], bytes] = field(default_factory=dict)  # (repo, filename) -> content
    etag_override: dict[str, str] = field(default_factory=dict)  # filename -> sha256 to claim
    size_override: dict[str, int] = field(default_factory=dict)  # filename -> size to claim (X-Linked-Size)
    sent: int = 0  # body bytes the client accepted, over all GETs
    cut_first_get_after: int | None = None  # close the first GET after this many body bytes
    stall_first_get_after: int | None = None  # send this many bytes, then wait for `release`
    requests: list[Request] = field(default_factory=list)
    stalled: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    _gets: int = 0

    def add(self, repo: str, filename: str, content: bytes) -> str:
        self.files[(repo, filename)] = content
        return hashlib.sha256(content).hexdigest()

    # ---------------------------------------------------------------- server lifecycle
    def start(self) -> FakeHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # keep pytest output clean
                pass

            def do_HEAD(self) -> None:
                hub._serve(self, body=False)

            def do_GET(self) -> None:
                hub._serve(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def gets(self) -> list[Request]:
        return [r for r in self.requests if r.method == "GET"]

    # ---------------------------------------------------------------- responses
    def _serve(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        self.requests.append(Request(h.command, h.path, {k.lower(): v for k, v in h.headers.items()}))
        m = _PATH_RE.match(h.path.split("?", 1)[0])
        if not m:
            return self._error(h, 404, "RepoNotFound")
        repo, filename = unquote(m["repo"]), unquote(m["file"])
        if not any(r == repo for r, _ in self.files):
            return self._error(h, 404, "RepoNotFound")
        content = self.files.get((repo, filename))
        if content is None:
            return self._error(h, 404, "EntryNotFound")
        sha = self.etag_override.get(filename, hashlib.sha256(content).hexdigest())
        size = len(content)
        start = 0
        rng = h.headers.get("Range")
        if body and rng:
            mm = re.match(r"bytes=(\d+)-", rng)
            start = int(mm.group(1)) if mm else 0
        h.send_response(206 if start else 200)
        h.send_header("ETag", f'"{sha}"')
        h.send_header("X-Linked-Etag", f'"{sha}"')
        h.send_header("X-Linked-Size", str(self.size_override.get(filename, size)))
        h.send_header("X-Repo-Commit", COMMIT)
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Type", "application/octet-stream")
        if start:
            h.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        h.send_header("Content-Length", str(size - start))
        h.end_headers()
        if not body:
            return
        self._gets += 1
        payload = content[start:]
        first = self._gets == 1
        if first and self.cut_first_get_after is not None:
            h.wfile.write(payload[: self.cut_first_get_after])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(2)  # drop mid-body: the client sees a short read
            return
        if first and self.stall_first_get_after is not None:
            h.wfile.write(payload[: self.stall_first_get_after])
            h.wfile.flush()
            self.stalled.set()
            self.release.wait(30)
            h.close_connection = True
            return
        for i in range(0, len(payload), 1 << 20):  # in pieces, counting what the client takes
            try:
                h.wfile.write(payload[i:i + (1 << 20)])
            except OSError:  # the client hung up
                h.close_connection = True
                return
            self.sent += min(1 << 20, len(payload) - i)

    def _error(self, h: BaseHTTPRequestHandler, status: int, code: str) -> None:
        body = f'{{"error": "{code}"}}'.encode()
        h.send_response(status)
        h.send_header("X-Error-Code", code)
        h.send_header("X-Repo-Commit", COMMIT) if code == "EntryNotFound" else None
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)
