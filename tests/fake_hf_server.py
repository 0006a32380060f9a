"""A small stand-in for the Hugging Face Hub's file endpoints, on 127.0.0.1.

huggingface-hub's hf_hub_download makes a HEAD to ``/{repo}/resolve/{revision}/{filename}``
(reading ETag / X-Linked-Etag, X-Linked-Size, X-Repo-Commit, Content-Length) and then a GET of
the same URL, with ``Range: bytes=N-`` when it resumes after a dropped connection. It makes no
``/api/models`` call for a single file.

A Hub pull (`models pull hf.co/USER/REPO:QUANT`) first lists the repo through
``/api/models/{repo}/revision/{rev}?blobs=true`` (HfApi.model_info with files_metadata), and
`models search` asks ``/api/models?search=...&filter=gguf``. Gated repos answer the listing but
refuse their files (401, X-Error-Code GatedRepo); private ones answer nothing (401, RepoNotFound).
Search and pull read a GGUF's header first with closed ranges (``Range: bytes=A-B``, answered 206
with that slice, as the Hub and its CDN do); ``ignore_range`` makes the server answer 200 with the
whole file instead. Faults are injected per test through attributes.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_PATH_RE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_INFO_RE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+?)(?:/revision/(?P<rev>[^/]+))?$")


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    served: int = 0  # body bytes of a file the client took (GETs of /resolve/ only)


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
    gated: set[str] = field(default_factory=set)  # repos whose files need an accepted licence
    private: set[str] = field(default_factory=set)  # repos that answer as if they did not exist
    downloads: dict[str, int] = field(default_factory=dict)  # repo -> download count, for search order
    ignore_range: bool = False  # answer 200 with the whole file whatever Range asks
    range_cap: int | None = None  # answer a closed range with at most this many bytes (a 206 saying so)
    # Answer file requests (not header reads) with a 302 to this origin, as the Hub sends LFS files to
    # its CDN: another FakeHub holding the same files stands in for the CDN.
    redirect_files_to: str | None = None
    unsized: set[str] = field(default_factory=set)  # file names whose HEAD gives no size at all
    api_body: bytes | None = None  # answer every API call 200 with this (a captive portal, another API)
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
        """The file downloads (GETs of /resolve/), not the API calls nor the header reads."""
        return [r for r in self.requests if r.method == "GET" and "/resolve/" in r.path and not _closed_range(r)]

    def header_reads(self) -> list[Request]:
        """GETs of /resolve/ asking for a closed byte range (a GGUF header read ahead of a download)."""
        return [r for r in self.requests if r.method == "GET" and "/resolve/" in r.path and _closed_range(r)]

    def api_calls(self) -> list[Request]:
        return [r for r in self.requests if r.path.startswith("/api/")]

    def repos(self) -> list[str]:
        return sorted({r for r, _ in self.files})

    # ---------------------------------------------------------------- the API
    def _sibling(self, repo: str, filename: str) -> dict:
        content = self.files[(repo, filename)]
        sha = self.etag_override.get(filename, hashlib.sha256(content).hexdigest())
        size = self.size_override.get(filename, len(content))
        return {"rfilename": filename, "size": size, "blobId": hashlib.sha1(content).hexdigest(),
                "lfs": {"size": size, "sha256": sha, "pointerSize": 134}}

    def _info(self, repo: str) -> dict:
        return {"id": repo, "modelId": repo, "sha": COMMIT, "private": repo in self.private,
                "gated": "manual" if repo in self.gated else False, "downloads": self.downloads.get(repo, 0),
                "tags": ["gguf"], "siblings": [self._sibling(repo, f) for r, f in sorted(self.files) if r == repo]}

    def _api(self, h: BaseHTTPRequestHandler) -> None:
        if self.api_body is not None:
            h.send_response(200)
            h.send_header("Content-Type", "application/json" if self.api_body[:1] in b"[{" else "text/html")
            h.send_header("Content-Length", str(len(self.api_body)))
            h.end_headers()
            h.wfile.write(self.api_body)
            return
        url = urlsplit(h.path)
        if url.path == "/api/models":
            query = parse_qs(url.query)
            words = " ".join(query.get("search", [""])).lower().split()
            found = [r for r in self.repos() if r not in self.private and all(w in r.lower() for w in words)]
            found.sort(key=lambda r: -self.downloads.get(r, 0))
            limit = int(query.get("limit", ["1000"])[0])
            items = [{k: v for k, v in self._info(r).items() if k != "siblings"} for r in found[:limit]]
            return self._json(h, items)
        m = _INFO_RE.match(url.path)
        if not m or unquote(m["repo"]) not in self.repos() or unquote(m["repo"]) in self.private:
            return self._error(h, 401, "RepoNotFound")
        if m["rev"] not in (None, "main", COMMIT):
            return self._error(h, 404, "RevisionNotFound")
        self._json(h, self._info(unquote(m["repo"])))

    def _json(self, h: BaseHTTPRequestHandler, obj: object) -> None:
        body = json.dumps(obj).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)

    # ---------------------------------------------------------------- responses
    def _serve(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        request = Request(h.command, h.path, {k.lower(): v for k, v in h.headers.items()})
        self.requests.append(request)
        if h.path.startswith("/api/"):
            return self._api(h)
        m = _PATH_RE.match(h.path.split("?", 1)[0])
        if not m:
            return self._error(h, 404, "RepoNotFound")
        repo, filename = unquote(m["repo"]), unquote(m["file"])
        if not any(r == repo for r, _ in self.files) or repo in self.private:
            return self._error(h, 401 if repo in self.private else 404, "RepoNotFound")
        if repo in self.gated and "authorization" not in request.headers:
            return self._error(h, 401, "GatedRepo")
        content = self.files.get((repo, filename))
        if content is None:
            return self._error(h, 404, "EntryNotFound")
        sha = self.etag_override.get(filename) or hashlib.sha256(content).hexdigest()  # a big file: claim one
        size = len(content)
        if self.redirect_files_to is not None and not _closed_range(request):
            h.send_response(302)
            h.send_header("Location", self.redirect_files_to + h.path)
            h.send_header("X-Linked-Etag", f'"{sha}"')
            h.send_header("X-Linked-Size", str(self.size_override.get(filename, size)))
            h.send_header("X-Repo-Commit", COMMIT)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        start, end = 0, size - 1
        rng = h.headers.get("Range")
        ranged = False
        if body and rng and not self.ignore_range:
            mm = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if mm and int(mm.group(1)) >= size:
                return self._error(h, 416, "RangeNotSatisfiable")
            if mm:
                start = int(mm.group(1))
                end = min(size - 1, int(mm.group(2))) if mm.group(2) else size - 1
                ranged = start > 0 or bool(mm.group(2))
                if ranged and self.range_cap is not None:
                    end = min(end, start + self.range_cap - 1)
        h.send_response(206 if ranged else 200)
        h.send_header("ETag", f'"{sha}"')
        h.send_header("X-Linked-Etag", f'"{sha}"')
        if not body and filename in self.unsized:
            h.send_header("X-Repo-Commit", COMMIT)
            h.end_headers()
            return
        h.send_header("X-Linked-Size", str(self.size_override.get(filename, size)))
        h.send_header("X-Repo-Commit", COMMIT)
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Type", "application/octet-stream")
        if ranged:
            h.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        h.send_header("Content-Length", str(end + 1 - start))
        h.end_headers()
        if not body:
            return
        payload = content[start:end + 1]
        if _closed_range(request) and not self.ignore_range:  # a header read: not a download
            h.wfile.write(payload)
            request.served = len(payload)
            return
        self._gets += 1
        first = self._gets == 1
        if first and self.cut_first_get_after is not None:
            h.wfile.write(payload[: self.cut_first_get_after])
            h.wfile.flush()
            request.served = min(self.cut_first_get_after, len(payload))
            h.close_connection = True
            h.connection.shutdown(2)  # drop mid-body: the client sees a short read
            return
        if first and self.stall_first_get_after is not None:
            h.wfile.write(payload[: self.stall_first_get_after])
            h.wfile.flush()
            request.served = min(self.stall_first_get_after, len(payload))
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
            request.served += min(1 << 20, len(payload) - i)

    def served(self, requests: list[Request]) -> int:
        return sum(r.served for r in requests)

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


def _closed_range(r: Request) -> bool:
    return re.fullmatch(r"bytes=\d+-\d+", r.headers.get("range", "").strip()) is not None
