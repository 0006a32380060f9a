"""Turning a request body into the engine's request: schema and grammar checks, off the event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable
from typing import TypeVar

from pydantic import ValidationError

from localspec.engine.prompt import split_prefill
from localspec.server.backend import Backend
from localspec.server.errors import APIError, field_error
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
        field, why = field_error(list(exc.errors()))
        raise APIError(400, f"{field}: {why}" if field else why, "invalid_value", field) from exc


async def plan(build: Callable[..., Plan], *args: object, **kwargs: object) -> Plan:
    """Schema checks and grammar conversion cost CPU: never on the event loop."""
    return await asyncio.to_thread(functools.partial(valid_or_400, build, *args, **kwargs))


async def with_thinking(plan_: Plan, b: Backend, *, split: bool = True) -> Plan:
    """`plan_` with a thinking model's thought split from its content (Plan.thinking), where `split` (the
    request did not ask for the raw text) and it is a chat that continues no prefill (whose answer goes
    on from the client's own text, not from the generation prompt the probe asks about) and has no
    grammar (a schema, a forced call: the grammar shapes the answer from its first token, so it has no
    thought, and an opened prompt's answer, all "thought" without a </think>, lost its JSON). Whether
    the prompt opens the thought is the default tier's template's (rendered off the event loop, once)."""
    messages = plan_.request.messages
    if not split or not messages or plan_.request.grammar or split_prefill(messages)[1]:
        return plan_
    try:
        prompter = b.engine.prompter
    except TypeError:  # the default tier is not in this process: a thought, if any, starts with <think>
        return dataclasses.replace(plan_, thinking=False)
    # Asked with the variables the engine will render with (the request's over the model's own); known
    # after the first request with them, so only that one waits on the render off the loop.
    variables = b.engine.with_defaults(plan_.request).template_vars
    known = prompter.known_opens(variables)
    opened = known if known is not None else await asyncio.to_thread(prompter.opens_thought_with, variables)
    return dataclasses.replace(plan_, thinking=opened)
