"""Turning a request body into the engine's request: schema and grammar checks, off the event loop."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TypeVar

from pydantic import ValidationError

from localspec.server.errors import APIError
from localspec.server.translate import Plan

T = TypeVar("T")

# Before OpenAPI 3.2 an event stream's `schema` describes one event (its `data:` field), not the whole body.
SSE_CONTENT = {"text/event-stream": {"schema": {
    "type": "object", "required": ["data"],
    "properties": {"data": {"type": "string", "description": "a chunk's JSON; the last event is [DONE]"},
                   "event": {"type": "string"}},
}}}


def valid_or_400(build: Callable[..., T], *args: object, **kwargs: object) -> T:
    """`build(*args, **kwargs)`, with a ValidationError it raises (a request built from another, a plan) as a
    400 naming the field: uncaught, it was a 500 and a traceback."""
    try:
        return build(*args, **kwargs)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or None
        raise APIError(400, f"{field}: {err['msg']}" if field else err["msg"], "invalid_value", field) from exc


async def plan(build: Callable[..., Plan], *args: object, **kwargs: object) -> Plan:
    """Schema checks and grammar conversion cost CPU: never on the event loop."""
    return await asyncio.to_thread(functools.partial(valid_or_400, build, *args, **kwargs))
