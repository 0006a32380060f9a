"""OpenAI's Responses API (`POST /v1/responses`) as a chat request: its bodies, and the translation.

A Responses request is a chat request spelled another way (`input` items for `messages`,
`instructions` for the system message, flat function tools, `text.format` for `response_format`),
so it becomes a `ChatCompletionRequest` here and takes the chat path from there: the same plan,
grammar, cache, router and engine. The answer goes back as output items and, streamed, as the
Responses API's typed events (routes/responses.py).

`previous_response_id` continues a conversation this server answered: it keeps the last
responses' conversations in memory (`ResponseStore`, per key, until it restarts), unless the
request sent `store: false`. What the API has and a local server cannot do (hosted tools,
background runs, stored prompts and conversations, images and files) is a 400 naming it; an
offered web search is dropped instead (WEB_SEARCH_TOOLS), since Codex sends one by default.
"""

from __future__ import annotations

import copy
import json
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from localspec.server.errors import APIError
from localspec.server.reasoning import OutputReasoning
from localspec.server.schemas import (ChatCompletionRequest, ChatMessageIn, Extension, FunctionCall, FunctionDef,
                                      JsonSchemaFormat, KeepAliveField, LocalspecOptions, ResponseFormat, Tool,
                                      ToolCall, ToolChoiceFunction, ToolChoiceNamed, _Body, _Request)
from localspec.server.translate import FieldNames

# ---------------------------------------------------------------- the request

TEXT_PARTS = ("input_text", "output_text", "text")  # what a message's content may hold here: text
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning", "item_reference")
WEB_SEARCH_TOOLS = ("web_search", "web_search_2025_08_26", "web_search_preview", "web_search_preview_2025_03_11")
"""OpenAI's hosted web search. The Codex CLI offers it on every request by default (its web_search
mode is "cached" for any provider but Azure's), so refusing it refused every Codex turn. Offered,
it is dropped: the model answers from what it knows, as it does on OpenAI when it chooses not to
search. Forced (tool_choice), it would change the answer in a way this server cannot: a 400."""


class TextPart(_Request):
    type: str = Field(description="input_text, output_text (an earlier answer's) or text; images and files are "
                                  "not served")
    text: str | None = None

    @model_validator(mode="after")
    def _text_only(self) -> TextPart:
        if self.type not in TEXT_PARTS:
            raise ValueError(f"content of type '{self.type}' is not served: this server's models read text only "
                             f"({', '.join(TEXT_PARTS)})")
        return self


class MessageItem(_Request):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[TextPart]


class FunctionCallItem(_Request):
    """A call the model made earlier, sent back with the conversation."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str = Field(description="JSON text")


class FunctionCallOutputItem(_Request):
    """A tool's result, answering the call with the same call_id."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[TextPart]


class ReasoningItem(_Request):
    """Reasoning sent back by clients that keep it (another model's, or a thinking model's output
    item): a thought is not read back, as thinking models' templates drop it from earlier turns."""

    type: Literal["reasoning"]


class ItemReference(_Request):
    """An output item of an earlier response, by its id (msg_..., fc_...), instead of its content: what
    the Vercel AI SDK sends back with store on. Resolved from this server's ResponseStore (per key)."""

    type: Literal["item_reference"]
    id: str = Field(max_length=128)


InputItem = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem | ItemReference,
                      Field(discriminator="type")]


_ITEM_MODELS: dict[str, type[_Request]] = {"message": MessageItem, "function_call": FunctionCallItem,
                                           "function_call_output": FunctionCallOutputItem, "reasoning": ReasoningItem,
                                           "item_reference": ItemReference}
_TEXT_FIX = "send a string, or a list of text parts ({\"type\": \"input_text\", \"text\": \"...\"})"


def item_error(index: int, exc: ValidationError) -> str:
    """What is wrong with input[index], named by its own fields. Pydantic's first error named the
    string branch of `input` ("input.str: Input should be a valid string") for any bad item."""
    found: dict[str, list[str]] = {}
    for err in exc.errors():
        # a union's branch ('str', 'list[...TextPart]') is pydantic's label, not a field the client sent
        path = [str(p) for p in err["loc"] if not (isinstance(p, str) and (p == "str" or "[" in p))]
        found.setdefault(".".join(path), []).append(err["msg"])
    where, messages = max(found.items(), key=lambda kv: kv[0].count(".") + bool(kv[0]))
    why = _TEXT_FIX if len(messages) > 1 else messages[0]  # a text field's two branches both refused it
    return f"input[{index}]{'.' + where if where else ''}: {why}"


class FunctionTool(_Request):
    type: Literal["function"] = "function"
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(_Request):
    type: Literal["function"]
    name: str


class TextFormat(_Request):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str = "response"
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(_Request):
    format: TextFormat = Field(default_factory=TextFormat)


_UNSERVED = {  # fields with a value no local server can honour: the 400 names each
    "background": "background runs are not served; send the request without it and wait for the answer",
    "conversation": "stored conversations are not served; send previous_response_id, or the whole conversation "
                    "in input",
    "prompt": "stored prompt templates are not served; send the prompt's text in instructions and input",
}


class ResponsesRequest(_Body):
    model: str = Field(..., max_length=512, description="a model id or alias from /v1/models, or 'auto'")
    input: str | list[InputItem] = Field(description="the user's text, or the conversation's items in order")
    instructions: str | None = Field(None, description="the system message (not carried by previous_response_id)")
    previous_response_id: str | None = Field(None, max_length=128,
                                             description="continue a conversation this server answered")
    store: bool = Field(True, description="false: do not keep this conversation for previous_response_id")
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stream: bool = False
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = Field(None, ge=1, description="the answer's tool calls beyond this are dropped")
    text: TextConfig | None = None
    metadata: dict[str, str] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    include: list[str] | None = None
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    localspec: LocalspecOptions | None = None
    keep_alive: KeepAliveField = None

    @field_validator("input", mode="before")
    @classmethod
    def _items(cls, value: Any) -> Any:
        """An item with a role and no type is a message (the SDK's EasyInputMessage). An item or a
        content part this server cannot read is named here: pydantic's union error would name the
        string branch instead ("input.str: Input should be a valid string")."""
        if not isinstance(value, list):
            return value
        items = [{**item, "type": "message"} if isinstance(item, dict) and "type" not in item and "role" in item
                 else item for item in value]
        for i, item in enumerate(items):
            kind = item.get("type") if isinstance(item, dict) else None
            if kind not in ITEM_TYPES:
                raise ValueError(f"input[{i}] is {f'a {kind!r} item' if kind else 'not an item'}, which is not served "
                                 f"here: send {', '.join(ITEM_TYPES)} items")
            parts = item.get("content") if kind == "message" else item.get("output")
            for part in parts if isinstance(parts, list) else []:
                if isinstance(part, dict) and part.get("type") not in TEXT_PARTS:
                    raise ValueError(f"input[{i}] holds content of type {part.get('type')!r}, which is not served: "
                                     f"this server's models read text only ({', '.join(TEXT_PARTS)})")
            try:
                _ITEM_MODELS[kind].model_validate(item)
            except ValidationError as exc:
                raise ValueError(item_error(i, exc)) from None
        return items

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools(cls, value: Any) -> Any:
        """The function tools; an offered web search is dropped (WEB_SEARCH_TOOLS), any other hosted
        or custom tool named."""
        if not isinstance(value, list):
            return value
        kept = []
        for i, tool in enumerate(value):
            if not isinstance(tool, dict):  # was "a 'None' tool" for null, a number, a string
                raise ValueError(f"tools[{i}] is {json.dumps(tool)[:40]}, not a tool: send "
                                 '{"type": "function", "name": ..., "parameters": {...}}')
            kind = tool.get("type", "function")
            if kind in WEB_SEARCH_TOOLS:
                continue
            if kind != "function":
                raise ValueError(f"tools[{i}] is a '{kind}' tool, which is not served: this server runs function "
                                 "tools, called by your code")
            kept.append(tool)
        return kept

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _function_choice(cls, value: Any) -> Any:
        kind = value.get("type") if isinstance(value, dict) else None
        if kind is not None and kind != "function":
            search = " (web search is not served here: the model answers from what it knows)" \
                if kind in WEB_SEARCH_TOOLS else ""
            raise ValueError(f"a '{kind}' tool cannot be required here{search}; send 'auto', 'none', 'required' "
                             "or {\"type\": \"function\", \"name\": ...}")
        return value

    def check_served(self) -> None:
        """A 400 for a field whose value would change the answer in a way this server cannot."""
        for name, why in _UNSERVED.items():
            if getattr(self, name):
                raise APIError(400, f"{name}: {why}.", "unsupported_value", name)
        if self.top_logprobs or any("logprobs" in i for i in self.include or ()):
            raise APIError(400, "Log probabilities are not served on /v1/responses; use /v1/chat/completions with "
                           "logprobs: true.", "unsupported_value", "include" if self.include else "top_logprobs")


# ---------------------------------------------------------------- to a chat request

RESPONSES_FIELDS = FieldNames(max_tokens="max_output_tokens", schema="text.format.schema",
                              tool_parameters="tools[{i}].parameters", prompt="input")


def _joined(content: str | list[TextPart]) -> str:
    return content if isinstance(content, str) else "".join(p.text or "" for p in content)


StoredItem = ChatMessageIn | ToolCall  # an earlier answer's message (assistant), or one of its calls


def input_messages(body: ResponsesRequest, *, referenced: Callable[[str], StoredItem] | None = None
                   ) -> list[ChatMessageIn]:
    """The request's input as chat messages: a function call joins the assistant turn before it.
    `referenced`: an item_reference's item (ResponseStore.item, for this key); without it one is a 400."""
    if isinstance(body.input, str):
        return [ChatMessageIn(role="user", content=body.input)]
    out: list[ChatMessageIn] = []
    for item in body.input:
        if isinstance(item, ItemReference):
            if referenced is None:
                raise APIError(400, "input holds an item_reference, which needs the stored response.",
                               "invalid_value", "input")
            stored = referenced(item.id)
            if isinstance(stored, ToolCall):
                _join_call(out, stored.model_copy(deep=True))
            else:
                out.append(stored.model_copy(deep=True))
        elif isinstance(item, MessageItem):
            out.append(ChatMessageIn(role=item.role, content=_joined(item.content)))
        elif isinstance(item, FunctionCallItem):
            _join_call(out, ToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments)))
        elif isinstance(item, FunctionCallOutputItem):
            out.append(ChatMessageIn(role="tool", content=_joined(item.output), tool_call_id=item.call_id))
    return out


def _join_call(out: list[ChatMessageIn], call: ToolCall) -> None:
    """A call joins the assistant turn just before it, or makes one."""
    last = out[-1] if out else None
    if last is not None and last.role == "assistant" and last.tool_calls is not None:
        last.tool_calls.append(call)
    elif last is not None and last.role == "assistant":
        last.tool_calls = [call]
    else:
        out.append(ChatMessageIn(role="assistant", content=None, tool_calls=[call]))


def as_chat(body: ResponsesRequest, conversation: list[ChatMessageIn]) -> ChatCompletionRequest:
    """The chat request this Responses request means: `conversation` is previous_response_id's
    history and this request's input (input_messages); the instructions go before it."""
    body.check_served()
    system = [ChatMessageIn(role="system", content=body.instructions)] if body.instructions else []
    messages = [*system, *conversation]
    if not messages:
        raise APIError(400, "input holds no message: send the user's text, or at least one message item.",
                       "invalid_value", "input")
    fmt = body.text.format if body.text else None
    response_format = None
    if fmt is not None and fmt.type != "text":
        schema = JsonSchemaFormat(name=fmt.name, schema=fmt.schema_, strict=fmt.strict) if fmt.type == "json_schema" \
            else None
        if fmt.type == "json_schema" and fmt.schema_ is None:
            raise APIError(400, "text.format json_schema needs a 'schema' object.", "invalid_value", "text.format")
        response_format = ResponseFormat(type=fmt.type, json_schema=schema)
    choice: Any = body.tool_choice
    if isinstance(choice, NamedFunction):
        choice = ToolChoiceNamed(function=ToolChoiceFunction(name=choice.name))
    tools = [Tool(function=FunctionDef(name=t.name, description=t.description, parameters=t.parameters))
             for t in body.tools] if body.tools else None
    return ChatCompletionRequest(
        model=body.model, messages=messages, max_tokens=body.max_output_tokens, temperature=body.temperature,
        top_p=body.top_p, stream=body.stream, tools=tools, tool_choice=choice,
        parallel_tool_calls=False if body.max_tool_calls == 1 else body.parallel_tool_calls,
        response_format=response_format, localspec=body.localspec, keep_alive=body.keep_alive,
    )


# ---------------------------------------------------------------- the answer


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class OutputFunctionCall(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


OutputItem = OutputReasoning | OutputMessage | OutputFunctionCall


class InputTokensDetails(BaseModel):
    cached_tokens: int = Field(0, description="prompt tokens whose KV state was reused from an earlier request")


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseError(BaseModel):
    code: str
    message: str


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    parallel_tool_calls: bool = True
    tool_choice: Literal["none", "auto", "required"] | NamedFunction = "auto"
    tools: list[FunctionTool] = Field(default_factory=list)
    text: TextConfig = Field(default_factory=TextConfig)
    store: bool = True
    metadata: dict[str, str] = Field(default_factory=dict)
    usage: ResponseUsage | None = None
    localspec: Extension | None = None

    @classmethod
    def started(cls, body: ResponsesRequest, *, id: str, created_at: int) -> ResponseObject:
        """The response as it stands before its answer: the request's settings echoed, as OpenAI does."""
        return cls(id=id, created_at=created_at, status="in_progress", model=body.model,
                   instructions=body.instructions, max_output_tokens=body.max_output_tokens,
                   previous_response_id=body.previous_response_id, temperature=body.temperature, top_p=body.top_p,
                   parallel_tool_calls=body.parallel_tool_calls is not False,
                   tool_choice=body.tool_choice or "auto", tools=body.tools or [], text=body.text or TextConfig(),
                   store=body.store, metadata=body.metadata or {})


# ---------------------------------------------------------------- previous_response_id


@dataclass(frozen=True, kw_only=True)
class _Stored:
    owner: str
    messages: list[ChatMessageIn]
    chars: int
    items: dict[str, StoredItem]  # its output items by id, for item_reference
    response: ResponseObject | None = None  # as it was answered, for GET /v1/responses/{id}
    inputs: list[dict[str, Any]] = field(default_factory=list)  # its input items, for .../input_items


class InputItemList(BaseModel):
    """GET /v1/responses/{id}/input_items: a page of the request's input items, as OpenAI lists them."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: bool = True


def _listed(item: MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem, item_id: str
            ) -> dict[str, Any]:
    """One input item as OpenAI lists it: with an id, a message's text as input_text parts (output_text
    for an assistant's)."""
    out = {"id": item_id, **item.model_dump(mode="json", exclude_none=True)}
    if isinstance(item, MessageItem):
        kind = "output_text" if item.role == "assistant" else "input_text"
        out["content"] = [{"type": kind, "text": item.content}] if isinstance(item.content, str) else out["content"]
        out["status"] = "completed"
    return out


def _referenced(stored: StoredItem, item_id: str) -> dict[str, Any]:
    """An item_reference's item, as the item it stands for: listed under the reference's id, the same
    item referenced twice was the same id twice, and paging `after` it came back to it for ever."""
    if isinstance(stored, ToolCall):
        return {"id": item_id, "type": "function_call", "call_id": stored.id, "name": stored.function.name,
                "arguments": stored.function.arguments, "status": "completed"}
    return _listed(MessageItem(role="assistant", content=stored.content or ""), item_id)


def input_items(body: ResponsesRequest, *, prefix: str,
                resolve: Callable[[str], StoredItem | None] = lambda _: None) -> list[dict[str, Any]]:
    """The request's input as items, each with an id `<prefix>_<index>`: a text input is one user
    message, as OpenAI lists it; a reference is the item it stands for (`resolve`), when still held."""
    if isinstance(body.input, str):
        return [_listed(MessageItem(role="user", content=body.input), f"{prefix}_0")]
    out = []
    for i, item in enumerate(body.input):
        if not isinstance(item, ItemReference):
            out.append(_listed(item, f"{prefix}_{i}"))
        elif (stored := resolve(item.id)) is not None:
            out.append(_referenced(stored, f"{prefix}_{i}"))
        else:  # forgotten since: the reference as it was sent
            out.append(item.model_dump(mode="json"))
    return out


class ResponseStore:
    """The conversations behind recent responses, for previous_response_id: in memory, each key's own,
    at most `max_responses` and `max_chars` in all (a server restart forgets them all). Past either,
    the oldest response of the key holding the most goes: one key's many requests forget its own
    conversations, not another key's (they all went, oldest first, to the busiest key's flood)."""

    def __init__(self, *, max_responses: int = 256, max_chars: int = 16 << 20) -> None:
        self.max_responses, self.max_chars = max_responses, max_chars
        self._items: OrderedDict[str, _Stored] = OrderedDict()
        self._chars = 0
        self._held: Counter[str] = Counter()  # responses kept per owner
        self._held_chars: Counter[str] = Counter()
        self._by_item: dict[str, str] = {}  # output item id -> its response's id

    def history(self, response_id: str | None, *, owner: str) -> list[ChatMessageIn]:
        if response_id is None:
            return []
        stored = self._items.get(response_id)
        if stored is None or stored.owner != owner:  # another key's is as unknown as a forgotten one
            raise APIError(404, f"previous_response_id '{response_id[:128]}' is not known here: this server keeps "
                           f"its last {self.max_responses} responses in memory until it restarts, and not those "
                           "sent with store: false. Fix: send the whole conversation in input.",
                           "previous_response_not_found", "previous_response_id")
        self._items.move_to_end(response_id)
        return [m.model_copy(deep=True) for m in stored.messages]

    def _kept(self, response_id: str, owner: str) -> tuple[_Stored, ResponseObject]:
        stored = self._items.get(response_id)
        if stored is None or stored.owner != owner or stored.response is None:
            raise APIError(404, f"No response '{response_id[:128]}' is kept here: this server keeps its last "
                           f"{self.max_responses} responses in memory until it restarts, and not those sent with "
                           "store: false.", "response_not_found", "response_id")
        return stored, stored.response

    def response(self, response_id: str, *, owner: str) -> ResponseObject:
        """A kept response as it was answered (GET /v1/responses/{id}); a 404 as for previous_response_id."""
        return self._kept(response_id, owner)[1].model_copy(deep=True)

    def held_item(self, item_id: str, *, owner: str) -> StoredItem | None:
        """An output item of a kept response, or None (forgotten, another key's)."""
        response_id = self._by_item.get(item_id)
        stored = self._items.get(response_id) if response_id else None
        return stored.items[item_id] if stored is not None and stored.owner == owner else None

    def inputs(self, response_id: str, *, owner: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self._kept(response_id, owner)[0].inputs)

    def delete(self, response_id: str, *, owner: str) -> None:
        """Forget a kept response: its conversation, its items and itself (DELETE /v1/responses/{id})."""
        self._kept(response_id, owner)
        self._drop(response_id)

    def item(self, item_id: str, *, owner: str) -> StoredItem:
        """An output item of a kept response (an item_reference's), or a 404 as for previous_response_id."""
        if (held := self.held_item(item_id, owner=owner)) is None:
            raise APIError(404, f"item_reference '{item_id[:128]}' is not known here: this server keeps the items of "
                           f"its last {self.max_responses} responses in memory until it restarts, and not those "
                           "sent with store: false. Fix: send the item's content instead (or store: false, "
                           "so that clients send it).", "item_not_found", "input")
        return held

    def keep(self, response_id: str, *, owner: str, messages: list[ChatMessageIn],
             items: dict[str, StoredItem] | None = None, response: ResponseObject | None = None,
             inputs: list[dict[str, Any]] | None = None) -> None:
        chars = sum(len(m.model_dump_json()) for m in messages)
        chars += len(response.model_dump_json()) if response is not None else 0
        chars += len(json.dumps(inputs)) if inputs else 0
        if chars > self.max_chars:
            return  # one conversation bigger than all the room: not kept (previous_response_id then 404s)
        if response_id in self._items:
            self._drop(response_id)
        self._items[response_id] = _Stored(owner=owner, messages=messages, chars=chars, items=dict(items or {}),
                                           response=response, inputs=list(inputs or []))
        self._by_item.update({item_id: response_id for item_id in items or {}})
        self._chars += chars
        self._held[owner] += 1
        self._held_chars[owner] += chars
        while len(self._items) > self.max_responses or self._chars > self.max_chars:
            self._forget_one(by_chars=len(self._items) <= self.max_responses)

    def _forget_one(self, *, by_chars: bool) -> None:
        """The least recently used response of the owner holding the most (responses, or characters
        when those are over)."""
        held = self._held_chars if by_chars else self._held
        heaviest = max(held, key=held.__getitem__)
        self._drop(next(rid for rid, item in self._items.items() if item.owner == heaviest))

    def _drop(self, response_id: str) -> None:
        old = self._items.pop(response_id)
        for item_id in old.items:
            self._by_item.pop(item_id, None)
        self._chars -= old.chars
        self._held[old.owner] -= 1
        self._held_chars[old.owner] -= old.chars
        if not self._held[old.owner]:
            del self._held[old.owner], self._held_chars[old.owner]

    def __len__(self) -> int:
        return len(self._items)


def with_answer(conversation: list[ChatMessageIn], content: str | None, calls: list[ToolCall]
                ) -> list[ChatMessageIn]:
    """The conversation and its answer, as the next request's history holds them: the answer's
    assistant turn after it. Where it ended with the assistant's text (a prefill, which the answer
    continues), that turn finished: kept apart, the next request saw two assistant turns, the
    first cut off mid-sentence."""
    last = conversation[-1] if conversation else None
    if last is not None and last.role == "assistant" and not last.tool_calls and isinstance(last.content, str):
        return [*conversation[:-1], ChatMessageIn(role="assistant", content=last.content + (content or ""),
                                                  tool_calls=calls or None)]
    return [*conversation, ChatMessageIn(role="assistant", content=content, tool_calls=calls or None)]

