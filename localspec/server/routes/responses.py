"""POST /v1/responses: OpenAI's Responses API, answered by the chat path (see server/responses.py).

Streamed, an answer is the API's typed events, each `event: TYPE` and `data: JSON` with a
sequence number: response.created and .in_progress; for a thinking model's thought, a reasoning
item's output_item.added, content_part.added, reasoning_text.delta per piece, then the .done of each;
for the text, output_item.added,
content_part.added, output_text.delta per piece, then the .done of each; for each tool call,
output_item.added, function_call_arguments.delta and .done, output_item.done; last
response.completed (or .incomplete at max_output_tokens, .failed when the engine failed).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel

from localspec.engine.events import Done
from localspec.jobs import Job
from localspec.server import translate
from localspec.server.backend import Backend
from localspec.server.errors import ERROR_RESPONSES, APIError
from localspec.server.replies import StreamedReply, extension, origin_of, unsent
from localspec.server.responses import (RESPONSES_FIELDS, DeletedResponse, IncompleteDetails, InputItemList,
                                        InputTokensDetails, OutputFunctionCall, OutputItem, OutputMessage, OutputText,
                                        ResponseError, ResponseObject, ResponsesRequest, ResponseUsage, StoredItem,
                                        as_chat, input_items, input_messages, with_answer)
from localspec.server.reasoning import OutputReasoning, ReasoningText
from localspec.server.routes.plans import SSE_CONTENT, plan, valid_or_400, with_thinking
from localspec.server.schemas import ChatCompletionRequest, ChatMessageIn, FunctionCall, ToolCall
from localspec.server.state import Principal, ServerState, State
from localspec.server.streaming import EventStream, Piece

router = APIRouter()


@router.post(
    "/v1/responses", response_model=ResponseObject,
    responses={**ERROR_RESPONSES, 200: {"content": SSE_CONTENT, "description": "JSON, or SSE events when stream=true"}},
)
async def create_response(body: ResponsesRequest, request: Request, state: State,
                          who: Principal) -> ResponseObject | EventStream:
    body.check_served()  # a field no local server can honour is the answer, before any lookup
    history = state.responses.history(body.previous_response_id, owner=who)  # 404 for one it does not hold
    def referenced(item_id: str) -> StoredItem:
        return state.responses.item(item_id, owner=who)  # 404 for one it does not hold

    conversation = [*history, *input_messages(body, referenced=referenced)]
    chat = valid_or_400(as_chat, body, conversation)
    async with state.serving(chat.model, chat.keep_alive) as (b, hold):
        plan_ = await plan(translate.chat_plan, chat, state.settings.max_tokens_cap, RESPONSES_FIELDS)
        plan_ = await with_thinking(plan_, b)
        job = await state.submit(b, plan_, model=chat.model, owner=who)
        kept = state.keep(hold)
    reply = ResponsesReply(state, b, plan_, job, who, body=body, chat=chat, conversation=conversation)
    if body.stream:
        return EventStream(reply.stream(), on_close=kept.release)
    try:
        _, done = await reply.whole(request)
        return reply.finished(done)
    finally:
        kept.release()


ResponseId = Annotated[str, Path(max_length=128, description="a response's id (resp_...)")]


@router.get("/v1/responses/{response_id}", response_model=ResponseObject, responses=ERROR_RESPONSES)
async def get_response(response_id: ResponseId, state: State, who: Principal) -> ResponseObject:
    """A response this server answered and kept (store: true, the default), as it was answered."""
    return state.responses.response(response_id, owner=who)


@router.delete("/v1/responses/{response_id}", response_model=DeletedResponse, responses=ERROR_RESPONSES)
async def delete_response(response_id: ResponseId, state: State, who: Principal) -> DeletedResponse:
    """Forget a kept response: previous_response_id and its items' references no longer find it."""
    state.responses.delete(response_id, owner=who)
    return DeletedResponse(id=response_id)


@router.get("/v1/responses/{response_id}/input_items", response_model=InputItemList, responses=ERROR_RESPONSES)
async def list_input_items(response_id: ResponseId, state: State, who: Principal,
                           limit: Annotated[int, Query(ge=1, le=100)] = 20,
                           order: Literal["asc", "desc"] = "desc",
                           after: Annotated[str | None, Query(max_length=128)] = None) -> InputItemList:
    """The request's input items, a page at a time as OpenAI pages them: newest first unless order is
    asc, `limit` of them, starting after the item `after` names."""
    items = state.responses.inputs(response_id, owner=who)
    items = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [item.get("id") for item in items]
        items = items[ids.index(after) + 1:] if after in ids else []
    page = items[:limit]
    return InputItemList(data=page, first_id=page[0].get("id") if page else None,
                         last_id=page[-1].get("id") if page else None, has_more=len(items) > limit)


def event(kind: str, sequence_number: int, **fields: Any) -> bytes:
    """One server-sent event of the Responses API: its type named twice, as OpenAI sends it. Objects
    are spelled as the whole answer spells them (FastAPI's response_model): by alias (`text.format`'s
    `schema`, not the attribute `schema_`), their null fields kept."""
    data = {"type": kind, "sequence_number": sequence_number,
            **{k: v.model_dump(mode="json", by_alias=True) if isinstance(v, BaseModel) else v
               for k, v in fields.items()}}
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


class ResponsesReply(StreamedReply):
    """One answer as a Response: output items whole, or the typed events when streamed."""

    closing = None  # the last event is response.completed (or .incomplete, .failed): no [DONE]

    def __init__(self, state: ServerState, b: Backend, plan_: translate.Plan, job: Job, who: str, *,
                 body: ResponsesRequest, chat: ChatCompletionRequest, conversation: list[ChatMessageIn]) -> None:
        super().__init__(state, b, plan_, job, who)
        self.body, self.chat = body, chat
        self.conversation = conversation  # what previous_response_id will mean: no instructions
        self.id = f"resp_{job.id}"
        self.message_id = f"msg_{job.id}"
        self.reasoning_id = f"rs_{job.id}"
        self.thought = ""  # of the thought, streamed so far
        self.thinking: bool | None = None  # the reasoning item (output 0) is open (True) or was closed (False)
        self.sequence = 0
        self.text = ""  # streamed so far
        self.text_open = False  # the message item and its text part were announced

    # -------------------------------------------------------------- the answer, whole

    def output(self, done: Done) -> tuple[list[OutputItem], str | None, list[ToolCall]]:
        thought, content, calls = self.plan.answer(done.text)
        if self.body.max_tool_calls is not None:
            calls = calls[:self.body.max_tool_calls]
        status = "incomplete" if done.finish_reason == "length" else "completed"
        items: list[OutputItem] = []
        if thought:  # cut off inside it (no content): the thought is what is incomplete
            items.append(OutputReasoning(id=self.reasoning_id, content=[ReasoningText(text=thought)],
                                         status="incomplete" if status == "incomplete" and not content and not calls
                                         else "completed"))
        if content or not calls:
            items.append(OutputMessage(id=self.message_id, status=status, content=[OutputText(text=content or "")]))
        items += [OutputFunctionCall(id=f"fc_{self.job.id}_{i}", call_id=c.id, name=c.function.name,
                                     arguments=c.function.arguments, status="completed")
                  for i, c in enumerate(calls)]
        return items, content, calls

    def response(self, done: Done, items: list[OutputItem]) -> ResponseObject:
        st = done.stats
        r = ResponseObject.started(self.body, id=self.id, created_at=self.created)
        r.status = "incomplete" if done.finish_reason == "length" else "completed"
        r.incomplete_details = IncompleteDetails(reason="max_output_tokens") if r.status == "incomplete" else None
        r.output = items
        cached = InputTokensDetails(cached_tokens=st.reused_prefix_tokens)
        total = st.prompt_tokens + st.completion_tokens
        r.usage = ResponseUsage(input_tokens=st.prompt_tokens, input_tokens_details=cached,
                                output_tokens=st.completion_tokens, total_tokens=total)
        r.localspec = extension(self.b, done, self.plan, self.job, self.who)
        return r

    def finished(self, done: Done) -> ResponseObject:
        """The whole Response of a finished answer, kept for previous_response_id unless store is false."""
        items, content, calls = self.output(done)
        final = self.response(done, items)
        self.remember(content, calls, final)
        return final

    def remember(self, content: str | None, calls: list[ToolCall], final: ResponseObject) -> None:
        """Keep the conversation (previous_response_id), each output item (item_reference), the response
        itself and its input items (GET /v1/responses/{id}, .../input_items)."""
        if not self.body.store:
            return
        items = final.output
        by_id: dict[str, StoredItem] = {}
        for item in items:
            if isinstance(item, OutputReasoning):
                continue  # dropped when sent back, as another model's reasoning is: nothing to refer to
            if isinstance(item, OutputMessage):
                by_id[item.id] = ChatMessageIn(role="assistant", content=item.content[0].text)
            else:
                by_id[item.id] = ToolCall(id=item.call_id, function=FunctionCall(name=item.name,
                                                                                 arguments=item.arguments))
        # Instructions are not carried over: the next request sends its own (as OpenAI).
        self.state.responses.keep(self.id, owner=self.who, items=by_id,
                                  messages=with_answer(self.conversation, content, calls),
                                  response=final, inputs=input_items(self.body, prefix=f"in_{self.job.id}",
                                                            resolve=self._held_item))

    def _held_item(self, item_id: str) -> StoredItem | None:
        return self.state.responses.held_item(item_id, owner=self.who)

    # -------------------------------------------------------------- the answer, streamed

    def next(self, kind: str, **fields: Any) -> bytes:
        out = event(kind, self.sequence, **fields)
        self.sequence += 1
        return out

    @property
    def message_index(self) -> int:
        return 0 if self.thinking is None else 1

    def thought_delta(self, thought: str) -> list[bytes]:
        """The reasoning item's next text, the item announced first if it was not."""
        out = []
        if not self.thinking:
            self.thinking = True
            item = OutputReasoning(id=self.reasoning_id, status="in_progress", content=[])
            out = [self.next("response.output_item.added", output_index=0, item=item),
                   self.next("response.content_part.added", item_id=self.reasoning_id, output_index=0,
                             content_index=0, part=ReasoningText(text=""))]
        self.thought += thought
        return [*out, self.next("response.reasoning_text.delta", item_id=self.reasoning_id, output_index=0,
                                content_index=0, delta=thought)]

    def close_thought(self, item: OutputReasoning | None = None) -> list[bytes]:
        """The reasoning item's .done events (the thought is whole once its content comes)."""
        if not self.thinking:
            return []
        self.thinking = False
        item = item or OutputReasoning(id=self.reasoning_id, status="completed",
                                       content=[ReasoningText(text=self.thought)])
        part = item.content[0]
        return [self.next("response.reasoning_text.done", item_id=item.id, output_index=0, content_index=0,
                          text=part.text),
                self.next("response.content_part.done", item_id=item.id, output_index=0, content_index=0, part=part),
                self.next("response.output_item.done", output_index=0, item=item)]

    def open_text(self) -> list[bytes]:
        if self.text_open:
            return []
        out = self.close_thought()
        self.text_open = True
        item = OutputMessage(id=self.message_id, status="in_progress", content=[])
        at = self.message_index
        return [*out, self.next("response.output_item.added", output_index=at, item=item),
                self.next("response.content_part.added", item_id=self.message_id, output_index=at, content_index=0,
                          part=OutputText(text=""))]

    def head(self) -> list[bytes]:
        started = ResponseObject.started(self.body, id=self.id, created_at=self.created)
        return [self.next("response.created", response=started), self.next("response.in_progress", response=started)]

    def piece(self, piece: Piece) -> bytes | None:
        out = self.thought_delta(piece.thought) if piece.thought else []
        if not piece.text:
            return b"".join(out) if out else None
        self.text += piece.text
        extra = origin_of(self.chat, piece)
        opening = self.open_text()  # numbered before the delta: sequence numbers are the wire's order
        delta = self.next("response.output_text.delta", item_id=self.message_id, output_index=self.message_index,
                          content_index=0, delta=piece.text, logprobs=[], **({"localspec": extra} if extra else {}))
        return b"".join([*out, *opening, delta])

    def tail(self, done: Done) -> list[bytes]:
        items, content, calls = self.output(done)
        out: list[bytes] = []
        for index, item in enumerate(items):
            if isinstance(item, OutputReasoning):
                if more := unsent(item.content[0].text, self.thought):  # held to the end: a cut-off marker
                    out += self.thought_delta(more)
                out += self.close_thought(item)
            elif isinstance(item, OutputMessage):
                out += self.close_text(item)
            else:
                out += self.call_events(index, item)
        final = self.response(done, items)
        self.remember(content, calls, final)
        out.append(self.next("response.incomplete" if final.status == "incomplete" else "response.completed",
                             response=final))
        return out

    def close_text(self, item: OutputMessage) -> list[bytes]:
        """The message's .done events, after the text the stream held back (tools: what might be a call)."""
        text = item.content[0].text
        out = self.open_text()
        at = self.message_index
        if rest := unsent(text, self.text):
            out.append(self.next("response.output_text.delta", item_id=item.id, output_index=at, content_index=0,
                                 delta=rest, logprobs=[]))
        out.append(self.next("response.output_text.done", item_id=item.id, output_index=at, content_index=0,
                             text=text, logprobs=[]))
        out.append(self.next("response.content_part.done", item_id=item.id, output_index=at, content_index=0,
                             part=item.content[0]))
        out.append(self.next("response.output_item.done", output_index=at, item=item))
        return out

    def call_events(self, index: int, item: OutputFunctionCall) -> list[bytes]:
        opened = item.model_copy(update={"arguments": "", "status": "in_progress"})
        return [self.next("response.output_item.added", output_index=index, item=opened),
                self.next("response.function_call_arguments.delta", item_id=item.id, output_index=index,
                          delta=item.arguments),
                self.next("response.function_call_arguments.done", item_id=item.id, output_index=index,
                          name=item.name, arguments=item.arguments),
                self.next("response.output_item.done", output_index=index, item=item)]

    def failed(self, err: APIError) -> list[bytes]:
        r = ResponseObject.started(self.body, id=self.id, created_at=self.created)
        r.status = "failed"
        r.error = ResponseError(code=err.code or "server_error", message=err.message)
        return [self.next("response.failed", response=r)]
