"""POST /v1/chat/completions: a whole answer, or SSE chunks."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response

from localspec.engine.events import Done, Token
from localspec.jobs import Job
from localspec.server import translate
from localspec.server.backend import Backend
from localspec.server.errors import ERROR_RESPONSES
from localspec.server.replies import chat_logprobs, engine_failed, extension, sse_engine_error, usage
from localspec.server.routes.plans import SSE_CONTENT, plan
from localspec.server.schemas import (ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
                                      ChatCompletionRequest, ChatDelta, ChatMessageOut, ToolCallDelta)
from localspec.server.state import Principal, ServerState, State, check_model
from localspec.server.streaming import (SSE_DONE, SSE_KEEPALIVE, EventStream, Waiting, collect, pieces, sse,
                                        unless_disconnected)

router = APIRouter()


@router.post(
    "/v1/chat/completions", response_model=ChatCompletion,
    responses={**ERROR_RESPONSES, 200: {"content": SSE_CONTENT, "description": "JSON, or SSE chunks when stream=true"}},
)
async def chat_completions(body: ChatCompletionRequest, request: Request, state: State, who: Principal):
    b = state.backend()
    check_model(body.model, b.target_names)
    plan_ = await plan(translate.chat_plan, body, state.settings.max_tokens_cap)
    t0 = time.perf_counter()
    job = await state.submit(b, plan_, model=body.model, owner=who)
    reply = ChatReply(state, b, body, plan_, job, who, t0)
    if body.stream:
        return EventStream(reply.stream())
    collected = await unless_disconnected(request, collect(job, state.metrics))
    if collected is None:  # the client went away; its request was cancelled
        return Response(status_code=499)
    tokens, done = collected
    state.record(b, job, done, t0=t0, request_id=reply.id)
    engine_failed(done)
    content, calls = done.text, []
    if plan_.tool_mode:
        content, calls = translate.parse_tool_calls(done.text, plan_.tool_mode == "forced")
    return ChatCompletion(
        id=reply.id, created=reply.created, model=body.model, usage=usage(done),
        localspec=extension(b, done, plan_, job, who),
        choices=[ChatChoice(
            message=ChatMessageOut(content=content, tool_calls=calls or None),
            finish_reason="tool_calls" if calls else done.finish_reason,
            logprobs=chat_logprobs(b, tokens) if body.logprobs else None,
        )],
    )


class ChatReply:
    """One chat answer's identity and its SSE stream."""

    def __init__(self, state: ServerState, b: Backend, body: ChatCompletionRequest, plan_: translate.Plan, job: Job,
                 who: str, t0: float) -> None:
        self.state, self.b, self.body, self.plan, self.job, self.who, self.t0 = state, b, body, plan_, job, who, t0
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def chunk(self, delta: ChatDelta, **kw) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.body.model,
                                   choices=[ChatChunkChoice(delta=delta, **kw)])

    async def stream(self) -> AsyncIterator[bytes]:
        yield sse(self.chunk(ChatDelta(role="assistant", content="")))
        unreported: list[Token] = []
        done: Done | None = None
        # Tool answers are parsed whole, at the end: hold their text.
        async for item in pieces(self.job, self.state.metrics, hold_text=bool(self.plan.tool_mode)):
            if isinstance(item, Waiting):
                yield SSE_KEEPALIVE
            elif isinstance(item, Done):
                done = item
            elif not item.text:
                unreported = item.tokens
            else:
                lp = chat_logprobs(self.b, item.tokens) if self.body.logprobs else None
                yield sse(self.chunk(ChatDelta(content=item.text), logprobs=lp))
        if done is None:
            return
        self.state.record(self.b, self.job, done, t0=self.t0, request_id=self.id)
        if done.finish_reason == "error":
            yield sse_engine_error(done)
            yield SSE_DONE
            return
        reason = done.finish_reason
        if self.plan.tool_mode:
            content, calls = translate.parse_tool_calls(done.text, self.plan.tool_mode == "forced")
            if calls:
                reason = "tool_calls"
                deltas = [ToolCallDelta(index=i, id=c.id, type="function", function=c.function)
                          for i, c in enumerate(calls)]
                yield sse(self.chunk(ChatDelta(tool_calls=deltas)))
            if content:
                yield sse(self.chunk(ChatDelta(content=content)))
        lp = chat_logprobs(self.b, unreported) if self.body.logprobs and unreported else None
        final = self.chunk(ChatDelta(), finish_reason=reason, logprobs=lp)
        final.localspec = extension(self.b, done, self.plan, self.job, self.who)
        yield sse(final)
        if self.body.stream_options and self.body.stream_options.include_usage:
            yield sse(ChatCompletionChunk(id=self.id, created=self.created, model=self.body.model, choices=[],
                                          usage=usage(done)))
        yield SSE_DONE
