"""llama.cpp's server API on the endpoint (see server/llamacpp.py): /completion, /infill, /tokenize,
/detokenize, /apply-template and /props. Errors here are llama-server's
`{"error": {"code", "message", "type"}}`."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from localspec import __version__
from localspec.engine.events import Done
from localspec.errors import RequestError
from localspec.jobs import Job
from localspec.server import translate
from localspec.server.backend import Backend
from localspec.server.choices import cancel_unfinished, submit_all
from localspec.server.errors import LLAMACPP_ERROR_RESPONSES, APIError, ClientGone, llamacpp_error
from localspec.server.llamacpp import (INFILL_FIELDS, LLAMACPP_DEFAULT_TEMPERATURE, LLAMACPP_FIELDS, REPO_MARKERS,
                                       ApplyTemplateRequest, Cutoff, DetokenizeRequest, Finished, InfillPrompt,
                                       InfillRequest, NativeCompletionRequest, NativeGeneration, TokenizeRequest,
                                       Tokenizer, completion_request, final_answer, infill_prompt, native_plan,
                                       partial_answer, picked, stop_type, token_piece)
from localspec.server.replies import unfinished
from localspec.server.routes.completions import has_single_tokens
from localspec.server.routes.models import catalog
from localspec.server.routes.plans import SSE_CONTENT, plan, valid_or_400
from localspec.server.schemas import CompletionRequest
from localspec.server.state import Principal, ServerState, State
from localspec.server.streaming import SSE_KEEPALIVE, EventStream, Waiting, pieces, unless_disconnected

router = APIRouter(tags=["llama.cpp"])
JSON_OR_SSE = {"description": "one JSON object (an array for n_cmpl > 1), or SSE lines when stream is true",
               "content": {"application/json": {"schema": {}}, **SSE_CONTENT}}


def default_model(state: ServerState) -> str:
    """The model a request that names none gets: the profile's target, as llama-server serves its one
    model (a 503 while the first load runs, as llama-server's "Loading model")."""
    return catalog(state).target_id


@router.post("/completion", response_model=None, responses={**LLAMACPP_ERROR_RESPONSES, 200: JSON_OR_SSE})
@router.post("/completions", response_model=None, responses={**LLAMACPP_ERROR_RESPONSES, 200: JSON_OR_SSE},
             include_in_schema=False)  # llama-server's alias of /completion (not /v1/completions, OpenAI's)
async def completion(body: NativeCompletionRequest, request: Request, state: State,
                     who: Principal) -> JSONResponse | EventStream:
    body.check_served(parallel=state.settings.parallel)
    model = body.model or default_model(state)
    cap = state.settings.max_tokens_cap
    async with state.serving(model, body.keep_alive) as (b, hold):
        endpoint_body = valid_or_400(lambda: completion_request(body, model=model, cap=cap))
        plan_ = await plan(native_plan, body, endpoint_body, cap=cap, fim_ok=False, names=LLAMACPP_FIELDS)
        jobs = await submit_all(state, b, [plan_] * body.n_cmpl, model=model, owner=who)
        kept = state.keep(hold)
    replies = [LlamaCppReply(state, b, plan_, job, body, model=model, index=i) for i, job in enumerate(jobs)]
    return await respond(request, replies, body, kept.release)


@router.post("/infill", response_model=None, responses={**LLAMACPP_ERROR_RESPONSES, 200: JSON_OR_SSE})
async def infill(body: InfillRequest, request: Request, state: State, who: Principal) -> JSONResponse | EventStream:
    """Fill-in-the-middle for editors (llama.vscode, llama.vim): see `infill_prompt` for the layout."""
    body.check_served(parallel=state.settings.parallel)
    model = body.model or default_model(state)
    cap = state.settings.max_tokens_cap
    async with state.serving(model, body.keep_alive) as (b, hold):
        if not has_single_tokens(b, translate.FIM_MARKERS):
            raise APIError(400, f"The model '{model[:200]}' has no fill-in-the-middle tokens "
                           f"({', '.join(translate.FIM_MARKERS)}), which /infill needs; name a coder model that has "
                           "them (Qwen2.5-Coder) in `model`.", "unsupported_value", "model")
        layout = await asyncio.to_thread(_layout, b, body, cap)
        endpoint_body = valid_or_400(lambda: CompletionRequest(prompt=layout.text, **{**body.common(cap),
                                                                                      "model": model}))
        plan_ = await plan(native_plan, body, endpoint_body, cap=cap, fim_ok=True, names=INFILL_FIELDS)
        # Tokenized part by part: the markers as tokens, the client's code as text (see Prompter.pieces).
        plan_.request = plan_.request.model_copy(update={"prompt_pieces": list(layout.pieces)})
        jobs = await submit_all(state, b, [plan_] * body.n_cmpl, model=model, owner=who)
        kept = state.keep(hold)
    replies = [LlamaCppReply(state, b, plan_, job, body, model=model, index=i, truncated=layout.truncated)
               for i, job in enumerate(jobs)]
    return await respond(request, replies, body, kept.release)


def _layout(b: Backend, body: InfillRequest, cap: int) -> InfillPrompt:
    rt = b.engine.target
    tok = Tokenizer(encode=lambda text: rt.tokenize(text, add_special=False, parse_special=False),
                    decode=rt.detokenize)
    n_ctx = rt.n_ctx_seq
    # The answer's room: n_predict, within a quarter of the context (-1 asks for the cap, which could
    # leave the code around the cursor no room at all).
    return infill_prompt(body, tok, n_ctx=n_ctx, n_predict=min(body.max_tokens(cap), n_ctx // 4),
                         repo_level=has_single_tokens(b, REPO_MARKERS))


async def respond(request: Request, replies: list[LlamaCppReply], body: NativeGeneration,
                  release: Callable[[], None]) -> JSONResponse | EventStream:
    if body.stream:  # one reply: check_served refuses n_cmpl > 1 with stream
        return EventStream(replies[0].stream(), on_close=release)
    try:
        finished = await unless_disconnected(request, asyncio.gather(*(r.finish() for r in replies)))
        if finished is None:
            raise ClientGone
        answers = [picked(r.answer(f, streamed=False), body.response_fields)
                   for r, f in zip(replies, finished, strict=True)]
        return JSONResponse(answers[0] if len(answers) == 1 else answers)
    finally:
        cancel_unfinished(r.job for r in replies)
        release()


class LlamaCppReply:
    """One answer in llama-server's shapes, with the editors' cut-offs (`Cutoff`) applied as it streams:
    a cut cancels the job, whose last event still brings the counts."""

    def __init__(self, state: ServerState, b: Backend, plan_: translate.Plan, job: Job, body: NativeGeneration, *,
                 model: str, index: int = 0, truncated: bool = False) -> None:
        self.state, self.b, self.plan, self.job, self.body = state, b, plan_, job, body
        self.model, self.index, self.truncated = model, index, truncated
        self.cutoff = Cutoff(n_indent=body.n_indent, t_max_predict_ms=body.t_max_predict_ms)

    async def events(self) -> AsyncIterator[str | Waiting | Finished]:
        """The text the answer keeps, piece by piece, then how it finished (or the APIError of an
        answer that did not)."""
        async for item in pieces(self.job, self.state.metrics):
            if isinstance(item, Waiting):
                yield item
            elif isinstance(item, Done):
                yield self.finished(item)
                return
            elif not self.cutoff.stopped and item.text:
                kept = self.cutoff.feed(item.text)
                if kept and not self.body.prompt_only:
                    yield kept
                if self.cutoff.stopped:
                    self.job.cancel()  # the rest is not wanted: free the slot now

    def finished(self, done: Done) -> Finished:
        cut = self.cutoff.stopped
        if not (cut and done.finish_reason == "cancelled") and (err := unfinished(done)) is not None:
            raise err
        return Finished(self.cutoff.text if cut else done.text, done, stop_type(done, cut=cut), self.truncated)

    async def finish(self) -> Finished:
        async for item in self.events():
            if isinstance(item, Finished):
                return item
        raise RuntimeError("a job's events ended without a Done")

    def answer(self, fin: Finished, *, streamed: bool) -> dict[str, Any]:
        s = self.plan.request.sampling
        settings = {"n_predict": self.body.n_predict if self.body.n_predict is not None else -1,
                    "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p,
                    "repeat_penalty": s.repeat_penalty, "stop": self.plan.request.stop, "stream": self.body.stream,
                    "n_indent": self.body.n_indent, "t_max_predict_ms": self.body.t_max_predict_ms}
        return final_answer(fin, model=self.model, n_ctx=self.b.engine.target.n_ctx_seq, settings=settings,
                            prompt_only=self.body.prompt_only, streamed=streamed, index=self.index)

    async def stream(self) -> AsyncIterator[bytes]:
        try:
            async for item in self.events():
                if isinstance(item, Waiting):
                    yield SSE_KEEPALIVE
                elif isinstance(item, Finished):
                    yield _sse(picked(self.answer(item, streamed=True), self.body.response_fields))
                else:
                    yield _sse(partial_answer(item, index=self.index))
        except APIError as err:  # after the 200: llama-server's error object as the last line
            yield _sse(llamacpp_error(err.status, err.message))


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


# ---------------------------------------------------------------- tokens and properties


def _piece(b: Backend, token: int) -> bytes:
    """A token's bytes, a special token's own text (which llama-server shows, and the model's piece leaves out)."""
    rt = b.engine.target
    return rt.piece(token) or rt.token_text(token).encode()


@router.post("/tokenize", responses=LLAMACPP_ERROR_RESPONSES)
async def tokenize(body: TokenizeRequest, state: State) -> dict[str, Any]:
    model = body.model or default_model(state)
    async with state.serving(model, None) as (b, _):
        ids = await asyncio.to_thread(b.engine.target.tokenize, body.content, body.add_special, body.parse_special)
        if not body.with_pieces:
            return {"tokens": ids}
        return {"tokens": [token_piece(i, _piece(b, i)).model_dump() for i in ids]}


@router.post("/detokenize", responses=LLAMACPP_ERROR_RESPONSES)
async def detokenize(body: DetokenizeRequest, state: State) -> dict[str, str]:
    model = body.model or default_model(state)
    async with state.serving(model, None) as (b, _):
        n_vocab = b.engine.target.n_vocab
        if (bad := next((t for t in body.tokens if not 0 <= t < n_vocab), None)) is not None:
            raise APIError(400, f"tokens: {bad} is not a token of this model (its ids are 0 to {n_vocab - 1}).",
                           "invalid_value", "tokens")
        text = b"".join(_piece(b, t) for t in body.tokens).decode("utf-8", errors="replace")
        return {"content": text}


@router.post("/apply-template", responses=LLAMACPP_ERROR_RESPONSES)
async def apply_template(body: ApplyTemplateRequest, state: State) -> dict[str, str]:
    """The prompt a chat request decodes from, as text: the messages (and tools) through the model's chat
    template, sandboxed as for chat, the assistant's turn opened. Nothing is generated; a client edits it
    (an answer's first words) and sends it to /completion."""
    model = body.model or default_model(state)
    async with state.serving(model, None) as (b, _):
        chat = valid_or_400(body.chat, model=model)
        request = (await plan(translate.chat_plan, chat, state.settings.max_tokens_cap)).request
        try:
            variables = b.engine.with_defaults(request).template_vars  # the model's own under the request's
            text = await asyncio.to_thread(functools.partial(b.engine.prompter.text, request.messages or [],
                                                             request.tools, variables=variables))
        except RequestError as exc:  # the template failed, or was refused when the model loaded
            raise APIError(400, str(exc), "invalid_request", "messages") from exc
    return {"prompt": text}


@router.get("/props", responses=LLAMACPP_ERROR_RESPONSES)
async def props(state: State, model: str | None = None) -> dict[str, Any]:
    """What llama-server's clients read before their first request: the context size per request,
    the slots, the chat template. The model is named by its file's name (this server never sends
    where files live), and loaded first if it is not."""
    name = model or default_model(state)
    async with state.serving(name, None) as (b, _):
        rt = b.engine.target
        return {"default_generation_settings": {
                    "id": 0, "id_task": -1, "n_ctx": rt.n_ctx_seq, "speculative": b.draft_id is not None,
                    "is_processing": False,
                    "params": {"n_predict": -1, "temperature": LLAMACPP_DEFAULT_TEMPERATURE,
                               "max_tokens": state.settings.max_tokens_cap}},
                "total_slots": state.settings.parallel, "model_alias": name, "model_path": rt.path.name,
                "chat_template": rt.chat_template or "", "modalities": {"vision": False, "audio": False},
                "build_info": f"localspec {__version__}", "is_sleeping": False}
