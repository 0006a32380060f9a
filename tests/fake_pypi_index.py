"""A small PEP 503 package index on 127.0.0.1 that pip can download from, at a throttled rate.

`/simple/<project>/` lists the project's wheels with their sha256; `/files/<wheel>` serves the
bytes in small pieces with a pause between them, so a download lasts long enough for progress.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class FakeIndex:
    wheels: dict[str, Path] = field(default_factory=dict)  # file name -> path
    bytes_per_second: int = 2 << 20
    served: list[str] = field(default_factory=list)  # file names, in the order they were downloaded
    requests: int = 0
    login_required: bool = False  # answer everything 401 with a Basic challenge, as a private index does

    def add(self, wheel: Path) -> None:
        self.wheels[wheel.name] = wheel

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/simple/"

    def _project_page(self, project: str) -> bytes | None:
        links = []
        for name, path in sorted(self.wheels.items()):
            if _normalise(name.split("-")[0]) == project:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                links.append(f'<a href="/files/{name}#sha256={digest}">{name}</a><br>')
        if not links:
            return None
        return ("<!DOCTYPE html><html><body>" + "".join(links) + "</body></html>").encode()

    def _send_file(self, handler: BaseHTTPRequestHandler, name: str) -> None:
        data = self.wheels[name].read_bytes()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/octet-stream")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        piece = max(1, self.bytes_per_second // 20)
        for start in range(0, len(data), piece):
            handler.wfile.write(data[start:start + piece])
            handler.wfile.flush()
            time.sleep(0.05)  # the throttle: 20 pieces a second
        self.served.append(name)

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        self.requests += 1
        if self.login_required:
            handler.send_response(401)
            handler.send_header("WWW-Authenticate", 'Basic realm="models"')
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        path = handler.path.split("?")[0]
        if path.startswith("/simple/"):
            page = self._project_page(_normalise(path.removeprefix("/simple/").strip("/")))
            if page is not None:
                handler.send_response(200)
                handler.send_header("Content-Type", "text/html")
                handler.send_header("Content-Length", str(len(page)))
                handler.end_headers()
                handler.wfile.write(page)
                return
        elif path.startswith("/files/") and path.removeprefix("/files/") in self.wheels:
            self._send_file(handler, path.removeprefix("/files/"))
            return
        handler.send_error(404)

    def start(self) -> FakeIndex:
        index = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                index.handle(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
