"""POST /v1/completions: raw prompts and fill-in-the-middle, whole or as SSE chunks; n choices, each its own job."""

from __future__ import annotations


import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request

from localspec.engine.events import Done, Token
from localspec.errors import IntegrityError
from localspec.jobs import Job
from localspec.models.gguf_info import read_header
from localspec.server import translate
from localspec.server.backend import Backend
from localspec.server.choices import submit_all
from localspec.server.errors import ERROR_RESPONSES
from localspec.server.replies import (StreamedReply, TextOffsets, choices_extension, completion_logprobs, extension,
                                      one_answer, origin_of, streamed, usage, wholes)
from localspec.server.routes.plans import SSE_CONTENT, plan
from localspec.server.schemas import Completion, CompletionChoice, CompletionRequest
from localspec.server.state import Principal, ServerState, State
from localspec.server.streaming import EventStream, Piece, sse

router = APIRouter()


@router.post(
    "/v1/completions", response_model=Completion,
    responses={**ERROR_RESPONSES, 200: {"content": SSE_CONTENT, "description": "JSON, or SSE chunks when stream=true"}},
)
async def completions(body: CompletionRequest, request: Request, state: State,
                      who: Principal) -> Completion | EventStream:
    async with state.serving(body.model, body.keep_alive) as (b, hold):  # 404 for a name it cannot serve
        plan_ = await plan(translate.completion_plan, body, state.settings.max_tokens_cap, fim_supported(b),
                           parallel=state.settings.parallel)
        plans = plan_.per_choice()
        jobs = await submit_all(state, b, plans, model=body.model, owner=who)
        kept = state.keep(hold)  # the reply reads the model (logprob pieces) after the job is done
    echo = body.prompt if (body.echo and body.suffix is None and isinstance(body.prompt, str)) else ""
    replies = one_answer([CompletionReply(state, b, body, p, job, who, echo, index=i)
                          for i, (p, job) in enumerate(zip(plans, jobs, strict=True))])
    if body.stream:
        return EventStream(streamed(replies), on_close=kept.release)
    try:
        answers = await wholes(request, replies)
        dones = [done for _, done in answers]
        return Completion(
            id=replies[0].id, created=replies[0].created, model=body.model, usage=usage(dones, plan_),
            localspec=choices_extension(b, replies, dones),
            choices=[r.choice(tokens, done) for r, (tokens, done) in zip(replies, answers, strict=True)],
        )
    finally:
        kept.release()


@functools.lru_cache(maxsize=32)
def _fim_in_file(path: Path, size: int, mtime_ns: int) -> bool:
    try:
        tokens = set(read_header(path).strings("tokenizer.ggml.tokens"))
    except (OSError, IntegrityError):
        return False  # unreadable: not claimed
    return all(marker.encode() in tokens for marker in translate.FIM_MARKERS)


def fim_in_vocabulary(path: Path) -> bool:
    """Whether a GGUF's vocabulary holds the fill-in-the-middle markers, for a model not loaded; read once
    per version of the file."""
    try:
        st = path.stat()
    except OSError:
        return False
    return _fim_in_file(path, st.st_size, st.st_mtime_ns)


def fim_supported(b: Backend) -> bool:
    """Whether the target's vocabulary has the fill-in-the-middle markers as single tokens."""
    return has_single_tokens(b, translate.FIM_MARKERS)


def has_single_tokens(b: Backend, markers: tuple[str, ...]) -> bool:
    """Whether the target's vocabulary has each of `markers` as one special token."""
    rt = b.engine.target
    for marker in markers:
        ids = rt.tokenize(marker, add_special=False, parse_special=True)
        if len(ids) != 1 or rt.token_text(ids[0]) != marker:
            return False
    return True


class CompletionReply(StreamedReply):
    """One choice of a completion: its id, its whole choice, and its chunks when streamed."""

    def __init__(self, state: ServerState, b: Backend, body: CompletionRequest, plan_: translate.Plan, job: Job,
                 who: str, echo: str, *, index: int = 0) -> None:
        super().__init__(state, b, plan_, job, who, index=index)
        self.body = body
        self.echo = echo
        self.id = f"cmpl-{job.id}"
        self.offsets = TextOffsets(len(echo))  # one count through the chunks: text_offset is the choice's

    def choice(self, tokens: list[Token], done: Done) -> CompletionChoice:
        wanted = self.body.logprobs is not None
        lp = completion_logprobs(self.b, tokens, TextOffsets(len(self.echo))) if wanted else None
        return CompletionChoice(index=self.index, text=self.echo + done.text, finish_reason=done.finish_reason,
                                logprobs=lp)

    def chunk(self, text: str, **kw: Any) -> Completion:
        return Completion(id=self.id, created=self.created, model=self.body.model,
                          choices=[CompletionChoice(index=self.index, text=text, **kw)])

    def head(self) -> list[bytes]:
        return [sse(self.chunk(self.echo, finish_reason=None))] if self.echo else []

    def piece(self, piece: Piece) -> bytes | None:
        if not piece.text:
            return None
        lp = None
        if self.body.logprobs is not None:
            lp = completion_logprobs(self.b, piece.tokens, self.offsets)
        chunk = self.chunk(piece.text, finish_reason=None, logprobs=lp)
        chunk.localspec = origin_of(self.body, piece)
        return sse(chunk)

    def tail(self, done: Done) -> list[bytes]:
        final = self.chunk("", finish_reason=done.finish_reason)
        final.localspec = extension(self.b, done, self.plan, self.job, self.who)
        return [sse(final)]

    def summary(self, dones: Sequence[Done]) -> list[bytes]:
        if not (self.body.stream_options and self.body.stream_options.include_usage):
            return []
        return [sse(Completion(id=self.id, created=self.created, model=self.body.model, choices=[],
                               usage=usage(dones, self.plan)))]
