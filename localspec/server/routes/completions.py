"""POST /v1/completions: raw prompts and fill-in-the-middle, whole or as SSE chunks."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response

from localspec.engine.events import Done
from localspec.jobs import Job
from localspec.server import translate
from localspec.server.backend import Backend
from localspec.server.errors import ERROR_RESPONSES
from localspec.server.replies import completion_logprobs, engine_failed, extension, sse_engine_error, usage
from localspec.server.routes.plans import SSE_CONTENT, plan
from localspec.server.schemas import Completion, CompletionChoice, CompletionRequest
from localspec.server.state import Principal, ServerState, State, check_model
from localspec.server.streaming import (SSE_DONE, SSE_KEEPALIVE, EventStream, Waiting, collect, pieces, sse,
                                        unless_disconnected)

router = APIRouter()


@router.post(
    "/v1/completions", response_model=Completion,
    responses={**ERROR_RESPONSES, 200: {"content": SSE_CONTENT, "description": "JSON, or SSE chunks when stream=true"}},
)
async def completions(body: CompletionRequest, request: Request, state: State, who: Principal):
    b = state.backend()
    check_model(body.model, b.target_names)
    plan_ = await plan(translate.completion_plan, body, state.settings.max_tokens_cap, fim_supported(b))
    t0 = time.perf_counter()
    job = await state.submit(b, plan_, model=body.model, owner=who)
    echo = body.prompt if (body.echo and body.suffix is None and isinstance(body.prompt, str)) else ""
    reply = CompletionReply(state, b, body, plan_, job, who, t0, echo)
    if body.stream:
        return EventStream(reply.stream())
    collected = await unless_disconnected(request, collect(job, state.metrics))
    if collected is None:
        return Response(status_code=499)
    tokens, done = collected
    state.record(b, job, done, t0=t0, request_id=reply.id)
    engine_failed(done)
    return Completion(
        id=reply.id, created=reply.created, model=body.model, usage=usage(done),
        localspec=extension(b, done, plan_, job, who),
        choices=[CompletionChoice(
            text=echo + done.text, finish_reason=done.finish_reason,
            logprobs=completion_logprobs(b, tokens) if body.logprobs is not None else None,
        )],
    )


def fim_supported(b: Backend) -> bool:
    """Whether the target's vocabulary has the fill-in-the-middle markers as single tokens."""
    rt = b.engine.target
    for marker in (translate.FIM_PREFIX, translate.FIM_SUFFIX, translate.FIM_MIDDLE):
        ids = rt.tokenize(marker, add_special=False, parse_special=True)
        if len(ids) != 1 or rt.token_text(ids[0]) != marker:
            return False
    return True


class CompletionReply:
    """One completion's identity and its SSE stream."""

    def __init__(self, state: ServerState, b: Backend, body: CompletionRequest, plan_: translate.Plan, job: Job,
                 who: str, t0: float, echo: str) -> None:
        self.state, self.b, self.body, self.plan, self.job, self.who, self.t0 = state, b, body, plan_, job, who, t0
        self.echo = echo
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def chunk(self, text: str, **kw) -> Completion:
        return Completion(id=self.id, created=self.created, model=self.body.model,
                          choices=[CompletionChoice(text=text, **kw)])

    async def stream(self) -> AsyncIterator[bytes]:
        if self.echo:
            yield sse(self.chunk(self.echo, finish_reason=None))
        done: Done | None = None
        async for item in pieces(self.job, self.state.metrics):
            if isinstance(item, Waiting):
                yield SSE_KEEPALIVE
            elif isinstance(item, Done):
                done = item
            elif item.text:
                lp = completion_logprobs(self.b, item.tokens) if self.body.logprobs is not None else None
                yield sse(self.chunk(item.text, finish_reason=None, logprobs=lp))
        if done is None:
            return
        self.state.record(self.b, self.job, done, t0=self.t0, request_id=self.id)
        if done.finish_reason == "error":
            yield sse_engine_error(done)
            yield SSE_DONE
            return
        final = self.chunk("", finish_reason=done.finish_reason)
        final.localspec = extension(self.b, done, self.plan, self.job, self.who)
        yield sse(final)
        if self.body.stream_options and self.body.stream_options.include_usage:
            yield sse(Completion(id=self.id, created=self.created, model=self.body.model, choices=[],
                                 usage=usage(done)))
        yield SSE_DONE
