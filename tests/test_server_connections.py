"""Connections a client cannot hold open for nothing: the head's deadline, the body's, and the cap.

Each test runs a real uvicorn with `serve`'s protocol (localspec.server.protocol_for) on loopback
and talks raw sockets to it, since the attacks are below what an HTTP client library will send.
Before these, every such connection stayed open for good (a slowloris held 52 of 52 for 40 s).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import pytest

from localspec.server import ServerSettings, create_app, protocol_for
from localspec.server.connections import ConnectionLimits, default_max_connections, guarded_protocol
from localspec.server.guards import BodyLimit
from tests.server_harness import ServerThread, request

KEY = "s3cret-key"
WAIT = 60.0  # how long a test waits for the server to act: a bound on a hang, never a speed check


@pytest.fixture(scope="module")
def never_loading():
    never = threading.Event()

    def blocked(settings):
        never.wait()
        raise RuntimeError("test over")

    yield blocked
    never.set()


def _server(load, **settings) -> ServerThread:
    s = ServerSettings(**settings)
    return ServerThread(create_app(s, load=load), protocol=protocol_for(s))


def _connect(srv: ServerThread, data: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=WAIT)
    if data:
        sock.sendall(data)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    """All the server sends until it closes (a socket timeout here means it never closed)."""
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    return got


def _status_and_error(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)["error"]


def _answers(srv: ServerThread) -> bool:
    """The server still answers: /health says it is loading (its models never finish, by design)."""
    return request(srv.base_url, "GET", "/health", timeout=WAIT).json()["status"] == "loading"


HEAD_START = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"


def test_a_head_that_never_completes_is_answered_408_and_closed(never_loading):
    with _server(never_loading, request_timeout_s=0.5) as srv:
        sock = _connect(srv, HEAD_START)  # no blank line: the head never ends
        status, error = _status_and_error(_read_until_closed(sock))
        assert status == 408 and error["code"] == "request_timeout"
        assert "request_timeout_s" in error["message"]  # the fix, named
        assert _answers(srv)


def test_a_connection_that_sends_nothing_is_closed_quietly(never_loading):
    with _server(never_loading, request_timeout_s=0.5) as srv:
        assert _read_until_closed(_connect(srv)) == b""


def test_a_body_that_stalls_is_answered_408_and_the_connection_closes(never_loading):
    with _server(never_loading, request_timeout_s=0.5) as srv:
        sock = _connect(srv, HEAD_START + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":")
        raw = _read_until_closed(sock)
        status, error = _status_and_error(raw)
        assert status == 408 and error["code"] == "request_timeout" and "body" in error["message"]
        assert b"connection: close" in raw.split(b"\r\n\r\n")[0].lower()


def test_a_refused_request_cannot_trickle_its_body_forever(never_loading):
    """A 401 is sent without reading the body; h11 would then drain the rest for as long as it came."""
    s = ServerSettings(api_key=KEY, request_timeout_s=0.5)
    protocol = guarded_protocol(ConnectionLimits(request_timeout_s=0.5, max_connections=64, body_grace_s=0.5))
    with ServerThread(create_app(s, load=never_loading), protocol=protocol) as srv:
        sock = _connect(srv, HEAD_START + b"Content-Length: 1000000\r\n\r\n{")
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 401")
        try:
            while True:  # one byte at a time, as a slowloris would, until the server closes
                sock.sendall(b" ")
                if sock.recv(1) == b"":
                    break
        except (ConnectionResetError, BrokenPipeError):
            pass  # closed while we were sending: also closed


def test_connections_beyond_the_cap_get_503_and_the_server_recovers(never_loading):
    with _server(never_loading, max_connections=8) as srv:
        held = [_connect(srv) for _ in range(8)]
        extra = _connect(srv)
        status, error = _status_and_error(_read_until_closed(extra))
        assert status == 503 and error["code"] == "too_many_connections" and "max_connections" in error["message"]
        for sock in held:
            sock.close()
        assert _answers(srv)


def test_the_deadlines_never_cut_a_response_longer_than_them():
    """A head and body sent at once, then a streamed answer lasting several deadlines: all of it arrives."""
    chunks = 40

    async def streaming_app(scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for i in range(chunks):
            await asyncio.sleep(0.05)  # 2 s in all: four times the deadline below
            await send({"type": "http.response.body", "body": b"%d\n" % i, "more_body": True})
        await send({"type": "http.response.body", "body": body})

    app = BodyLimit(streaming_app, limit=1 << 20, timeout_s=0.5)
    protocol = guarded_protocol(ConnectionLimits(request_timeout_s=0.5, max_connections=64, body_grace_s=0.1))
    with ServerThread(app, protocol=protocol) as srv:
        sock = _connect(srv, b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 4\r\nConnection: close\r\n\r\nDONE")
        raw = _read_until_closed(sock)
    assert raw.startswith(b"HTTP/1.1 200") and b"\r\n39\n\r\n" in raw and raw.endswith(b"DONE\r\n0\r\n\r\n")


def test_the_settings_reach_serve_and_are_bounded(monkeypatch, capsys):
    import localspec.server as server
    from localspec.cli import main

    ran = {}

    class Recorder:  # stands in for uvicorn's server: what config would `serve` run?
        started = True

        def __init__(self, config, settings, **shutdown) -> None:
            ran["config"] = config

        def run(self) -> None:
            ran["config"].load()

        def withdraw(self) -> None:
            pass

    monkeypatch.setattr(server, "AnnouncingServer", Recorder)
    monkeypatch.setenv("LOCALSPEC_SERVER__REQUEST_TIMEOUT_S", "7")
    monkeypatch.setenv("LOCALSPEC_SERVER__MAX_CONNECTIONS", "9")
    assert main(["serve", "--no-pull", "--port", "0"]) == 0
    limits = ran["config"].http_protocol_class.limits
    assert (limits.request_timeout_s, limits.max_connections) == (7, 9)

    monkeypatch.setenv("LOCALSPEC_SERVER__REQUEST_TIMEOUT_S", "0")
    assert main(["serve", "--no-pull"]) == 1  # a config error: one line naming the variable
    assert "request_timeout_s" in capsys.readouterr().err
    with pytest.raises(ValueError):
        ServerSettings(max_connections=2)
    assert 8 <= default_max_connections() <= 512
