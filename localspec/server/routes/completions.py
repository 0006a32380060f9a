"""POST /v1/completions: raw prompts and fill-in-the-middle, whole or as SSE chunks."""

from __future__ import annotations


import functools
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request

from localspec.engine.events import Done
from localspec.errors import IntegrityError
from localspec.jobs import Job
from localspec.models.gguf_info import read_header
from localspec.server import translate
from localspec.server.backend import Backend
from localspec.server.errors import ERROR_RESPONSES
from localspec.server.replies import (StreamedReply, TextOffsets, completion_logprobs, extension, origin_of,
                                     usage)
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
        plan_ = await plan(translate.completion_plan, body, state.settings.max_tokens_cap, fim_supported(b))
        job = await state.submit(b, plan_, model=body.model, owner=who)
        kept = state.keep(hold)  # the reply reads the model (logprob pieces) after the job is done
    echo = body.prompt if (body.echo and body.suffix is None and isinstance(body.prompt, str)) else ""
    reply = CompletionReply(state, b, body, plan_, job, who, echo)
    if body.stream:
        return EventStream(reply.stream(), on_close=kept.release)
    try:
        tokens, done = await reply.whole(request)
        return Completion(
            id=reply.id, created=reply.created, model=body.model, usage=usage(done, plan_),
            localspec=extension(b, done, plan_, job, who),
            choices=[CompletionChoice(
                text=echo + done.text, finish_reason=done.finish_reason,
                logprobs=completion_logprobs(b, tokens, TextOffsets(len(echo))) if body.logprobs is not None else None,
            )],
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
    """One completion: its id, and its chunks when streamed."""

    def __init__(self, state: ServerState, b: Backend, body: CompletionRequest, plan_: translate.Plan, job: Job,
                 who: str, echo: str) -> None:
        super().__init__(state, b, plan_, job, who)
        self.body = body
        self.echo = echo
        self.id = f"cmpl-{job.id}"
        self.offsets = TextOffsets(len(echo))  # one count through the chunks: text_offset is the choice's

    def chunk(self, text: str, **kw: Any) -> Completion:
        return Completion(id=self.id, created=self.created, model=self.body.model,
                          choices=[CompletionChoice(text=text, **kw)])

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
        out = [sse(final)]
        if self.body.stream_options and self.body.stream_options.include_usage:
            out.append(sse(Completion(id=self.id, created=self.created, model=self.body.model, choices=[],
                                      usage=usage(done, self.plan))))
        return out
