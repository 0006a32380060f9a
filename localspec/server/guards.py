"""ASGI guards in front of every route: who may talk to the server, from where, and how much.

Outermost first:
1. `HostGuard`: without an API key, only requests addressed to this machine's own names
   (`Host: localhost`, `127.0.0.1`, `[::1]`, the bound address, `--allowed-hosts`) and, when a
   browser sends an `Origin`, only pages served from those names (`--allowed-origins` adds more).
   This stops DNS rebinding: a web page on `attacker.example` that resolves to 127.0.0.1 sends
   `Host: attacker.example`, and gets a 403. Clients that send no Origin (curl, SDKs) pass.
2. `BodyLimit`: 413 beyond `max_body_bytes`, by Content-Length or while a chunked body arrives;
   408 for a body still arriving `request_timeout_s` after its head (the head's own deadline, and
   the cap on open connections, are the protocol's: `connections.py`).
3. CORS (Starlette's), for loopback origins and `--allowed-origins`: it answers preflights
   itself, before the key check, so a browser client can use a key.
4. `Auth`: `Authorization: Bearer <key>` (or Anthropic's `x-api-key`) against every configured
   key, in constant time; the key that matched becomes the request's principal (the cache keeps
   each principal's entries apart).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from fastapi import HTTPException

from localspec.cache.scope import LOCAL_OWNER
from localspec.server.errors import error_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
LOCAL_PRINCIPAL = LOCAL_OWNER  # every client of a server without keys is the machine's user
PRINCIPAL_KEY = "localspec.principal"  # where Auth leaves the principal in the ASGI scope
OPEN_PATHS = frozenset({"/health", "/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"})


async def send_error(scope: Scope, send: Send, status: int, message: str, code: str,
                     headers: dict[str, str] | None = None) -> None:
    """An error before any route: in the shape of the API the path belongs to, as the routes' own
    (Ollama's `{"error": "..."}` on /api/, which its clients print; Anthropic's on /v1/messages; ...)."""
    body = json.dumps(error_body(str(scope.get("path", "")), status, message, code)).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or []:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def host_name(host_header: str) -> str:
    """The name in a Host header, without its port: `[::1]:8000` -> `::1`, `Localhost.:80` -> `localhost`."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0].rstrip(".") if host.count(":") == 1 else host.rstrip(".")


@dataclass(frozen=True)
class Allowed:
    """The names and origins a key-less server answers to."""

    hosts: frozenset[str]
    origins: frozenset[str]  # exact "scheme://host[:port]", lower case

    @classmethod
    def build(cls, *, bound_host: str, extra_hosts: Sequence[str] = (), extra_origins: Sequence[str] = ()) -> Allowed:
        hosts = {*LOOPBACK_NAMES, *(host_name(h) for h in extra_hosts)}
        if bound_host not in ("0.0.0.0", "::", ""):
            hosts.add(host_name(bound_host))
        return cls(frozenset(hosts), frozenset(o.strip().rstrip("/").lower() for o in extra_origins))

    def host_ok(self, host_header: str | None) -> bool:
        return host_header is not None and host_name(host_header) in self.hosts

    def origin_ok(self, origin: str) -> bool:
        origin = origin.strip().rstrip("/").lower()
        if origin in self.origins:
            return True
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and (parts.hostname or "") in self.hosts


class HostGuard:
    """403 for a request addressed to a foreign name or sent by a foreign page (see the module doc)."""

    def __init__(self, app: ASGIApp, allowed: Allowed) -> None:
        self.app, self.allowed = app, allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        host = header(scope, b"host")
        if not self.allowed.host_ok(host):
            name = host_name(host) if host else "(none)"
            return await send_error(
                scope, send, 403, f"Host '{name}' is not allowed: without an API key this server answers only to "
                f"{', '.join(sorted(self.allowed.hosts))} (a guard against DNS rebinding). "
                f"Fix: start it with --allowed-hosts {name}, or use an API key.", "host_not_allowed")
        origin = header(scope, b"origin")
        if origin is not None and not self.allowed.origin_ok(origin):
            return await send_error(
                scope, send, 403, f"Origin '{origin[:200]}' is not allowed: web pages may use this server only from "
                f"its own names. Fix: start it with --allowed-origins {origin[:200]}, or use an API key.",
                "origin_not_allowed")
        return await self.app(scope, receive, send)


class BodyLimit:
    """413 for a body over the limit, by Content-Length or by counting a chunked body; 408 for a body
    that has not all arrived `timeout_s` after its head (a slow sender holds a connection for nothing)."""

    def __init__(self, app: ASGIApp, limit: int, timeout_s: float) -> None:
        self.app, self.limit, self.timeout_s = app, limit, timeout_s
        self.message = (f"The request body is over the {limit} byte limit; send a smaller one, or start the "
                        "server with a larger --max-body-mb.")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await send_error(scope, send, 413, self.message, "body_too_large")
        seen = 0
        complete = False
        deadline = asyncio.get_running_loop().time() + self.timeout_s

        async def limited() -> Message:
            nonlocal seen, complete
            if complete:  # after the body, receive() waits for a disconnect: no deadline on that
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                # An HTTPException passes FastAPI's body parsing unchanged (other errors become 400);
                # `connection: close` makes uvicorn close rather than drain the rest.
                raise HTTPException(408, f"The request body did not all arrive within {self.timeout_s:g} s of "
                                    "its headers. Fix: send the body at once; a slow link can raise [server] "
                                    "request_timeout_s.", headers={"connection": "close"}) from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise HTTPException(413, self.message)
                complete = not message.get("more_body", False)
            return message

        return await self.app(scope, limited, send)


def principal_of(key: str) -> str:
    """A key's stable name in the cache: a digest, never the key itself."""
    return "key:" + hashlib.sha256(key.encode()).hexdigest()[:16]


class Auth:
    """Bearer (or x-api-key) keys, compared in constant time against every key; /health and the docs stay open."""

    def __init__(self, app: ASGIApp, keys: Sequence[str]) -> None:
        self.app = app
        self.keys = [(k.encode(), principal_of(k)) for k in keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        auth = (header(scope, b"authorization") or "").encode("latin-1")
        bearer = auth[7:].strip() if auth[:7].lower() == b"bearer " else b""
        # Anthropic's clients send the key as x-api-key (Claude Code's ANTHROPIC_API_KEY), and with
        # ANTHROPIC_AUTH_TOKEN also set, a Bearer beside it: a valid key in either header is taken.
        api_key = (header(scope, b"x-api-key") or "").encode("latin-1").strip()
        principal = next((p for p in [self._principal(bearer), self._principal(api_key)] if p), None)
        if principal is None:
            return await send_error(scope, send, 401, "Missing or incorrect API key (send Authorization: Bearer "
                                    "<key>, or x-api-key: <key>).", "invalid_api_key", {"www-authenticate": "Bearer"})
        scope[PRINCIPAL_KEY] = principal
        return await self.app(scope, receive, send)

    def _principal(self, given: bytes) -> str | None:
        """The principal of the key `given` is, or None; every key is compared, whichever matches."""
        principal = None
        for key, name in self.keys:
            if hmac.compare_digest(given, key):
                principal = name
        return principal


def loopback_origin_regex() -> str:
    """Browser origins on this machine's own names, any port: CORS is on for them by default."""
    return r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?$"
