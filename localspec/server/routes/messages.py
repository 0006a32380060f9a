"""POST /v1/messages: Anthropic's Messages API, answered by the chat path (see server/messages.py).

Streamed, an answer is the API's typed events, each `event: TYPE` and `data: JSON`: message_start,
a ping; for a thinking model's thought, content_block_start (thinking), a thinking_delta per piece,
content_block_stop; for the text, content_block_start, a text_delta per piece, content_block_stop; for each
tool call, content_block_start (its id and name), one input_json_delta with the whole input,
content_block_stop; then message_delta (stop_reason, the usage totals) and message_stop. An engine
failure after the 200 is an `error` event. While the request waits (queued, a long prompt) pings
keep the stream open, as Anthropic's do.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel

from localspec.engine.config import GenerationRequest
from localspec.engine.events import Done
from localspec.errors import ContextOverflowError, LocalspecError
from localspec.jobs import Job
from localspec.server import translate
from localspec.server.backend import Backend
from localspec.server.errors import ANTHROPIC_ERROR_RESPONSES, APIError, anthropic_error
from localspec.server.messages import (MESSAGES_FIELDS, ContentOut, MessageObject, MessagesRequest, MessageUsage,
                                       StopReason, TextOut, ThinkingOut, TokenCount, ToolUseOut, as_chat, tool_input,
                                       tool_use_id)
from localspec.server.replies import StreamedReply, extension, origin_of, unsent
from localspec.server.routes.plans import SSE_CONTENT, plan, valid_or_400, with_thinking
from localspec.server.schemas import ChatCompletionRequest, ToolCall
from localspec.server.state import Principal, ServerState, State
from localspec.server.streaming import EventStream, Piece

router = APIRouter()


@router.post(
    "/v1/messages", response_model=MessageObject,
    responses={**ANTHROPIC_ERROR_RESPONSES,
               200: {"content": SSE_CONTENT, "description": "JSON, or SSE events when stream=true"}},
)
async def create_message(body: MessagesRequest, request: Request, state: State, who: Principal
                         ) -> MessageObject | EventStream:
    chat = valid_or_400(as_chat, body, state.settings.max_tokens_cap)
    async with state.serving(chat.model, chat.keep_alive) as (b, hold):  # 404 for a name it cannot serve
        plan_ = await plan(translate.chat_plan, chat, state.settings.max_tokens_cap, MESSAGES_FIELDS)
        plan_ = await with_thinking(plan_, b)
        counted = await prompt_count(b, plan_) if body.stream else 0  # before the job: nothing runs unread
        job = await state.submit(b, plan_, model=chat.model, owner=who)
        kept = state.keep(hold)
    reply = MessagesReply(state, b, plan_, job, who, chat=chat)
    if body.stream:
        reply.prompt_tokens = counted
        return EventStream(reply.stream(), on_close=kept.release)
    try:
        _, done = await reply.whole(request)
        return reply.message(done)
    finally:
        kept.release()


async def prompt_count(b: Backend, plan_: translate.Plan) -> int:
    """The prompt's tokens, for message_start (clients show the context used from it before the answer
    ends); counted as count_tokens does (the default model's tokenizer, its own template variables
    applied): the engine counts it again when a slot admits the request."""
    try:
        return await count(b, plan_.request)
    except ContextOverflowError as exc:
        return exc.prompt_tokens
    except Exception:  # noqa: BLE001 - the engine refuses it, saying why, at submit; a remote default tier has none
        return 0


async def count(b: Backend, request: GenerationRequest) -> int:
    engine = b.engine
    tokens, _dropped = await asyncio.to_thread(engine.prompt_tokens, engine.with_defaults(request))
    return len(tokens)


class CountTokensRequest(MessagesRequest):
    max_tokens: int | None = None  # type: ignore[assignment]  # counting needs no answer length


@router.post("/v1/messages/count_tokens", response_model=TokenCount, responses=ANTHROPIC_ERROR_RESPONSES)
async def count_tokens(body: CountTokensRequest, state: State) -> TokenCount:
    """The prompt's tokens as this model reads them: system, messages and tools through its chat template.
    A prompt past the context is counted too (the answer would be a 400 naming both numbers)."""
    chat = valid_or_400(as_chat, body, state.settings.max_tokens_cap)
    async with state.serving(chat.model, chat.keep_alive) as (b, _):
        plan_ = await plan(translate.chat_plan, chat, state.settings.max_tokens_cap, MESSAGES_FIELDS)
        try:
            counted = await count(b, plan_.request)
        except ContextOverflowError as exc:
            return TokenCount(input_tokens=exc.prompt_tokens)
        except LocalspecError as exc:
            raise APIError(400, str(exc), "invalid_request") from exc
    return TokenCount(input_tokens=counted)


def event(kind: str, **fields: Any) -> bytes:
    """One server-sent event of the Messages API: its type named twice, as Anthropic sends it."""
    data = {"type": kind, **{k: v.model_dump(mode="json") if isinstance(v, BaseModel) else v
                             for k, v in fields.items()}}
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


PING = event("ping")


def stop_reason(done: Done, calls: list[ToolCall]) -> StopReason:
    """Why the answer ended. An answer cut at max_tokens says so even when it holds whole calls: a
    call after them may have been cut off."""
    if done.finish_reason == "length":
        return "max_tokens"
    if calls:
        return "tool_use"
    return "stop_sequence" if done.stop_sequence is not None else "end_turn"


def _stop_sequence(done: Done, calls: list[ToolCall]) -> str | None:
    return done.stop_sequence if stop_reason(done, calls) == "stop_sequence" else None


class MessagesReply(StreamedReply):
    """One answer as a Message: content blocks whole, or the typed events when streamed."""

    closing = None  # message_stop ends the stream: no [DONE]
    keepalive = PING

    def __init__(self, state: ServerState, b: Backend, plan_: translate.Plan, job: Job, who: str, *,
                 chat: ChatCompletionRequest) -> None:
        super().__init__(state, b, plan_, job, who)
        self.chat = chat
        self.id = f"msg_{job.id}"
        self.text = ""  # streamed so far
        self.thought = ""  # of the thought, streamed so far
        self.thinking: bool | None = None  # a thinking block (index 0) is open (True) or was closed (False)
        self.text_open = False  # the text block (after the thinking block, if any) was started
        self.prompt_tokens = 0  # streamed: the prompt's tokens, for message_start

    # -------------------------------------------------------------- the answer, whole

    def content(self, done: Done) -> tuple[list[ContentOut], list[ToolCall]]:
        thought, text, calls = self.plan.answer(done.text)
        blocks: list[ContentOut] = [ThinkingOut(thinking=thought)] if thought else []
        blocks += [TextOut(text=text)] if text else []
        blocks += [ToolUseOut(id=tool_use_id(c), name=c.function.name, input=tool_input(c.function.arguments))
                   for c in calls]
        return blocks, calls

    def usage(self, done: Done) -> MessageUsage:
        st = done.stats
        reused = min(st.reused_prefix_tokens, st.prompt_tokens)
        return MessageUsage(input_tokens=st.prompt_tokens - reused, output_tokens=st.completion_tokens,
                            cache_read_input_tokens=reused)

    def message(self, done: Done) -> MessageObject:
        blocks, calls = self.content(done)
        return MessageObject(id=self.id, model=self.chat.model, content=blocks, stop_reason=stop_reason(done, calls),
                             stop_sequence=_stop_sequence(done, calls), usage=self.usage(done),
                             localspec=extension(self.b, done, self.plan, self.job, self.who))

    # -------------------------------------------------------------- the answer, streamed

    def head(self) -> list[bytes]:
        # The prompt's tokens; what the engine reuses from its KV cache is known once it has read the
        # prompt, so message_delta's usage splits it (input_tokens and cache_read_input_tokens).
        started = MessageObject(id=self.id, model=self.chat.model,
                                usage=MessageUsage(input_tokens=self.prompt_tokens, output_tokens=0))
        return [event("message_start", message=started.model_dump(mode="json", exclude={"localspec"})), PING]

    @property
    def text_index(self) -> int:
        return 0 if self.thinking is None else 1

    def thought_delta(self, thought: str) -> list[bytes]:
        """The thinking block's next text, the block started first if it was not."""
        out = [] if self.thinking else [event("content_block_start", index=0, content_block=ThinkingOut(thinking=""))]
        self.thinking = True
        self.thought += thought
        return [*out, event("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": thought})]

    def close_thinking(self) -> list[bytes]:
        if not self.thinking:
            return []
        self.thinking = False
        return [event("content_block_stop", index=0)]

    def open_text(self) -> list[bytes]:
        if self.text_open:
            return []
        self.text_open = True
        # The thought is whole once its content comes (the splitter sends none before it is).
        start = event("content_block_start", index=self.text_index, content_block=TextOut(text=""))
        return [*self.close_thinking(), start]

    def text_delta(self, text: str, **extra: Any) -> bytes:
        self.text += text
        return event("content_block_delta", index=self.text_index, delta={"type": "text_delta", "text": text}, **extra)

    def piece(self, piece: Piece) -> bytes | None:
        out = self.thought_delta(piece.thought) if piece.thought else []
        if piece.text:
            origin = origin_of(self.chat, piece)  # for a client that asked (localspec.origins): the others pay nothing
            out += [*self.open_text(), self.text_delta(piece.text, **({"localspec": origin} if origin else {}))]
        return b"".join(out) if out else None

    def tail(self, done: Done) -> list[bytes]:
        blocks, calls = self.content(done)
        out: list[bytes] = []
        for index, block in enumerate(blocks):
            if isinstance(block, ThinkingOut):
                if more := unsent(block.thinking, self.thought):  # held to the end: a cut-off marker, whitespace
                    out += self.thought_delta(more)
                out += self.close_thinking()
            elif isinstance(block, TextOut):
                out += self.open_text()
                if rest := unsent(block.text, self.text):  # what was held back (tools: what might be a call)
                    out.append(self.text_delta(rest))
                out.append(event("content_block_stop", index=index))
            else:
                out += [event("content_block_start", index=index, content_block=block.model_copy(update={"input": {}})),
                        event("content_block_delta", index=index,
                              delta={"type": "input_json_delta", "partial_json": json.dumps(block.input)}),
                        event("content_block_stop", index=index)]
        usage = self.usage(done)
        out.append(event("message_delta",
                         delta={"stop_reason": stop_reason(done, calls),
                                "stop_sequence": _stop_sequence(done, calls)},
                         usage=usage, localspec=extension(self.b, done, self.plan, self.job, self.who)))
        out.append(event("message_stop"))
        return out

    def failed(self, err: APIError) -> list[bytes]:
        return [event("error", error=anthropic_error(err.status, err.message)["error"])]
