"""An attached face reads a server it does not control: a reply that breaks the rules ends in one line.

A small hostile OpenAI-style server on loopback, driven through `RemoteGeneration` with the official
`openai` client, as `generate` and `edit` attach (found by field-testing attach mode).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from localspec.attach.remote import RemoteGeneration, openai_client
from localspec.engine.chat import ChatMessage
from localspec.engine.config import GenerationRequest
from localspec.engine.events import Done, Token


def _event(content: object = None, usage: object = None, finish: str | None = None) -> bytes:
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
             "choices": [] if usage is not None else [{"index": 0, "delta": {"content": content},
                                                       "finish_reason": finish}]}
    if usage is not None:
        chunk["usage"] = usage
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


MODES = {
    "endless": None,  # 64 KB chunks until the client goes away
    "number_content": [_event(5), _event(["a"]), _event("ok", finish="stop")],
    "bad_usage": [_event("ok", finish="stop"),
                  _event(usage={"prompt_tokens": -5, "completion_tokens": "xyz", "total_tokens": 1})],
    "not_json": [b"data: {not json\n\n"],
}


class _Hostile(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        mode = self.server.mode  # type: ignore[attr-defined]
        if mode == "error_as_200":
            body = json.dumps({"error": {"message": "model exploded"}}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        try:
            for event in _events(mode):
                self.wfile.write(event)
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass


def _events(mode: str) -> Iterator[bytes]:
    if MODES[mode] is None:
        while True:
            yield _event("x" * 65536)
    yield from MODES[mode] or []
    yield b"data: [DONE]\n\n"


@pytest.fixture
def hostile():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _reply(server, mode: str) -> tuple[list[Token], Done]:
    server.mode = mode
    client = openai_client(f"http://127.0.0.1:{server.server_address[1]}/v1", timeout_s=30)
    request = GenerationRequest(messages=[ChatMessage(role="user", content="hi")], max_tokens=8)
    events = list(RemoteGeneration(client, "m", request))
    tokens, done = [e for e in events if isinstance(e, Token)], events[-1]
    assert isinstance(done, Done)
    return tokens, done


def test_a_server_that_ignores_max_tokens_is_stopped_at_a_bound(hostile):
    """It streamed 64 KB chunks forever and the client's memory grew 100 MB/s."""
    tokens, done = _reply(hostile, "endless")
    assert done.finish_reason == "error" and "for max_tokens=8" in (done.error or "")
    assert sum(len(t.text) for t in tokens) <= 65536


def test_content_and_usage_of_the_wrong_type_are_left_out(hostile):
    """A number or a list as content crashed the face ("".join), and "xyz" as a count its stats line."""
    tokens, done = _reply(hostile, "number_content")
    assert [t.text for t in tokens] == ["ok"] and done.finish_reason == "stop" and done.text == "ok"
    _, done = _reply(hostile, "bad_usage")
    assert done.finish_reason == "stop" and done.stats.completion_tokens == 1 and done.stats.prompt_tokens == 0


def test_a_json_error_with_status_200_is_an_error_quoting_the_server(hostile):
    """It was an empty answer with finish 'stop', the server's message lost."""
    _, done = _reply(hostile, "error_as_200")
    assert done.finish_reason == "error" and "model exploded" in (done.error or ""), done.error


def test_an_event_that_is_not_json_is_one_line_saying_so(hostile):
    _, done = _reply(hostile, "not_json")
    assert done.finish_reason == "error" and (done.error or "").startswith("the server sent an event that is not JSON")
