"""Ollama's API on the endpoint (see server/ollama.py): chat, generate, embed, and the listings
its clients read first (version, tags, show, ps). Errors here are Ollama's `{"error": "..."}`."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

from localspec.engine.events import Done
from localspec.jobs import Job
from localspec.server import translate
from localspec.server.backend import Backend
from localspec.server.errors import OLLAMA_ERROR_RESPONSES, APIError
from localspec.server.keepalive import parse_keep_alive
from localspec.server.model_store import StoredModel
from localspec.server.ollama import (OLLAMA_API_VERSION, OLLAMA_FIELDS, AssistantMessage, ChatLine, GenerateLine,
                                     LegacyEmbeddingRequest, OllamaChatRequest, OllamaEmbedRequest,
                                     OllamaGenerateRequest, ShowRequest, Timings, chat_request, done_reason,
                                     generate_request, ndjson, ollama_calls, tagged)
from localspec.server.replies import StreamedReply, unsent
from localspec.server.routes import embeddings as openai_embeddings
from localspec.server.routes.completions import fim_in_vocabulary, fim_supported
from localspec.server.routes.models import cards
from localspec.server.routes.plans import plan, valid_or_400, with_thinking
from localspec.server.routes.ps import ps as openai_ps
from localspec.server.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, ModelInfo, ToolCall
from localspec.server.state import Principal, ServerState, State
from localspec.server.streaming import EventStream, Piece

router = APIRouter(tags=["ollama"])
NDJSON = "application/x-ndjson"
AN_OBJECT = {"schema": {"type": "object"}}
NDJSON_OR_JSON = {"description": "NDJSON lines (stream true, the default), or one JSON object",
                  "content": {NDJSON: AN_OBJECT, "application/json": AN_OBJECT}}
RUNNING = "Ollama is running"  # Ollama's answer at its root, which its clients probe before a request


class JsonBodies:
    """Ollama reads a body as JSON whatever its Content-Type says (Go's decoder on the raw bytes):
    litellm's `ollama/` and `ollama_chat/` send none (`application/octet-stream` from its async
    client), Ollama's own curl examples send curl's form type. FastAPI reads JSON only under a JSON
    type, and each of those was a 400, so on Ollama's routes the body is read as JSON whatever its
    type. A web page's form post is still refused by the host and origin guard, or the key, first."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/api/"):
            headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


class Shape(Enum):
    """Which of Ollama's answers a reply is: a chat message, or generate's `response` text."""

    CHAT = "chat"
    GENERATE = "generate"


@router.post("/api/chat", response_model=None, responses={**OLLAMA_ERROR_RESPONSES, 200: NDJSON_OR_JSON})
async def chat(body: OllamaChatRequest, request: Request, state: State, who: Principal) -> JSONResponse | EventStream:
    if not body.messages:  # Ollama's way to load (or, keep_alive 0, unload) a model
        return await load_only(state, body.model, body.keep_alive, Shape.CHAT)
    return await answer(state, request, who, valid_or_400(chat_request, body), Shape.CHAT)


@router.post("/api/generate", response_model=None, responses={**OLLAMA_ERROR_RESPONSES, 200: NDJSON_OR_JSON})
async def generate(body: OllamaGenerateRequest, request: Request, state: State,
                   who: Principal) -> JSONResponse | EventStream:
    if not body.prompt and body.suffix is None:
        return await load_only(state, body.model, body.keep_alive, Shape.GENERATE)
    return await answer(state, request, who, valid_or_400(generate_request, body), Shape.GENERATE)


async def answer(state: ServerState, request: Request, who: str, body: ChatCompletionRequest | CompletionRequest,
                 shape: Shape) -> JSONResponse | EventStream:
    """The endpoint's path for a translated request, answered in Ollama's shape. A num_predict past the
    server's cap is the cap, as Ollama bounds it by the context rather than refusing: Continue sends its
    maxTokens (4096) and Open WebUI the user's setting on every request, and a 400 stopped them all."""
    t0 = time.perf_counter()
    cap = state.settings.max_tokens_cap
    if body.max_tokens is not None and body.max_tokens > cap:
        body = body.model_copy(update={"max_tokens": cap})
    async with state.serving(body.model, body.keep_alive) as (b, hold):
        if isinstance(body, ChatCompletionRequest):
            plan_ = await plan(translate.chat_plan, body, state.settings.max_tokens_cap, OLLAMA_FIELDS)
            plan_ = await with_thinking(plan_, b)
        else:
            plan_ = await plan(translate.completion_plan, body, state.settings.max_tokens_cap, fim_supported(b),
                               OLLAMA_FIELDS)
        job = await state.submit(b, plan_, model=body.model, owner=who)
        kept = state.keep(hold)
    reply = OllamaReply(state, b, plan_, job, who, model=body.model, shape=shape, t0=t0)
    if body.stream:
        return EventStream(reply.stream(), on_close=kept.release, media_type=NDJSON)
    try:
        _, done = await reply.whole(request)
        return JSONResponse(reply.last(done, whole=True))
    finally:
        kept.release()


async def load_only(state: ServerState, model: str, keep_alive: str | float | None, shape: Shape) -> JSONResponse:
    """A request with nothing to say loads the model (404 for a name it cannot serve); with
    keep_alive 0 it unloads after it, as Ollama's does."""
    async with state.serving(model, keep_alive):
        pass
    reason = "unload" if keep_alive is not None and parse_keep_alive(keep_alive) == 0 else "load"  # validated
    line: BaseModel = (ChatLine(model=model, message=AssistantMessage(), done=True, done_reason=reason)
                       if shape is Shape.CHAT
                       else GenerateLine(model=model, response="", done=True, done_reason=reason))
    return JSONResponse(line.model_dump(mode="json", exclude_none=True))


class OllamaReply(StreamedReply):
    """One answer as Ollama's lines: a text piece per line, then the last with the counts."""

    closing = None
    keepalive = None  # NDJSON has no comment lines: a waiting stream sends nothing

    def __init__(self, state: ServerState, b: Backend, plan_: translate.Plan, job: Job, who: str, *, model: str,
                 shape: Shape, t0: float) -> None:
        super().__init__(state, b, plan_, job, who)
        self.model, self.shape, self.t0 = model, shape, t0
        self.id = job.id
        self.text = ""  # streamed so far
        self.thought = ""  # of the thought, streamed so far

    def line(self, text: str, *, thought: str = "", done: Done | None = None,
             calls: list[ToolCall] | None = None) -> BaseModel:
        reason = done_reason(done) if done is not None else None
        if self.shape is Shape.CHAT:
            message = AssistantMessage(content=text, thinking=thought or None, tool_calls=ollama_calls(calls or []))
            return ChatLine(model=self.model, message=message, done=done is not None, done_reason=reason)
        return GenerateLine(model=self.model, response=text, thinking=thought or None, done=done is not None,
                            done_reason=reason)

    def last(self, done: Done, *, whole: bool) -> dict[str, Any]:
        """The finished answer's line: the whole text (or, streamed, only what was held) and the counts."""
        thought, content, calls = self.plan.answer(done.text)
        text, thought = content or "", thought or ""
        if not whole:  # with tools offered or a thought split, the stream held back some; else nothing
            held = self.plan.tool_mode or self.plan.thinking is not None
            text, thought = (unsent(text, self.text), unsent(thought, self.thought)) if held else ("", "")
        timings = Timings.of(done, total_s=time.perf_counter() - self.t0)
        data = self.line(text, thought=thought, done=done, calls=calls).model_dump(mode="json", exclude_none=True)
        return {**data, **timings.model_dump()}

    def piece(self, piece: Piece) -> bytes | None:
        if not piece.text and not piece.thought:
            return None
        self.text += piece.text
        self.thought += piece.thought
        return ndjson(self.line(piece.text, thought=piece.thought))

    def tail(self, done: Done) -> list[bytes]:
        return [json.dumps(self.last(done, whole=False), ensure_ascii=False).encode() + b"\n"]

    def failed(self, err: APIError) -> list[bytes]:
        return [json.dumps({"error": err.message}).encode() + b"\n"]  # Ollama's error line, mid-stream


# ---------------------------------------------------------------- listings and embeddings


@router.post("/api/embed", responses=OLLAMA_ERROR_RESPONSES)
async def embed(body: OllamaEmbedRequest, state: State) -> dict[str, Any]:
    t0 = time.perf_counter()
    vectors = await openai_embeddings.embed(EmbeddingRequest(model=body.model, input=body.input), state,
                                            truncate=body.truncate)
    return {"model": body.model, "embeddings": [v.embedding for v in vectors.data],
            "total_duration": int((time.perf_counter() - t0) * 1e9), "prompt_eval_count": vectors.usage.prompt_tokens}


@router.post("/api/embeddings", responses=OLLAMA_ERROR_RESPONSES)
async def legacy_embeddings(body: LegacyEmbeddingRequest, state: State) -> dict[str, Any]:
    vectors = await openai_embeddings.embed(EmbeddingRequest(model=body.model, input=body.prompt), state,
                                            truncate=True)
    return {"embedding": vectors.data[0].embedding}


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def root() -> PlainTextResponse:
    """The probe Ollama's clients send before anything else (the `ollama` CLI's heartbeat is a HEAD
    here, and it stops at a 404 with "could not connect to ollama app")."""
    return PlainTextResponse(RUNNING)


@router.get("/api/version", responses=OLLAMA_ERROR_RESPONSES)
async def version() -> dict[str, str]:
    """The Ollama API version these routes follow, which clients check (see OLLAMA_API_VERSION)."""
    return {"version": OLLAMA_API_VERSION}


@router.get("/api/tags", responses=OLLAMA_ERROR_RESPONSES)
async def tags(state: State) -> dict[str, Any]:
    """The names a request may use, as Ollama lists its pulled models: tagged (`x:latest`), with the
    installed file's size, digest, family, parameter count and quant (Open WebUI shows the last two
    beside each name); a name for no one file (`auto`, a router tier) has none of them."""
    listed = await cards(state)
    stored = await asyncio.to_thread(_described, state, [c.localspec.model if c.localspec else None for c in listed])
    return {"models": [_tag(card.id, embedding=bool(card.localspec and card.localspec.role == "embedding"),
                            stored=s) for card, s in zip(listed, stored, strict=True)]}


def _described(state: ServerState, model_ids: list[str | None]) -> list[StoredModel | None]:
    seen: dict[str, StoredModel | None] = {}
    for mid in model_ids:
        if mid and mid not in seen:
            seen[mid] = state.store.describe(mid)
    return [seen[mid] if mid else None for mid in model_ids]


def _tag(name: str, *, embedding: bool, stored: StoredModel | None = None) -> dict[str, Any]:
    family = stored.family if stored and stored.family else ("bert" if embedding else "")
    return {"name": tagged(name), "model": tagged(name),
            "modified_at": _iso(stored.modified) if stored else "1970-01-01T00:00:00Z",
            "size": stored.size if stored else 0, "digest": stored.sha256 if stored else "",
            "details": {"format": "gguf", "family": family, "families": [family] if family else None,
                        "parameter_size": stored.parameter_size if stored else "",
                        "quantization_level": stored.quantization if stored else ""}}


@router.post("/api/show", responses=OLLAMA_ERROR_RESPONSES)
async def show(body: ShowRequest, state: State) -> dict[str, Any]:
    """What a client reads before its first request: the model's context length and capabilities.
    The context length is in `model_info` (`<arch>.context_length`, which Copilot and ollama-js users
    read) and in `parameters` as a Modelfile's `num_ctx` line (which Continue reads); VS Code
    Copilot names the model by `general.basename`."""
    listed = {card.id: card for card in await cards(state)}
    card = listed.get(body.model)
    if card is None:
        raise APIError(404, f"model '{body.model[:200]}' not found; GET /api/tags lists the served names.",
                       "model_not_found", "model")
    embedding = bool(card.localspec and card.localspec.role == "embedding")
    stored = await asyncio.to_thread(_described, state, [card.localspec.model if card.localspec else None])
    details = _tag(body.model, embedding=embedding, stored=stored[0])["details"]
    info = {} if embedding else model_info(state, body.model)
    n_ctx = info.get(f"{info.get('general.architecture')}.context_length")
    capabilities = ["embedding"] if embedding else ["completion", "tools"]
    if not embedding and await fills_in_the_middle(state, body.model, card.localspec):
        capabilities.append("insert")  # Continue offers autocomplete (suffix) for a model that says so
    return {"modelfile": "", "parameters": f"num_ctx {n_ctx}" if n_ctx else "", "template": "", "details": details,
            "model_info": {"general.basename": body.model, **info} if info else {}, "capabilities": capabilities}


async def fills_in_the_middle(state: ServerState, name: str, card: ModelInfo | None) -> bool:
    """Whether the model behind `name` has the fill-in-the-middle tokens that `suffix` needs: asked of
    its tokenizer when it is loaded, else read from its GGUF's vocabulary (/api/show loads nothing).
    The loaded one is asked on the event loop, with no await after finding it: /api/show holds nothing,
    and an unload frees a model it detached on the loop (read from a worker thread, it was freed memory)."""
    if (b := _loaded_backend(state, name)) is not None:
        return fim_supported(b)
    if card is None or not card.model:
        return False
    return await asyncio.to_thread(_fim_in_installed, state, card.model)


def _fim_in_installed(state: ServerState, model_id: str) -> bool:
    path = state.models.path_of(model_id)
    return path is not None and fim_in_vocabulary(path)


def _loaded_backend(state: ServerState, name: str) -> Backend | None:
    for r in state.residents():
        b = r.loader.backend
        if b is not None and (name in b.target_names or name in r.names):
            return b
    return None


def model_info(state: ServerState, name: str) -> dict[str, Any]:
    """The GGUF's architecture and the context a request gets, as Ollama keys them
    (`<arch>.context_length`: clients read their context window there), from the loaded engine that
    answers `name`; a model not loaded yet has only the server's --n-ctx, when set."""
    if (b := _loaded_backend(state, name)) is not None:
        arch = b.engine.target.meta("general.architecture") or "unknown"
        return {"general.architecture": arch, f"{arch}.context_length": b.engine.target.n_ctx_seq}
    n_ctx = state.settings.n_ctx
    return {"general.architecture": "unknown", "unknown.context_length": n_ctx} if n_ctx else {}


@router.get("/api/ps", responses=OLLAMA_ERROR_RESPONSES)
async def running(state: State) -> dict[str, Any]:
    report = await openai_ps(state)
    return {"models": [{"name": tagged(m.name), "model": tagged(m.name), "size": m.size_bytes, "digest": "",
                        "expires_at": _iso(m.expires_at), "size_vram": 0,
                        "details": {"format": "gguf"}} for m in report.models]}


def _iso(unix: float | None) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat().replace("+00:00", "Z") if unix else "0001-01-01T00:00:00Z"


SERVED = {"chat": "POST", "generate": "POST", "embed": "POST", "embeddings": "POST", "show": "POST",
          "tags": "GET", "ps": "GET", "version": "GET", "pull": "POST",
          "delete": "DELETE"}  # each of Ollama's routes served (pull, delete: routes/ollama_store.py), and its method


@router.api_route("/api/{rest:path}", methods=["GET", "POST", "DELETE", "HEAD"], include_in_schema=False)
async def unserved(rest: str, request: Request) -> None:
    """The rest of Ollama's API (push, create, copy, blobs) manages Ollama's own store and registry.
    A served route asked with another method is a 405 naming its own: the 404 said "/api/chat is
    not served" and listed /api/chat among those served."""
    name = rest.rstrip("/")
    method = SERVED.get(name)
    if method is not None and request.method == method:  # only a trailing slash is wrong
        raise APIError(404, f"/api/{rest} is not served: send it to /api/{name}, without the trailing slash.",
                       "not_found")
    if method is not None:
        raise APIError(405, f"/api/{name} takes {method}, not {request.method}; send a {method} request.",
                       "method_not_allowed", headers={"allow": method})
    raise APIError(404, f"/api/{rest[:100]} is not served: localspec serves Ollama's "
                   f"{', '.join('/api/' + s for s in SERVED)}; manage models with `localspec models` "
                   "(import, pull, rm, list).", "not_found")
