"""A real uvicorn server on 127.0.0.1 (a free port) in a background thread, for the endpoint tests."""

from __future__ import annotations

import http.client
import json
import threading
import time

import uvicorn


class ServerThread:
    """`announce`: the settings `localspec serve` would announce in serve.json (its AnnouncingServer).
    `server`: a server built already (`localspec.server.make_server`, serve's own), run as it is."""

    def __init__(self, app, announce=None, protocol=None, *, server: uvicorn.Server | None = None) -> None:
        self.app = app  # the tests read the app's state through the server they started
        # protocol: serve's (localspec.server.protocol_for), where a test is about connections
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on",
                                **({"http": protocol} if protocol is not None else {}))
        if server is not None:
            self.server = server
        elif announce is not None:
            from localspec.server.announce import AnnouncingServer

            self.server = AnnouncingServer(config, announce)
        else:
            self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, name="test-uvicorn", daemon=True)

    def __enter__(self) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + 60
        # uvicorn marks itself started inside startup(), before an AnnouncingServer has written
        # serve.json: wait for the announcement too (CI saw a test read the file before it existed).
        while not self.server.started or getattr(self.server, "announced", True) is None:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    @property
    def port(self) -> int:
        return self.server.servers[0].sockets[0].getsockname()[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=60)


def wait_until(predicate, timeout: float = 120.0, interval: float = 0.05) -> bool:
    """Poll for a state change (not a speed check): True once `predicate()` holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


class Reply:
    def __init__(self, status: int, headers, body: bytes) -> None:
        self.status_code = status
        self.headers = headers
        self.text = body.decode("utf-8", errors="replace")

    def json(self):
        return json.loads(self.text)


def request(
    base_url: str, method: str, path: str, key: str | None = None, json_body=None, timeout: float = 300,
    headers: dict[str, str] | None = None, json_text: str | None = None,
) -> Reply:
    """One plain HTTP request with the standard library (no client library between us and the wire).
    `json_text`: a body already written, for JSON that json.dumps cannot write (nested past its recursion)."""
    host, port = base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    headers = dict(headers or {})
    if key:
        headers["Authorization"] = f"Bearer {key}"
    body = None
    if json_body is not None or json_text is not None:
        body = (json.dumps(json_body) if json_text is None else json_text).encode()
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return Reply(resp.status, resp.headers, resp.read())
    finally:
        conn.close()


class OpenStream:
    """A streaming POST whose socket the test closes mid-stream, as a client that goes away does."""

    def __init__(self, base_url: str, path: str, key: str, json_body, timeout: float = 300) -> None:
        host, port = base_url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
        self.conn.request("POST", path, body=json.dumps(json_body).encode(),
                          headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        self.resp = self.conn.getresponse()
        self.status_code = self.resp.status

    def lines(self):
        while True:
            line = self.resp.readline()
            if not line:
                return
            yield line.decode().rstrip("\n")

    def close(self) -> None:
        self.conn.sock and self.conn.sock.close()
        self.conn.close()


def refuse_after(state, monkeypatch, admitted: int) -> list:
    """Admission that lets `admitted` submissions through and answers the next with a 429 (a full
    queue), as a burst meets it part-way through a request of several jobs: the jobs it admitted, to
    check what became of them."""
    from localspec.server.errors import APIError

    submit, submitted = state.submit, []

    async def refusing(*args, **kwargs):
        if len(submitted) == admitted:
            raise APIError(429, "queue full", "queue_full")
        job = await submit(*args, **kwargs)
        submitted.append(job)
        return job

    monkeypatch.setattr(state, "submit", refusing)
    return submitted
