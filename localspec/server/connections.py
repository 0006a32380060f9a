"""Connections that cannot be held open for nothing: a deadline on each request's head, and a cap.

uvicorn's h11 protocol waits for a request's line and headers for as long as a client likes: a
connection that sends nothing, or a byte a minute, stays open for good, before any key is checked.
Enough of them (a slowloris, from any host a server bound beyond loopback can hear) use up the
process's file descriptors, and then neither real clients nor the model files can be opened. Here:

- each request's head (request line and headers) must arrive within `request_timeout_s` of the
  connection being ready for it (opened, or its previous response sent); a late one is answered
  408 and closed. The body has its own deadline in `guards.BodyLimit`.
- at most `max_connections` are open at once; one more is answered 503 and closed, so that the
  descriptors left stay enough for the server's own files.

h11's `their_state` (public) tells the phase: IDLE until the head is in, then SEND_BODY or DONE.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from localspec.server.errors import error_json

DEFAULT_MAX_CONNECTIONS = 512
FDS_PER_CONNECTION_SHARE = 2  # at most half the descriptors go to clients: the rest are models, databases, logs


@dataclass(frozen=True, kw_only=True)
class ConnectionLimits:
    request_timeout_s: float
    max_connections: int
    body_grace_s: float = 5.0  # after BodyLimit's own 408, which a body still being read gets first


def default_max_connections() -> int:
    """512, or half the soft descriptor limit where that is lower (macOS starts processes at 256)."""
    try:
        import resource
    except ImportError:  # Windows: no such limit to share
        return DEFAULT_MAX_CONNECTIONS
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return DEFAULT_MAX_CONNECTIONS
    return max(8, min(DEFAULT_MAX_CONNECTIONS, soft // FDS_PER_CONNECTION_SHARE))


def raw_error(status: int, reason: str, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 error response that closes the connection, for when h11 has no request to answer."""
    body = json.dumps(error_json(status, message, code)).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode("latin-1") + body


def head_timeout_response(timeout_s: float) -> bytes:
    return raw_error(408, "Request Timeout", f"The request line and headers did not arrive within {timeout_s:g} s "
                     "of the connection opening. Fix: send the whole request at once; a slow link can raise "
                     "[server] request_timeout_s.", "request_timeout")


def too_many_response(cap: int) -> bytes:
    return raw_error(503, "Service Unavailable", f"The server already holds {cap} open connections, its limit. "
                     "Fix: close idle connections (or pool them), or raise [server] max_connections.",
                     "too_many_connections")


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the deadlines and the connection cap of the module doc."""

    limits = ConnectionLimits(request_timeout_s=60.0, max_connections=DEFAULT_MAX_CONNECTIONS)
    _timer: asyncio.TimerHandle | None = None
    _awaiting: object = None  # the client state (an h11 sentinel) the timer waits out

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            transport.write(too_many_response(self.limits.max_connections))
            transport.close()
            return
        self._follow_client()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow_client()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start the next cycle, and parse a pipelined head
        if not self.transport.is_closing():
            self._follow_client()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        super().connection_lost(exc)

    def _follow_client(self) -> None:
        """A timer for the phase the client is in: its head (IDLE), its body (SEND_BODY), none after."""
        state = self.conn.their_state
        if state is self._awaiting:
            return  # the same phase: its deadline stands (a byte a minute does not extend it)
        self._cancel()
        if state is h11.IDLE:
            self._arm(self.limits.request_timeout_s, state)
        elif state is h11.SEND_BODY:
            # BodyLimit answers a late body 408 at request_timeout_s; this closes one nobody reads
            # (a 401, a 403, a 413 by Content-Length), which h11 would otherwise drain for good.
            self._arm(self.limits.request_timeout_s + self.limits.body_grace_s, state)

    def _arm(self, delay: float, state: object) -> None:
        self._awaiting = state
        self._timer = self.loop.call_later(delay, self._late)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._awaiting = None

    def _late(self) -> None:
        awaited = self._awaiting
        self._timer = self._awaiting = None
        if self.transport.is_closing() or self.conn.their_state is not awaited:
            return
        if awaited is h11.IDLE and self.conn.trailing_data[0]:  # part of a head came: say why it closes
            self.transport.write(head_timeout_response(self.limits.request_timeout_s))
        self.transport.close()


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """The protocol class for uvicorn's `Config(http=...)`, bound to these limits."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits})
