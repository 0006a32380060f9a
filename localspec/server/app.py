"""The FastAPI app: OpenAI-compatible routes over the request pipeline.

Requests are admitted while fewer than `parallel + max_queue` are unfinished (else 429), submitted
to the pipeline (cache lookup, then the engine worker), and their events read from the job's
queue. A client that goes away cancels its request, which frees the slot at the engine's next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import queue
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import ValidationError

from localspec import __version__
from localspec.engine.events import Done, Token
from localspec.errors import ContextOverflowError, LocalspecError, RequestError
from localspec.pipeline import Job
from localspec.server import translate
from localspec.server.backend import Backend, Loader
from localspec.server.embeddings import encode
from localspec.server.errors import ERROR_RESPONSES, APIError, error_json
from localspec.server.errors import install as install_errors
from localspec.server.guards import (LOCAL_PRINCIPAL, PRINCIPAL_KEY, Allowed, Auth, BodyLimit, HostGuard,
                                     loopback_origin_regex)
from localspec.server.redact import redact_paths
from localspec.server.schemas import (
    CacheVerdict,
    CacheVerdictRequest,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatMessageOut,
    ChoiceLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    Embedding,
    EmbeddingList,
    EmbeddingRequest,
    EmbeddingUsage,
    Extension,
    Health,
    ModelCard,
    ModelList,
    TokenLogprobOut,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from localspec.server.settings import ServerSettings

_POLL_S = 0.004  # how often a waiting handler looks at its event queue
# Before OpenAPI 3.2 an event stream's `schema` describes one event (its `data:` field), not the whole body.
_SSE = {"text/event-stream": {"schema": {
    "type": "object", "required": ["data"],
    "properties": {"data": {"type": "string", "description": "a chunk's JSON; the last event is [DONE]"},
                   "event": {"type": "string"}},
}}}


class Admission:
    """Counts unfinished requests; beyond slots + queue the next one gets a 429."""

    def __init__(self, capacity: int, retry_after_s: int) -> None:
        self.capacity = capacity
        self.retry_after_s = retry_after_s
        self.handles: set[Job] = set()
        self.held = 0  # work admitted outside the engine (embeddings), counted against the same capacity

    def unfinished(self) -> int:
        self.handles = {h for h in self.handles if not h.done.is_set()}
        return len(self.handles) + self.held

    def check(self) -> None:
        if self.unfinished() >= self.capacity:
            raise APIError(429, f"The server is busy ({self.capacity} requests running or queued). Retry shortly.",
                           "queue_full", headers={"Retry-After": str(self.retry_after_s)})

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Admit one piece of work that is not an engine job, for as long as the block runs."""
        self.check()
        self.held += 1
        try:
            yield
        finally:
            self.held -= 1


def create_app(
    settings: ServerSettings | None = None, load: Callable[[ServerSettings], Backend] | None = None,
    metrics: Any | None = None,
) -> FastAPI:
    """The ASGI app. `load` builds the backend (default: the profile's models); it runs on a thread."""
    s = settings or ServerSettings()
    loader = Loader(s, load)
    admission = Admission(s.parallel + s.max_queue, s.retry_after_s)
    if metrics is None:
        from localspec.metrics import Metrics

        metrics = Metrics.from_settings(registry=CollectorRegistry())

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        loader.start()
        yield
        # uvicorn has already let running requests finish (its graceful timeout); cancel the rest.
        await asyncio.to_thread(loader.close, False)
        metrics.close()

    app = FastAPI(
        title="localspec", version=__version__, lifespan=lifespan,
        description="OpenAI-compatible local inference with lossless speculative decoding.",
    )
    app.state.loader = loader
    app.state.admission = admission
    app.state.metrics = metrics
    install_errors(app)

    def backend() -> Backend:
        if loader.backend is None:
            if loader.error:
                raise APIError(503, f"Loading the models failed: {redact_paths(loader.error)}", "model_load_failed")
            raise APIError(503, "The models are still loading; retry in a few seconds.", "model_loading",
                           headers={"Retry-After": str(s.retry_after_s)})
        return loader.backend

    def queue_depth(b: Backend) -> int:
        """Admitted requests that are not in a slot yet."""
        return max(0, admission.unfinished() - sum(slot.active is not None for slot in b.engine.slots))

    def check_model(b: Backend, name: str, names: set[str]) -> None:
        if name not in names:
            served = ", ".join(sorted(names)) or "none"
            raise APIError(404, f"The model '{name}' does not exist on this server (serving: {served}).",
                           "model_not_found", "model")

    async def submit(b: Backend, plan: translate.Plan, model: str, principal: str) -> Job:
        admission.check()
        try:
            job = await asyncio.to_thread(b.pipeline.submit, plan.request, b.route_for(model), plan.grammar,
                                          plan.cache, owner=principal)
        except ContextOverflowError as exc:
            raise APIError(
                400, f"This prompt has {exc.prompt_tokens} tokens but the model's context holds {exc.n_ctx} tokens "
                f"per request (prompt_tokens={exc.prompt_tokens}, n_ctx={exc.n_ctx}).",
                "context_length_exceeded", "messages",
            ) from exc
        except LocalspecError as exc:
            raise APIError(400, str(exc), "invalid_request") from exc
        admission.handles.add(job)
        metrics.set_queue_depth(queue_depth(b))
        return job

    async def events(b: Backend, job: Job, request: Request | None) -> AsyncIterator[Token | Done]:
        """The job's events; cancels the request if the client disconnects or the reader stops."""
        last = None
        polls = 0
        try:
            while True:
                try:
                    ev = job.events.get_nowait()
                except queue.Empty:
                    polls += 1
                    if request is not None and polls % 50 == 0 and await request.is_disconnected():
                        return
                    await asyncio.sleep(_POLL_S)
                    continue
                if isinstance(ev, Token) and ev.ids:
                    now = time.perf_counter()
                    if last is not None:
                        metrics.observe_inter_token(now - last)
                    last = now
                yield ev
                if isinstance(ev, Done):
                    return
        finally:
            if not job.done.is_set():
                job.cancel()

    async def text_pieces(b: Backend, job: Job, hold_text: bool = False) -> AsyncIterator[tuple[str, list[Token]] | Done]:
        """A streamed answer: (text, the logprob-carrying tokens behind it) as text becomes certain,
        then the Done. Tokens not yet reported come as one ("", tokens) pair before the Done; with
        `hold_text` that is every token."""
        pending: list[Token] = []
        async for ev in events(b, job, None):
            if isinstance(ev, Done):
                if pending:
                    yield "", pending
                yield ev
                return
            if ev.logprob is not None:
                pending.append(ev)
            if ev.text and not hold_text:
                yield ev.text, pending
                pending = []

    async def collect(b: Backend, job: Job, request: Request) -> tuple[list[Token], Done | None]:
        """A non-streamed answer: its tokens that carry logprobs, and the Done (None if the client left)."""
        tokens: list[Token] = []
        done = None
        async for ev in events(b, job, request):
            if isinstance(ev, Done):
                done = ev
            elif ev.logprob is not None:
                tokens.append(ev)
        return tokens, done

    def finish(b: Backend, job: Job, done: Done, t0: float, rid: str) -> None:
        from localspec.metrics import RequestRecord

        metrics.set_queue_depth(queue_depth(b))
        metrics.record(RequestRecord.from_stats(
            done.stats, face="api", profile=b.profile, target_model=b.target_id, draft_model=b.draft_id,
            finish_reason=done.finish_reason, e2e_ms=(time.perf_counter() - t0) * 1000, request_id=rid,
            error_class="engine" if done.finish_reason == "error" else None,
            cache=job.cache.status if job.cache and job.cache.status != "bypass" else None,
            cache_similarity=job.cache.similarity if job.cache else None,
            route=job.route["tier"] if job.route else job.tier,
            route_reason=job.route["reason"] if job.route else None,
        ))

    def cache_info(job: Job, who: str) -> dict[str, Any] | None:
        """The cache's part of the response; a hit carries the token that lets its owner mark it wrong."""
        if job.cache is None:
            return None
        info = job.cache.as_dict()
        if job.cache.entry_id and loader.backend is not None and loader.backend.pipeline.cache is not None:
            info["verdict_token"] = loader.backend.pipeline.cache.verdict_token(job.cache.entry_id, who)
        return info

    def extension(done: Done, plan: translate.Plan, job: Job, who: str) -> Extension:
        st = done.stats
        return Extension(
            mode=st.mode, k=plan.request.k, grammar="enforced" if plan.grammar else "none", fallback=plan.fallback,
            drafted=st.drafted, accepted=st.accepted, acceptance_rate=round(st.acceptance_rate, 4),
            drafted_by_position=st.drafted_by_position, accepted_by_position=st.accepted_by_position,
            prompt_tokens=st.prompt_tokens, reused_prefix_tokens=st.reused_prefix_tokens,
            timings={
                "prefill_ms": round(st.prefill_ms, 2), "ttft_ms": round(st.ttft_ms, 2),
                "decode_ms": round(st.decode_ms, 2), "tokens_per_second": round(st.tokens_per_second, 2),
            },
            cache=cache_info(job, who),
            route=job.route,
        )

    def usage(done: Done) -> Usage:
        st = done.stats
        return Usage(prompt_tokens=st.prompt_tokens, completion_tokens=st.completion_tokens,
                     total_tokens=st.prompt_tokens + st.completion_tokens)

    def piece(b: Backend, token: int) -> tuple[str, list[int]]:
        raw = b.engine.target.piece(token)
        return raw.decode("utf-8", errors="replace"), list(raw)

    def chat_logprobs(b: Backend, tokens: list[Token]) -> ChoiceLogprobs:
        out = []
        for t in tokens:
            lp = t.logprob
            text, raw = piece(b, lp.token)
            top = [TopLogprob(token=piece(b, i)[0], logprob=v, bytes=piece(b, i)[1]) for i, v in lp.top]
            out.append(TokenLogprobOut(token=text, logprob=lp.logprob, bytes=raw, top_logprobs=top))
        return ChoiceLogprobs(content=out)

    def completion_logprobs(b: Backend, tokens: list[Token]) -> CompletionLogprobs:
        texts, lps, tops, offsets, off = [], [], [], [], 0
        for t in tokens:
            text = piece(b, t.logprob.token)[0]
            texts.append(text)
            lps.append(t.logprob.logprob)
            tops.append({piece(b, i)[0]: v for i, v in t.logprob.top})
            offsets.append(off)
            off += len(text)
        return CompletionLogprobs(tokens=texts, token_logprobs=lps, top_logprobs=tops, text_offset=offsets)

    def engine_failed(done: Done) -> None:
        if done.finish_reason == "error":
            raise APIError(500, f"Generation failed: {done.error}", "engine_error")

    def plan_or_400(fn, *args) -> translate.Plan:
        try:
            return fn(*args)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or None
            raise APIError(400, f"{field}: {err['msg']}" if field else err["msg"], "invalid_value", field) from exc

    async def plan(fn, *args) -> translate.Plan:
        """Schema checks and grammar conversion cost CPU: never on the event loop."""
        return await asyncio.to_thread(plan_or_400, fn, *args)

    def principal(request: Request) -> str:
        return str(request.scope.get(PRINCIPAL_KEY, LOCAL_PRINCIPAL))

    def sse(obj) -> bytes:
        return b"data: " + obj.model_dump_json(exclude_none=True).encode() + b"\n\n"

    # ------------------------------------------------------------------ routes

    @app.get("/health", response_model=Health, responses={503: {"model": Health, "description": "Loading"}})
    async def health() -> JSONResponse:
        state = loader.state
        body = Health(status=state, detail=redact_paths(loader.error) if loader.error else None)
        return JSONResponse(body.model_dump(exclude_none=True), 200 if state == "ok" else 503)

    @app.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
    async def prometheus() -> Response:
        if loader.backend is not None:
            metrics.set_queue_depth(queue_depth(loader.backend))
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", response_model=ModelList, responses=ERROR_RESPONSES)
    async def list_models() -> ModelList:
        b = backend()
        cards = [ModelCard(id=n, localspec={"model": b.model_behind(n), "role": "chat", "route": b.route_for(n) or "large"})
                 for n in sorted(b.target_names)]
        cards += [ModelCard(id=n, localspec={"model": b.embedding_id, "role": "embedding"}) for n in sorted(b.embedding_names)]
        return ModelList(data=cards)

    @app.get("/v1/models/{model_id}", response_model=ModelCard, responses=ERROR_RESPONSES)
    async def get_model(model_id: str) -> ModelCard:
        b = backend()
        check_model(b, model_id, b.target_names | b.embedding_names)
        return ModelCard(id=model_id)

    @app.post(
        "/v1/chat/completions", response_model=ChatCompletion,
        responses={**ERROR_RESPONSES, 200: {"content": _SSE, "description": "JSON, or SSE chunks when stream=true"}},
    )
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        b = backend()
        check_model(b, body.model, b.target_names)
        who = principal(request)
        plan_ = await plan(translate.chat_plan, body, s.max_tokens_cap)
        t0 = time.perf_counter()
        job = await submit(b, plan_, body.model, who)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        if body.stream:
            return StreamingResponse(
                stream_chat(b, body, plan_, job, rid, created, t0, who), media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        tokens, done = await collect(b, job, request)
        if done is None:  # the client went away
            return Response(status_code=499)
        finish(b, job, done, t0, rid)
        engine_failed(done)
        content, calls = done.text, []
        if plan_.tool_mode:
            content, calls = translate.parse_tool_calls(done.text, plan_.tool_mode == "forced")
        reason = "tool_calls" if calls else done.finish_reason
        return ChatCompletion(
            id=rid, created=created, model=body.model, usage=usage(done), localspec=extension(done, plan_, job, who),
            choices=[ChatChoice(
                message=ChatMessageOut(content=content, tool_calls=calls or None), finish_reason=reason,
                logprobs=chat_logprobs(b, tokens) if body.logprobs else None,
            )],
        )

    async def stream_chat(b, body: ChatCompletionRequest, plan, job, rid, created, t0, who) -> AsyncIterator[bytes]:
        def chunk(delta: ChatDelta, **kw) -> ChatCompletionChunk:
            return ChatCompletionChunk(id=rid, created=created, model=body.model,
                                       choices=[ChatChunkChoice(delta=delta, **kw)])

        yield sse(chunk(ChatDelta(role="assistant", content="")))
        pending_lp: list[Token] = []
        done = None
        # Tool answers are parsed whole, at the end: hold their text.
        async for item in text_pieces(b, job, hold_text=bool(plan.tool_mode)):
            if isinstance(item, Done):
                done = item
                break
            text, tokens = item
            if not text:
                pending_lp = tokens
                continue
            yield sse(chunk(ChatDelta(content=text), logprobs=chat_logprobs(b, tokens) if body.logprobs else None))
        if done is None:
            return
        finish(b, job, done, t0, rid)
        if done.finish_reason == "error":
            err = error_json(500, f"Generation failed: {done.error}", "engine_error")
            yield b"data: " + json.dumps(err).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
            return
        reason = done.finish_reason
        if plan.tool_mode:
            content, calls = translate.parse_tool_calls(done.text, plan.tool_mode == "forced")
            if calls:
                reason = "tool_calls"
                deltas = [ToolCallDelta(index=i, id=c.id, type="function", function=c.function) for i, c in enumerate(calls)]
                yield sse(chunk(ChatDelta(tool_calls=deltas)))
            if content:
                yield sse(chunk(ChatDelta(content=content)))
        lp = chat_logprobs(b, pending_lp) if body.logprobs and pending_lp else None
        final = chunk(ChatDelta(), finish_reason=reason, logprobs=lp)
        final.localspec = extension(done, plan, job, who)
        yield sse(final)
        if body.stream_options and body.stream_options.include_usage:
            yield sse(ChatCompletionChunk(id=rid, created=created, model=body.model, choices=[], usage=usage(done)))
        yield b"data: [DONE]\n\n"

    @app.post(
        "/v1/completions", response_model=Completion,
        responses={**ERROR_RESPONSES, 200: {"content": _SSE, "description": "JSON, or SSE chunks when stream=true"}},
    )
    async def completions(body: CompletionRequest, request: Request):
        b = backend()
        check_model(b, body.model, b.target_names)
        who = principal(request)
        plan_ = await plan(translate.completion_plan, body, s.max_tokens_cap, fim_supported(b))
        t0 = time.perf_counter()
        job = await submit(b, plan_, body.model, who)
        rid = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        echo = body.prompt if (body.echo and body.suffix is None and isinstance(body.prompt, str)) else ""
        if body.stream:
            return StreamingResponse(
                stream_completion(b, body, plan_, job, rid, created, t0, echo, who), media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        tokens, done = await collect(b, job, request)
        if done is None:
            return Response(status_code=499)
        finish(b, job, done, t0, rid)
        engine_failed(done)
        return Completion(
            id=rid, created=created, model=body.model, usage=usage(done), localspec=extension(done, plan_, job, who),
            choices=[CompletionChoice(
                text=echo + done.text, finish_reason=done.finish_reason,
                logprobs=completion_logprobs(b, tokens) if body.logprobs is not None else None,
            )],
        )

    async def stream_completion(b, body: CompletionRequest, plan, job, rid, created, t0, echo, who) -> AsyncIterator[bytes]:
        def chunk(text: str, **kw) -> Completion:
            return Completion(id=rid, created=created, model=body.model, choices=[CompletionChoice(text=text, **kw)])

        if echo:
            yield sse(chunk(echo, finish_reason=None))
        done = None
        async for item in text_pieces(b, job):
            if isinstance(item, Done):
                done = item
                break
            text, tokens = item
            if text:
                lp = completion_logprobs(b, tokens) if body.logprobs is not None else None
                yield sse(chunk(text, finish_reason=None, logprobs=lp))
        if done is None:
            return
        finish(b, job, done, t0, rid)
        if done.finish_reason == "error":
            yield b"data: " + json.dumps(error_json(500, f"Generation failed: {done.error}", "engine_error")).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
            return
        final = chunk("", finish_reason=done.finish_reason)
        final.localspec = extension(done, plan, job, who)
        yield sse(final)
        if body.stream_options and body.stream_options.include_usage:
            yield sse(Completion(id=rid, created=created, model=body.model, choices=[], usage=usage(done)))
        yield b"data: [DONE]\n\n"

    def fim_supported(b: Backend) -> bool:
        rt = b.engine.target
        for marker in (translate.FIM_PREFIX, translate.FIM_SUFFIX, translate.FIM_MIDDLE):
            ids = rt.tokenize(marker, add_special=False, parse_special=True)
            if len(ids) != 1 or rt.token_text(ids[0]) != marker:
                return False
        return True

    @app.post("/v1/embeddings", response_model=EmbeddingList, responses=ERROR_RESPONSES)
    async def embeddings(body: EmbeddingRequest) -> EmbeddingList:
        b = backend()
        check_model(b, body.model, b.embedding_names)
        texts = [body.input] if isinstance(body.input, str) else body.input
        if not texts or not all(isinstance(t, str) for t in texts):
            raise APIError(400, "input must be a string or a non-empty list of strings (token ids are not supported).",
                           "invalid_value", "input")
        if len(texts) > s.max_embedding_inputs:
            raise APIError(400, f"input has {len(texts)} texts; this server embeds at most {s.max_embedding_inputs} "
                           "per request. Send them in several requests.", "too_many_inputs", "input")
        if body.dimensions is not None:
            raise APIError(400, "dimensions is not supported by this embedding model.", "unsupported_value", "dimensions")
        with admission.hold():  # embeddings share the server's capacity with generations
            try:
                model = await asyncio.to_thread(b.embedder)
            except (LocalspecError, ValueError) as exc:  # a broken embedding file: the server is fine, this model is not
                raise APIError(503, f"The embedding model cannot be loaded: {redact_paths(str(exc))}",
                               "model_unusable") from exc
            try:
                vectors, n = await asyncio.to_thread(model.embed, texts, max_tokens=s.max_embedding_tokens)
            except RequestError as exc:
                raise APIError(400, str(exc), "invalid_value", "input") from exc
        data = [Embedding(index=i, embedding=encode(v, body.encoding_format)) for i, v in enumerate(vectors)]
        return EmbeddingList(data=data, model=body.model, usage=EmbeddingUsage(prompt_tokens=n, total_tokens=n))

    @app.post("/v1/cache/{entry_id}/wrong", response_model=CacheVerdict, responses=ERROR_RESPONSES)
    async def mark_cached_wrong(entry_id: str, body: CacheVerdictRequest, request: Request) -> CacheVerdict:
        """The answer served from this cache entry was wrong: evict it and count a false hit. Only the
        client the answer was served to can: it sends the `verdict_token` from that response."""
        b = backend()
        if not re.fullmatch(r"[0-9a-f]{32}", entry_id):
            raise APIError(400, "entry_id is the 32-hex-digit id from a response's localspec.cache.entry_id.",
                           "invalid_value", "entry_id")
        cache = b.pipeline.cache
        if cache is None or not hmac.compare_digest(cache.verdict_token(entry_id, principal(request)), body.token):
            raise APIError(403, "This token does not mark that entry: send the verdict_token from the response that "
                           "served it (localspec.cache.verdict_token), with the same API key.", "invalid_token", "token")
        if not await asyncio.to_thread(b.pipeline.mark_wrong, entry_id):
            raise APIError(404, f"No cache entry {entry_id} (already evicted or expired).", "not_found", "entry_id")
        return CacheVerdict(entry_id=entry_id, evicted=True)

    @app.get("/v1/cache/stats", response_model=dict, responses=ERROR_RESPONSES)
    async def cache_stats() -> dict:
        b = backend()
        cache = b.pipeline.cache
        if cache is None:
            return {"mode": "off", "detail": "started with --no-cache"}
        stats = {k: v for k, v in (await asyncio.to_thread(cache.stats)).items() if k != "directory"}
        return {"mode": cache.mode, "detail": redact_paths(cache.describe()), "judge": b.pipeline.semantic_judge,
                **stats, "description": redact_paths(str(stats.get("description", "")))}

    # Each add_middleware wraps what is there: the last added runs first. Outermost to innermost:
    # host/origin guard (no keys), body limit, CORS (answers preflights before auth), auth (keys).
    keys = s.keys()
    if keys:
        app.add_middleware(Auth, keys=keys)
    from fastapi.middleware.cors import CORSMiddleware

    app.add_middleware(CORSMiddleware, allow_origins=s.origins, allow_origin_regex=loopback_origin_regex(),
                       allow_methods=["*"], allow_headers=["*"])
    app.add_middleware(BodyLimit, limit=s.max_body_bytes)
    if not keys:
        allowed = Allowed.build(bound_host=s.host, extra_hosts=s.allowed_hosts, extra_origins=s.origins)
        app.add_middleware(HostGuard, allowed=allowed)
    return app
