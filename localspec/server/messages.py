"""Anthropic's Messages API (`POST /v1/messages`) as a chat request: its bodies, and the translation.

A Messages request is a chat request spelled another way (content blocks for message text,
`system` beside the messages, `tool_use` and `tool_result` blocks for calls and their results,
`input_schema` for a tool's parameters, `stop_sequences`, `output_config.format` for a JSON
schema), so it becomes a `ChatCompletionRequest` here and takes the chat path from there: the same
plan, grammar, cache, router and engine. The answer goes back as content blocks and, streamed, as
the API's typed events (routes/messages.py). Clients: Anthropic's SDKs, and tools that speak only
this API (Claude Code with ANTHROPIC_BASE_URL), as llama-server and Ollama serve it.

A conversation that ends on the assistant's turn is continued (Anthropic's prefill): the chat path
continues a final assistant message. What the API has and a local server cannot do (images, PDF
documents, server tools, MCP servers, containers) is a 400 naming it; an offered web search is
dropped (the model answers from what it knows); `thinking` turns a thinking model's thought on or
off where its chat template reads enable_thinking (Qwen3's); what thought there is (its <think> block)
comes as a `thinking` block before the text, with an empty signature; one sent back in a conversation
is dropped.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, TypeAdapter, ValidationError, field_validator, model_validator

from localspec.engine.config import TemplateValue

from localspec.server.errors import APIError
from localspec.server.schemas import (MAX_STOPS, ChatCompletionRequest, ChatMessageIn, Extension, FunctionCall,
                                      FunctionDef, JsonSchemaFormat, KeepAliveField, LocalspecOptions, ResponseFormat,
                                      Tool, ToolCall, ToolChoiceFunction, ToolChoiceNamed, _Body, _Request,
                                      loads_bounded)
from localspec.server.translate import FieldNames

# ---------------------------------------------------------------- the request

SERVED_BLOCKS = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking", "document")
"""The content blocks a message may hold here. Thinking blocks (another model's, sent back by a
client that keeps them) are dropped; a document is served when its source is plain text."""
WEB_SEARCH = "web_search_"  # the server tools' type prefix (web_search_20250305, ...): dropped when offered
_TEXT_FIX = 'send a string, or a list of text blocks ({"type": "text", "text": "..."})'
_CONTENT_FIX = 'send a string, or a list of content blocks ({"type": "text", "text": "..."}, ...)'


def _json_kind(value: Any) -> str:
    """What a JSON value is, in words, for an error that names what came instead."""
    kinds = ((type(None), "null"), (bool, "a boolean"), (int | float, "a number"), (str, "a string"), (list, "a list"))
    return next((words for kind, words in kinds if isinstance(value, kind)), "an object")


class TextBlock(_Request):
    type: Literal["text"]
    text: str


class TextSource(_Request):
    type: Literal["text"]
    data: str
    media_type: str | None = None


class DocumentBlock(_Request):
    """A document whose source is plain text: its text is read as the message's. PDF and other
    binary sources are refused where the blocks are checked (Messages._blocks)."""

    type: Literal["document"]
    source: TextSource
    title: str | None = None


class ToolUseBlock(_Request):
    """A call the model made earlier, sent back with the conversation (assistant turns)."""

    type: Literal["tool_use"]
    id: str = Field(max_length=256)
    name: str = Field(max_length=256)
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(_Request):
    """A tool's result, answering the call with the same id (user turns)."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(max_length=256)
    content: str | list[TextBlock] = ""
    is_error: bool = False


class ThinkingBlock(_Request):
    """Another model's thinking: these models neither read nor write it, so it is dropped."""

    type: Literal["thinking", "redacted_thinking"]


Block = Annotated[TextBlock | DocumentBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock,
                  Field(discriminator="type")]


class Message(_Request):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class CustomTool(_Request):
    """A tool the client runs: Anthropic's name, description and input_schema."""

    type: Literal["custom"] = "custom"
    name: str = Field(max_length=256)
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class ToolChoice(_Request):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class OutputFormat(_Request):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class ThinkingConfig(_Request):
    """Whether to think: the chat template's enable_thinking (Qwen3's). A budget is not kept: a thought
    runs until the model closes it, within max_tokens."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=0)

    def template_vars(self) -> dict[str, TemplateValue]:
        return {"enable_thinking": self.type != "disabled"}


class OutputConfig(_Request):
    format: OutputFormat | None = None
    effort: str | None = None  # how hard a Claude model thinks: these models have one effort


_UNSERVED = {  # fields with a value no local server can honour: the 400 names each
    "mcp_servers": "MCP servers are not reached from this server; run the tools in your client and send them as "
                   "tools",
    "container": "code-execution containers are not served; run code in your client",
}


class MessagesRequest(_Body):
    model: str = Field(..., max_length=512, description="a model id or alias from /v1/models, or 'auto'")
    max_tokens: int = Field(..., ge=1, description="required, as on Anthropic's API")
    messages: list[Message] = Field(..., min_length=1)
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOPS)
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0, le=1.0, description="default 1.0 (Anthropic's); 0 = greedy")
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    tools: list[CustomTool] | None = None
    tool_choice: ToolChoice | None = None
    output_config: OutputConfig | None = None
    thinking: ThinkingConfig | None = Field(None, description="a thinking model's thought on (enabled, adaptive) "
                                                             "or off (disabled), as its chat template reads it")
    metadata: dict[str, Any] | None = None
    mcp_servers: list[Any] | None = None
    container: Any = None
    localspec: LocalspecOptions | None = None
    keep_alive: KeepAliveField = None

    @field_validator("messages", mode="before")
    @classmethod
    def _blocks(cls, value: Any) -> Any:
        """Each block this server cannot read is named here, with its place: pydantic's union error
        would name the string branch instead ("messages.0.content.str: Input should be a valid string")."""
        if not isinstance(value, list):
            return value
        for i, message in enumerate(value):
            blocks = message.get("content") if isinstance(message, dict) else None
            if isinstance(message, dict) and "content" in message and not isinstance(blocks, str | list):
                # pydantic named the union's list branch alone ("Input should be a valid list")
                raise ValueError(f"messages[{i}].content is {_json_kind(blocks)}: {_CONTENT_FIX}")
            for j, block in enumerate(blocks if isinstance(blocks, list) else []):
                kind = block.get("type") if isinstance(block, dict) else None
                where = f"messages[{i}].content[{j}]"
                if kind not in SERVED_BLOCKS:
                    what = f"a block of type {kind!r}" if kind else "not a content block"
                    raise ValueError(f"{where} is {what}, which is not served: this server's models read text "
                                     f"({', '.join(SERVED_BLOCKS)} blocks)")
                source = block.get("source") if kind == "document" else None
                if kind == "document" and not (isinstance(source, dict) and source.get("type") == "text"):
                    raise ValueError(f"{where} is a document whose source is not plain text, which is not served: "
                                     'send its text as {"type": "text", "media_type": "text/plain", "data": ...}')
                result = block.get("content", "") if kind == "tool_result" else ""
                if not isinstance(result, str | list):  # pydantic named the list branch alone
                    raise ValueError(f"{where}.content is {_json_kind(result)}: the tool's result is text; {_TEXT_FIX}")
                if isinstance(result, list):
                    for part in result:
                        if not isinstance(part, dict) or part.get("type") != "text":
                            raise ValueError(f"{where} holds a tool result that is not text, which is not served: "
                                             f"{_TEXT_FIX}")
            for j, block in enumerate(blocks if isinstance(blocks, list) else []):
                _check(_BLOCK, block, f"messages[{i}].content[{j}]")
                _check_place(block["type"], message.get("role"), f"messages[{i}].content[{j}]")
            _check(Message, message, f"messages[{i}]")
        return value

    @field_validator("system", mode="before")
    @classmethod
    def _system_text(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, str | list):  # pydantic named its string branch ("system.str")
            raise ValueError(f"{_json_kind(value)} is not a system prompt: {_TEXT_FIX}")
        for j, block in enumerate(value if isinstance(value, list) else []):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind != "text":
                what = f"a block of type {kind!r}" if kind else "not a block"
                raise ValueError(f"system[{j}] is {what}: the system prompt is text; {_TEXT_FIX}")
            _check(TextBlock, block, f"system[{j}]")
        return value

    @field_validator("tools", mode="before")
    @classmethod
    def _client_tools(cls, value: Any) -> Any:
        """The client's own tools; an offered web search is dropped, any other server tool named."""
        if not isinstance(value, list):
            return value
        kept = []
        for i, tool in enumerate(value):
            if not isinstance(tool, dict):
                raise ValueError(f"tools[{i}] is {_json_kind(tool)}, not a tool: send "
                                 '{"name": ..., "description": ..., "input_schema": {...}}')
            kind = tool.get("type") or "custom"
            if isinstance(kind, str) and kind.startswith(WEB_SEARCH):
                continue
            if kind != "custom":
                raise ValueError(f"tools[{i}] is a {kind!r} tool, which is not served: this server runs the tools "
                                 "your client defines (name, description, input_schema) and your client calls")
            kept.append(tool)
        return kept

    @model_validator(mode="before")
    @classmethod
    def _no_search_forced(cls, data: Any) -> Any:
        """A call forced where the tool it would call is an offered web search (dropped) was "the request has no
        tools": the client had sent one. It is named as what it is, before the tools are dropped."""
        choice, tools = (data.get("tool_choice"), data.get("tools")) if isinstance(data, dict) else (None, None)
        if not isinstance(choice, dict) or not isinstance(tools, list) or not tools:
            return data
        search = [t for t in tools if isinstance(t, dict) and str(t.get("type") or "").startswith(WEB_SEARCH)]
        if (choice.get("type") == "any" and len(search) == len(tools)) or (
                choice.get("type") == "tool" and any(t.get("name") == choice.get("name") for t in search)):
            raise ValueError(f"tool_choice {choice.get('type')!r} forces a web search, which is not served here (the "
                             "model answers from what it knows): offer your own tools, or send type 'auto'")
        return data

    def check_served(self) -> None:
        """A 400 for a field whose value would change the answer in a way this server cannot."""
        for name, why in _UNSERVED.items():
            if getattr(self, name):
                raise APIError(400, f"{name}: {why}.", "unsupported_value", name)


_BLOCK: TypeAdapter[Any] = TypeAdapter(Block)


def _check(model: type[BaseModel] | TypeAdapter[Any], value: Any, where: str) -> None:
    """Validate one message or block, its first error named from `where` on by the fields the client
    sent: pydantic's would name a union's branch ("content.str: Input should be a valid string")."""
    try:
        model.validate_python(value) if isinstance(model, TypeAdapter) else model.model_validate(value)
    except ValidationError as exc:
        errs = exc.errors()
        err = next((e for e in errs if not any(p == "str" for p in e["loc"])), errs[0])  # past the string branch
        loc = list(err["loc"])
        if isinstance(model, TypeAdapter) and loc and isinstance(value, dict) and loc[0] == value.get("type"):
            loc = loc[1:]  # the discriminated union's tag: the block's type, which the client knows
        path = [str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p == "str"))]
        raise ValueError(f"{where}{''.join(f'[{p}]' if p.isdigit() else f'.{p}' for p in path)}: {err['msg']}") \
            from None


_PLACES = {"tool_use": ("assistant", "the model's calls belong to assistant turns, each answered by a tool_result "
                                   "block in the user turn after"),
           "tool_result": ("user", "a call's result belongs to the user turn after the assistant turn that made "
                                   "the call")}


def _check_place(kind: str, role: Any, where: str) -> None:
    """A tool_use block in a user turn, or a tool_result in an assistant turn, is a 400 (as on Anthropic's API):
    the turn's translation has no place for it, and the model never saw it."""
    place = _PLACES.get(kind)
    if place is not None and role in ("user", "assistant") and role != place[0]:
        turn = "a user" if role == "user" else "an assistant"
        raise ValueError(f"{where} is a {kind} block in {turn} turn: {place[1]}")


MESSAGES_FIELDS = FieldNames(max_tokens="max_tokens", schema="output_config.format.schema",
                             tool_parameters="tools[{i}].input_schema", prompt="messages")


# ---------------------------------------------------------------- to a chat request

def _text(content: str | list[TextBlock]) -> str:
    return content if isinstance(content, str) else "\n".join(b.text for b in content)


def _document(block: DocumentBlock) -> str:
    return f"{block.title}\n\n{block.source.data}" if block.title else block.source.data


def _turn(message: Message) -> list[ChatMessageIn]:
    """One Messages turn as chat messages. A user turn's tool results come first, each a tool
    message, then its text; an assistant turn is its text and its calls."""
    if isinstance(message.content, str):
        return [ChatMessageIn(role=message.role, content=message.content)]
    texts: list[str] = []
    results: list[ChatMessageIn] = []
    calls: list[ToolCall] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, DocumentBlock):
            texts.append(_document(block))
        elif isinstance(block, ToolUseBlock):
            calls.append(ToolCall(id=block.id, function=FunctionCall(name=block.name,
                                                                     arguments=json.dumps(block.input))))
        elif isinstance(block, ToolResultBlock):
            # The model reads a failed call's result as text: say it failed, as the API tells Claude.
            result = _text(block.content)
            results.append(ChatMessageIn(role="tool", tool_call_id=block.tool_use_id,
                                         content=f"Error: {result}" if block.is_error else result))
    text = "\n".join(texts)
    if message.role == "assistant":
        return [ChatMessageIn(role="assistant", content=text or None, tool_calls=calls or None)] \
            if text or calls else []
    return [*results, *([ChatMessageIn(role="user", content=text)] if text or not results else [])]


BILLING_HEADER = "x-anthropic-billing-header:"
"""Claude Code's first system line: its cch= changes on every request, so kept, no two of its prompts would share
more than a few tokens (no KV state reused, no cache hit). It tells a local model nothing."""


def _system(system: str | list[TextBlock] | None) -> str:
    """The system prompt's text, without Claude Code's billing line (BILLING_HEADER)."""
    texts = [system] if isinstance(system, str) else [b.text for b in system or []]
    kept = [t.partition("\n")[2] if t.startswith(BILLING_HEADER) else t for t in texts]
    return "\n".join(t for t in kept if t)


def _merged(messages: list[ChatMessageIn]) -> list[ChatMessageIn]:
    """Consecutive user (or assistant) messages as one: Anthropic's API combines consecutive turns of one role,
    and templates that require the roles to alternate (Gemma's, Mistral's) refuse them. A turn that held only
    thinking is no message, so the turns around it meet here too."""
    out: list[ChatMessageIn] = []
    for m in messages:
        last = out[-1] if out else None
        if last is None or m.role != last.role or m.role not in ("user", "assistant"):
            out.append(m)
            continue
        text = "\n".join(t for t in (last.content, m.content) if isinstance(t, str) and t)
        calls = [*(last.tool_calls or []), *(m.tool_calls or [])]
        out[-1] = ChatMessageIn(role=m.role, content=text if m.role == "user" else text or None,
                                tool_calls=calls or None)
    return out


def chat_messages(body: MessagesRequest) -> list[ChatMessageIn]:
    """The system prompt and the turns as chat messages (the chat template's roles)."""
    system = _system(body.system)
    out = [ChatMessageIn(role="system", content=system)] if system else []
    for message in body.messages:
        out += _turn(message)
    return _merged(out)


def _tool_choice(choice: ToolChoice | None) -> Any:
    if choice is None:
        return None
    if choice.type == "tool":
        if not choice.name:
            raise APIError(400, "tool_choice of type 'tool' needs the tool's 'name'.", "invalid_value", "tool_choice")
        return ToolChoiceNamed(function=ToolChoiceFunction(name=choice.name))
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


def as_chat(body: MessagesRequest, cap: int | None = None) -> ChatCompletionRequest:
    """The chat request this Messages request means. `cap`: the server's --max-tokens-cap, which bounds a
    max_tokens past it (Ollama's routes do the same): the API requires max_tokens, and its clients send their
    own ceiling on every request (Claude Code 32000), which a 400 would refuse every time."""
    body.check_served()
    messages = chat_messages(body)
    if not any(m.role != "system" for m in messages):
        raise APIError(400, "messages hold no text: send at least one user message with text.", "invalid_value",
                       "messages")
    fmt = body.output_config.format if body.output_config else None
    if fmt is not None and body.tools and body.tool_choice and body.tool_choice.type in ("any", "tool"):
        # the chat path's own 400 names response_format, a field this API has not
        raise APIError(400, "output_config.format cannot be combined with a forced tool call (tool_choice 'any' or "
                       "'tool'): the answer is the call, or JSON of the schema; leave one out.", "invalid_value",
                       "output_config")
    response_format = None
    if fmt is not None:
        response_format = ResponseFormat(type="json_schema",
                                         json_schema=JsonSchemaFormat(name="output", schema=fmt.schema_))
    tools = [Tool(function=FunctionDef(name=t.name, description=t.description, parameters=t.input_schema))
             for t in body.tools] if body.tools else None
    return ChatCompletionRequest(
        model=body.model, messages=messages, temperature=body.temperature,
        max_tokens=min(body.max_tokens, cap) if body.max_tokens and cap else body.max_tokens,
        top_p=body.top_p, top_k=body.top_k or None, stop=body.stop_sequences, stream=body.stream, tools=tools,
        tool_choice=_tool_choice(body.tool_choice),
        parallel_tool_calls=False if body.tool_choice and body.tool_choice.disable_parallel_tool_use else None,
        response_format=response_format, localspec=body.localspec, keep_alive=body.keep_alive,
        chat_template_kwargs=body.thinking.template_vars() if body.thinking else None,
    )


# ---------------------------------------------------------------- the answer

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class TextOut(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingOut(BaseModel):
    """A thinking model's thought. Its signature is empty: nothing here signs it (Anthropic's clients
    send it back as it came, and it is dropped then)."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""


class ToolUseOut(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


ContentOut = ThinkingOut | TextOut | ToolUseOut


class MessageUsage(BaseModel):
    """Anthropic's usage: input_tokens excludes what was read from the cache, so the prompt is the three
    summed. Here the "cache" is the KV state reused from an earlier request (the same prefix)."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class MessageObject(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentOut] = Field(default_factory=list)
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: MessageUsage
    localspec: Extension | None = None


class TokenCount(BaseModel):
    input_tokens: int


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the tool_use block's input object. Arguments that are no JSON object (a
    model wrote a string) are kept whole under "arguments": the client sees what the model wrote."""
    try:
        parsed = loads_bounded(arguments or "{}")
    except ValueError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {"arguments": arguments}


def tool_use_id(call: ToolCall) -> str:
    """Anthropic names calls toolu_...; the chat path's ids are call_..."""
    return "toolu_" + call.id.removeprefix("call_")
