"""POST /v1/chat/completions: a whole answer, or SSE chunks; n choices, each its own engine job."""

from __future__ import annotations


from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request

from localspec.engine.events import Done, Token
from localspec.jobs import Job
from localspec.server import translate
from localspec.server.backend import Backend
from localspec.server.choices import submit_all
from localspec.server.errors import ERROR_RESPONSES
from localspec.server.replies import (StreamedReply, chat_logprobs, choices_extension, extension, one_answer,
                                      origin_of, streamed, unsent, usage, wholes)
from localspec.server.routes.plans import SSE_CONTENT, plan, with_thinking
from localspec.server.schemas import (ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
                                      ChatCompletionRequest, ChatDelta, ChatMessageOut, ToolCallDelta)
from localspec.server.state import Principal, ServerState, State
from localspec.server.streaming import EventStream, Piece, sse

router = APIRouter()


@router.post(
    "/v1/chat/completions", response_model=ChatCompletion,
    responses={**ERROR_RESPONSES, 200: {"content": SSE_CONTENT, "description": "JSON, or SSE chunks when stream=true"}},
)
async def chat_completions(body: ChatCompletionRequest, request: Request, state: State,
                           who: Principal) -> ChatCompletion | EventStream:
    async with state.serving(body.model, body.keep_alive) as (b, hold):  # 404 for a name it cannot serve
        plan_ = await plan(translate.chat_plan, body, state.settings.max_tokens_cap,
                           parallel=state.settings.parallel)
        plan_ = await with_thinking(plan_, b, split=body.reasoning_format != "none")
        plans = plan_.per_choice()
        jobs = await submit_all(state, b, plans, model=body.model, owner=who)
        kept = state.keep(hold)  # the reply reads the model (logprob pieces) after the job is done
    replies = one_answer([ChatReply(state, b, body, p, job, who, index=i)
                          for i, (p, job) in enumerate(zip(plans, jobs, strict=True))])
    if body.stream:
        return EventStream(streamed(replies), on_close=kept.release)
    try:
        answers = await wholes(request, replies)
        dones = [done for _, done in answers]
        return ChatCompletion(
            id=replies[0].id, created=replies[0].created, model=body.model, usage=usage(dones, plan_),
            localspec=choices_extension(b, replies, dones),
            choices=[r.choice(tokens, done) for r, (tokens, done) in zip(replies, answers, strict=True)],
        )
    finally:
        kept.release()


class ChatReply(StreamedReply):
    """One choice of a chat answer: its id, its whole choice, and its chunks when streamed."""

    def __init__(self, state: ServerState, b: Backend, body: ChatCompletionRequest, plan_: translate.Plan, job: Job,
                 who: str, *, index: int = 0) -> None:
        super().__init__(state, b, plan_, job, who, index=index)
        self.body = body
        self.id = f"chatcmpl-{job.id}"
        self.text = ""  # streamed so far
        self.thought = ""  # of the thought, streamed so far
        self.unreported: list[Token] = []  # logprob tokens behind no text yet: they go on the last chunk

    def choice(self, tokens: list[Token], done: Done) -> ChatChoice:
        thought, content, calls = self.plan.answer(done.text)
        return ChatChoice(
            index=self.index, message=ChatMessageOut(content=content, reasoning_content=thought or None,
                                                     tool_calls=calls or None),
            finish_reason="tool_calls" if calls else done.finish_reason,
            logprobs=chat_logprobs(self.b, tokens) if self.body.logprobs else None,
        )

    def chunk(self, delta: ChatDelta, **kw: Any) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.body.model,
                                   choices=[ChatChunkChoice(index=self.index, delta=delta, **kw)])

    def head(self) -> list[bytes]:
        return [sse(self.chunk(ChatDelta(role="assistant", content="")))]

    def piece(self, piece: Piece) -> bytes | None:
        if not piece.text and not piece.thought:
            self.unreported = piece.tokens
            return None
        self.text += piece.text
        self.thought += piece.thought
        lp = chat_logprobs(self.b, piece.tokens) if self.body.logprobs else None
        delta = ChatDelta(content=piece.text or None, reasoning_content=piece.thought or None)
        chunk = self.chunk(delta, logprobs=lp)
        chunk.localspec = origin_of(self.body, piece)
        return sse(chunk)

    def tail(self, done: Done) -> list[bytes]:
        out = []
        reason: str = done.finish_reason
        if self.plan.tool_mode or self.plan.thinking is not None:
            thought, content, calls = self.plan.answer(done.text)
            if more := unsent(thought or "", self.thought):  # held back: a possible </think>, whitespace
                out.append(sse(self.chunk(ChatDelta(reasoning_content=more))))
            if rest := unsent(content or "", self.text):  # what was held back: a call's text is not content
                out.append(sse(self.chunk(ChatDelta(content=rest))))
            if calls:
                reason = "tool_calls"
                deltas = [ToolCallDelta(index=i, id=c.id, type="function", function=c.function)
                          for i, c in enumerate(calls)]
                out.append(sse(self.chunk(ChatDelta(tool_calls=deltas))))
        lp = chat_logprobs(self.b, self.unreported) if self.body.logprobs and self.unreported else None
        final = self.chunk(ChatDelta(), finish_reason=reason, logprobs=lp)
        final.localspec = extension(self.b, done, self.plan, self.job, self.who)
        out.append(sse(final))
        return out

    def summary(self, dones: Sequence[Done]) -> list[bytes]:
        if not (self.body.stream_options and self.body.stream_options.include_usage):
            return []
        return [sse(ChatCompletionChunk(id=self.id, created=self.created, model=self.body.model, choices=[],
                                        usage=usage(dones, self.plan)))]
