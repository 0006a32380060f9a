"""The parts of a response the routes share: usage, the `localspec` extension, logprobs, errors."""

from __future__ import annotations

import asyncio
import json
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request

from localspec.engine.events import Done, Token
from localspec.engine.text import Utf8Stream
from localspec.jobs import Job
from localspec.server.backend import Backend
from localspec.server.choices import cancel_unfinished
from localspec.server.errors import APIError, ClientGone, error_json
from localspec.server.schemas import (AutoReport, ChoiceLogprobs, ChunkExtension, CompletionLogprobs,
                                      CompletionTokensDetails, Extension, TokenLogprobOut, TopLogprob, Usage, _Sampling)
from localspec.server.state import CANCELLED, ServerState
from localspec.server.streaming import (SSE_DONE, SSE_KEEPALIVE, Piece, Waiting, collect, interleaved, pieces,
                                        unless_disconnected)
from localspec.server.translate import Plan


def usage(dones: Sequence[Done], plan: Plan) -> Usage:
    """OpenAI's usage, over an answer's choices as OpenAI counts them: the prompt once, the completion
    tokens of every choice summed. With a prediction, its accepted and rejected tokens too (a cache hit
    or a remote tier reports 0 for both: nothing was drafted here). completion_tokens counts the
    answers' tokens only."""
    prompt = dones[0].stats.prompt_tokens  # one prompt, read by each choice's job
    completion = sum(d.stats.completion_tokens for d in dones)
    details = None
    if plan.request.prediction is not None:
        details = CompletionTokensDetails(
            accepted_prediction_tokens=sum(d.stats.prediction_accepted for d in dones),
            rejected_prediction_tokens=sum(d.stats.prediction_rejected for d in dones))
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                 completion_tokens_details=details)


def cache_info(b: Backend, job: Job, who: str) -> dict[str, Any] | None:
    """The cache's part of the response; a hit carries the token that lets its owner mark it wrong."""
    if job.cache is None:
        return None
    info = job.cache.as_dict()
    if job.cache.entry_id and b.pipeline.cache is not None:
        info["verdict_token"] = b.pipeline.cache.verdict_token(job.cache.entry_id, who)
    return info


def extension(b: Backend, done: Done, plan: Plan, job: Job, who: str) -> Extension:
    st = done.stats
    return Extension(
        mode=st.mode, k=plan.request.k, grammar=plan.grammar_kept,
        fallback=plan.fallback, drafted=st.drafted, accepted=st.accepted,
        acceptance_rate=round(st.acceptance_rate, 4),
        drafted_by_position=st.drafted_by_position, accepted_by_position=st.accepted_by_position,
        prompt_tokens=st.prompt_tokens, reused_prefix_tokens=st.reused_prefix_tokens, target_passes=st.target_passes,
        timings={
            "prefill_ms": round(st.prefill_ms, 2), "ttft_ms": round(st.ttft_ms, 2),
            "decode_ms": round(st.decode_ms, 2), "tokens_per_second": round(st.tokens_per_second, 2),
        },
        cache=cache_info(b, job, who),
        route=job.route.as_dict() if job.route else None,
        auto=AutoReport(steps=st.auto_steps, explored=st.explored, why_not_draft=st.auto_why_not or None)
        if st.auto_steps else None,
    )


def choices_extension(b: Backend, replies: Sequence[StreamedReply], dones: Sequence[Done]) -> Extension:
    """A whole answer's `localspec`: choice 0's, as a one-choice answer has it; with several choices,
    each one's own (how it was decoded, its timings) listed under `choices` by index."""
    own = [extension(b, d, r.plan, r.job, r.who) for r, d in zip(replies, dones, strict=True)]
    return own[0] if len(own) == 1 else own[0].model_copy(update={"choices": own})


def origin_of(body: _Sampling, piece: Piece) -> ChunkExtension | None:
    """A text chunk's origin, for a client that asked (`localspec.origins`): the others pay nothing."""
    return ChunkExtension(origin=piece.origin) if body.localspec and body.localspec.origins else None


def _piece(b: Backend, token: int) -> tuple[str, list[int]]:
    """A token's text and bytes for logprobs. A special token (an end of turn among the alternatives)
    adds no bytes to an answer, and each was "": its vocabulary text names it, as llama-server's does."""
    raw = b.engine.target.piece(token)
    if not raw:
        raw = b.engine.target.token_text(token).encode()
    return raw.decode("utf-8", errors="replace"), list(raw)


def _completion_token(b: Backend, token: int) -> str:
    """A token as the legacy completions API names it. A part of a multi-byte character is not text:
    it is `bytes:` and the bytes escaped, as OpenAI spells it. As U+FFFD, every such token had the same
    name, and top_logprobs (keyed by name) kept one of them, with another one's logprob."""
    raw = bytes(_piece(b, token)[1])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + raw.decode("utf-8", errors="backslashreplace")


def chat_logprobs(b: Backend, tokens: list[Token]) -> ChoiceLogprobs:
    out = []
    for t in tokens:
        lp = t.logprob
        assert lp is not None  # only logprob-carrying tokens are collected
        text, raw = _piece(b, lp.token)
        top = [TopLogprob(token=_piece(b, i)[0], logprob=v, bytes=_piece(b, i)[1]) for i, v in lp.top]
        out.append(TokenLogprobOut(token=text, logprob=lp.logprob, bytes=raw, top_logprobs=top))
    return ChoiceLogprobs(content=out)


class TextOffsets:
    """Where each token's text starts in the choice text, in characters, counted through a stream.

    A token may hold part of a multi-byte character (an emoji is often three tokens): its own text is
    U+FFFD, one character, while the answer has one character for the whole sequence. So the offsets
    count the characters the bytes so far decode to, not the tokens' texts' lengths: a token inside a
    character starts where that character does."""

    def __init__(self, start: int = 0) -> None:
        self.offset = start  # the characters before the next token: an echoed prompt, earlier tokens
        self._utf8 = Utf8Stream()

    def take(self, raw: bytes) -> int:
        """The next token's offset, given its bytes."""
        at = self.offset
        self.offset += len(self._utf8.feed(raw))
        return at


def completion_logprobs(b: Backend, tokens: list[Token], offsets: TextOffsets) -> CompletionLogprobs:
    """`offsets`: the choice's text offsets so far (a stream's chunks share one, after any echo)."""
    texts: list[str] = []
    lps: list[float] = []
    tops: list[dict[str, float]] = []
    starts: list[int] = []
    for t in tokens:
        lp = t.logprob
        assert lp is not None
        texts.append(_completion_token(b, lp.token))
        lps.append(lp.logprob)
        tops.append({_completion_token(b, i): v for i, v in lp.top})
        starts.append(offsets.take(b.engine.target.piece(lp.token)))
    return CompletionLogprobs(tokens=texts, token_logprobs=lps, top_logprobs=tops, text_offset=starts)




def unfinished(done: Done) -> APIError | None:
    """Why an answer has no OpenAI finish reason: the engine failed (500, naming the cause, and the
    server goes on), or the request was cancelled while its client waited (503: retry)."""
    if done.finish_reason == "error":
        return APIError(500, f"Generation failed: {done.error}", "engine_error")
    if done.finish_reason == "cancelled":
        return APIError(503, CANCELLED, "cancelled")
    return None




def unsent(content: str, sent: str) -> str:
    """The part of an answer's final content that its stream has not sent yet. With tools offered
    the stream held back only what might be a call (Plan.text_gate), so what it sent is the
    content's start; without tools it sent the whole content."""
    return content[len(sent):] if content.startswith(sent) else ""


def sse_error(err: APIError) -> bytes:
    """The same error inside a stream that has already sent its 200."""
    body = error_json(err.status, err.message, err.code)
    return b"data: " + json.dumps(body).encode() + b"\n\n"


@dataclass(frozen=True)
class Ended:
    """How one choice's stream ended: its Done, and the error of an answer that did not finish."""

    done: Done
    error: APIError | None


R = TypeVar("R", bound="StreamedReply")


class StreamedReply(ABC):
    """One answer (one choice of it) streamed as SSE: the parts every stream shares (keep-alives while
    waiting, the metrics record, an engine failure as an error event, [DONE]) around the route's own
    chunks. `index`: which choice (OpenAI's n); the module's `streamed` and `wholes` read several."""

    closing: bytes | None = SSE_DONE  # the stream's last event (the Responses API sends none)
    keepalive: bytes | None = SSE_KEEPALIVE  # sent while a request waits (NDJSON has no comments: none)

    def __init__(self, state: ServerState, b: Backend, plan: Plan, job: Job, who: str, *, index: int = 0) -> None:
        self.state, self.b, self.plan, self.job, self.who = state, b, plan, job, who
        self.index = index
        self.created = int(time.time())

    id: str

    def head(self) -> list[bytes]:
        """Chunks before the first token."""
        return []

    @abstractmethod
    def piece(self, piece: Piece) -> bytes | None:
        """A chunk for text that became certain (None: nothing to send yet)."""

    @abstractmethod
    def tail(self, done: Done) -> list[bytes]:
        """The last chunks of this choice's finished answer: finish reason, the localspec extension."""

    def summary(self, dones: Sequence[Done]) -> list[bytes]:
        """Chunks for the whole answer once every choice finished, before the closing (usage)."""
        return []

    def failed(self, err: APIError) -> list[bytes]:
        """The events of an answer that did not finish, after the stream's 200 was sent."""
        return [sse_error(err)]

    async def whole(self, request: Request) -> tuple[list[Token], Done]:
        """A non-streamed answer: its logprob tokens and its Done. Raises ClientGone when the client
        leaves first, and the APIError of an answer that did not finish."""
        return (await wholes(request, [self]))[0]

    async def events(self) -> AsyncIterator[bytes | Ended]:
        """This choice's chunks up to its last piece, then how it ended (nothing when its events
        stopped without a Done)."""
        for first in self.head():
            yield first
        async for item in pieces(self.job, self.state.metrics, gate=self.plan.text_gate(),
                                     split=self.plan.thought_split()):
            if isinstance(item, Waiting):
                if self.keepalive is not None:
                    yield self.keepalive
            elif isinstance(item, Done):
                yield Ended(item, unfinished(item))
                return
            elif (chunk := self.piece(item)) is not None:
                yield chunk

    def stream(self) -> AsyncIterator[bytes]:
        return streamed([self])


def one_answer(replies: list[R]) -> list[R]:
    """The choices of one answer share its id and its time: the first choice's."""
    for r in replies[1:]:
        r.id, r.created = replies[0].id, replies[0].created
    return replies


async def wholes(request: Request, replies: Sequence[StreamedReply]) -> list[tuple[list[Token], Done]]:
    """Every choice's whole answer (logprob tokens, Done), awaited together. Raises ClientGone when
    the client leaves first, and the APIError of the first choice that did not finish; either way
    the choices still running are cancelled."""
    async def finished(reply: StreamedReply) -> tuple[list[Token], Done]:
        tokens, done = await collect(reply.job, reply.state.metrics)
        if (err := unfinished(done)) is not None:
            raise err  # at once: the other choices are not waited for
        return tokens, done

    try:
        collected = await unless_disconnected(request, asyncio.gather(*(finished(r) for r in replies)))
        if collected is None:
            raise ClientGone
        return collected
    finally:
        cancel_unfinished(r.job for r in replies)


async def streamed(replies: Sequence[StreamedReply]) -> AsyncIterator[bytes]:
    """The choices' chunks interleaved as they come, each choice's tail when it finishes, then the
    answer's summary (usage) and the closing. A choice that fails ends the stream with its error
    (and the closing); the client leaving, or a failure, cancels the choices still running."""
    first = replies[0]
    dones: dict[int, Done] = {}
    try:
        async with aclosing(interleaved([r.events() for r in replies])) as items:
            async for i, item in items:
                if not isinstance(item, Ended):
                    yield item
                    continue
                if item.error is not None:
                    cancel_unfinished(r.job for r in replies)
                    for last in replies[i].failed(item.error):
                        yield last
                    break
                dones[i] = item.done
                for last in replies[i].tail(item.done):
                    yield last
            else:
                if len(dones) < len(replies):  # a job's events stopped without a Done: nothing to close
                    return
                for last in first.summary([dones[i] for i in range(len(replies))]):
                    yield last
        if first.closing is not None:
            yield first.closing
    finally:
        cancel_unfinished(r.job for r in replies)
