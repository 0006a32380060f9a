"""A request id on every answer, for a client's log and the server's: `x-request-id` (OpenAI's name,
which the openai SDK reads as `_request_id`) and, on Anthropic's routes, `request-id` (the anthropic
SDK's). A client's own well-formed `x-request-id` is kept, so a proxy's trace goes on through the
server; otherwise one is made. The outermost ASGI piece: a guard's refusal carries one too."""

from __future__ import annotations

import re
import uuid

from localspec.server.errors import REQUEST_ID_KEY
from localspec.server.guards import ASGIApp, Message, Receive, Scope, Send, header

_GIVEN = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # what a client may choose: nothing a log line could be fooled by
ANTHROPIC_PATHS = ("/v1/messages",)


def request_id(scope: Scope) -> str:
    given = header(scope, b"x-request-id")
    return given if given is not None and _GIVEN.fullmatch(given) else f"req_{uuid.uuid4().hex}"


class RequestId:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = scope[REQUEST_ID_KEY] = request_id(scope)
        names = [b"x-request-id"]
        if str(scope.get("path", "")).startswith(ANTHROPIC_PATHS):
            names.append(b"request-id")

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *((n, rid.encode()) for n in names)]}
            await send(message)

        return await self.app(scope, receive, send_with_id)
