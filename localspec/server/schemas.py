"""Pydantic models of the OpenAI-compatible API: every request and response body.

Requests ignore unknown fields (clients send `user`, `metadata`, `store`, ...) so a newer client
never breaks; fields we do not support with a value that matters get a 400 from the handlers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from localspec.engine.config import TemplateValue, check_template_vars

from localspec.server.keepalive import parse_keep_alive

DEFAULT_TEMPERATURE = 1.0  # OpenAI's default when `temperature` is omitted


def _checked_keep_alive(value: str | float | None) -> str | float | None:
    if value is not None:
        parse_keep_alive(value)  # ValueError: a 400 naming the forms
    return value


# A request's keep_alive (every API's: OpenAI's routes as an extension, Responses, Ollama's), checked.
KeepAliveField = Annotated[str | float | None, AfterValidator(_checked_keep_alive)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


MAX_JSON_DEPTH = 240
JSON_TOO_DEEP = "json_too_deep"  # the error type (and the reply's code) of a body nested past it
"""Arrays and objects nested in one request body, the body itself the first. A body nested deeper
left Python's recursion limit to whichever step walked it first (a traceback and a 500), and an
echo of it (a Response's tools) past pydantic's serialization depth of 255; JSON schemas are
bounded far below this (grammar_limits.max_depth), so no real request comes near it."""


def _valid_unicode(value: Any, where: str = "") -> None:
    """JSON's \\ud800 escapes decode to lone surrogates, which no tokenizer can encode: refuse them
    (400), and bodies nested over MAX_JSON_DEPTH. Iterative: a deep body cannot exhaust the stack."""
    pending: list[tuple[Any, str, int]] = [(value, where, 1)]
    while pending:
        item, at, depth = pending.pop()
        if isinstance(item, str):
            _check_text(item, at)
            continue
        if not isinstance(item, dict | list):
            continue
        if depth > MAX_JSON_DEPTH:  # its own error type: the reply's code says "too deep", not "invalid"
            raise PydanticCustomError(JSON_TOO_DEEP, "{where} nests arrays and objects over {limit} levels deep, "
                                      "this server's limit; send flatter JSON",
                                      {"where": _short(at) or "body", "limit": MAX_JSON_DEPTH})
        if isinstance(item, dict):
            for k in item:
                _check_text(k, at)
            pairs: Iterable[tuple[Any, Any]] = item.items()
        else:
            pairs = enumerate(item)
        # reversed: the stack pops them in the body's own order, so the first bad field is named
        pending += reversed([(v, f"{at}.{k}" if at else str(k), depth + 1) for k, v in pairs])


def _check_text(text: object, where: str) -> None:
    if isinstance(text, str) and not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"{_short(where) or 'body'} holds a lone UTF-16 surrogate ({text[exc.start]!r}), "
                             "which is not valid Unicode") from None


def _short(path: str, keep: int = 80) -> str:
    """A field's path for a one-line error: a deep one is cut, its start kept (where it went deep)."""
    return path if len(path) <= keep else path[:keep] + "..."


def json_within_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether `value` (parsed JSON) nests arrays and objects at most `limit` levels deep."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return False
            pending += [(v, depth + 1) for v in (item.values() if isinstance(item, dict) else item)]
    return True


def loads_bounded(text: str) -> Any:
    """JSON text (a tool call's arguments) parsed, or ValueError when it is not JSON or nests over
    MAX_JSON_DEPTH: json.loads raised RecursionError (a 500) for text nested past the stack's depth.
    A lone surrogate escape ("\\ud800", which a model may write) reads as U+FFFD, as an undecodable byte
    does: kept, no JSON answer could encode it (a 500, or a stream cut off, on /v1/messages and /api/chat)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deep to read") from None
    if not json_within_depth(value):
        raise ValueError(f"JSON nested over {MAX_JSON_DEPTH} levels")
    return _unpaired_replaced(value) if "\\u" in text else value


def _unpaired_replaced(value: Any) -> Any:
    """`value` with each lone UTF-16 surrogate in its strings (keys too) replaced by U+FFFD."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace") if not value.isascii() else value
    if isinstance(value, dict):
        return {_unpaired_replaced(k): _unpaired_replaced(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unpaired_replaced(v) for v in value]
    return value


class _Body(_Request):
    """A whole request body: its text must be encodable before it reaches a tokenizer, and its
    nesting within MAX_JSON_DEPTH before anything walks it."""

    @model_validator(mode="before")
    @classmethod
    def _unicode(cls, data: Any) -> Any:
        _valid_unicode(data)
        return data


class StreamOptions(_Request):
    include_usage: bool = False


class LocalspecOptions(_Request):
    """The `localspec` extension in a request body (`extra_body={"localspec": {...}}`)."""

    mode: Literal["auto", "off", "draft", "lookup"] | None = Field(None,
                                                                   description="speculation mode for this request")
    k: int | None = Field(None, ge=0, le=32, description="draft length")
    cache: bool | None = Field(None, description="false: never answer this request from the cache nor store it")
    origins: bool = Field(False, description="stream=true: each text chunk says where its token came from "
                                             "(localspec.origin), as the in-process faces colour it")
    default_temperature: float | None = Field(
        None, ge=0.0, le=2.0, description=f"the temperature when neither the request nor the model's settings set "
                                          f"one (default {DEFAULT_TEMPERATURE}); the attached faces send their own")


class ContentPart(_Request):
    type: str
    text: str | None = None


class PredictionIn(_Request):
    """`prediction` (OpenAI's Predicted Outputs): the answer the client expects, mostly (the file an
    edit returns). Its tokens are drafted while the answer follows it; the answer itself is the model's."""

    type: Literal["content"]
    content: str | list[ContentPart] = Field(description="the predicted text, or text parts joined in order")


MAX_STOPS = 16


def check_stops(v: str | list[str] | None) -> str | list[str] | None:
    """`stop` as a validator: at most MAX_STOPS strings (every route that takes stop strings)."""
    if isinstance(v, list) and len(v) > MAX_STOPS:
        raise ValueError(f"at most {MAX_STOPS} stop strings")
    return v


class _Sampling(_Body):
    model: str = Field(..., max_length=512, description="a model id or alias from /v1/models, or 'auto'")
    max_tokens: int | None = Field(None, ge=1, description="default: the server's cap")
    temperature: float | None = Field(
        None, ge=0.0, le=2.0, description=f"default {DEFAULT_TEMPERATURE} (OpenAI's); 0 = greedy"
    )
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    # llama.cpp's sampling fields beyond OpenAI's (llama-server takes them too; Ollama's options map here)
    top_k: int | None = Field(None, ge=0, description="(llama.cpp) keep the k likeliest tokens; 0 = off")
    min_p: float | None = Field(None, ge=0.0, le=1.0, description="(llama.cpp) drop tokens below min_p x the top one's "
                                                                  "probability")
    repeat_penalty: float | None = Field(None, gt=0.0, le=10.0, description="(llama.cpp) 1 = off")
    n: int = Field(1, description="how many choices: 1 to the server's --parallel, each generated on its own (with "
                                  "a seed, choice i samples with seed + i)")
    logit_bias: dict[str, float] | None = Field(None, description="not supported: a 400 unless empty")
    stream: bool = False
    stream_options: StreamOptions | None = None
    prediction: PredictionIn | None = Field(None, description="Predicted Outputs (on /v1/completions: a localspec "
                                                              "extension)")
    localspec: LocalspecOptions | None = None
    keep_alive: KeepAliveField = Field(None, description="(localspec, as Ollama) how long the models stay loaded "
                                                         "after this request: 5m, seconds, 0, -1 = forever")

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        return check_stops(v)

    @property
    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


# ---------------------------------------------------------------- chat


class FunctionCall(BaseModel):
    name: str
    arguments: str = Field(..., description="JSON text")


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessageIn(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDef(_Request):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Request):
    type: Literal["function"] = "function"
    function: FunctionDef


class ToolChoiceFunction(_Request):
    name: str


class ToolChoiceNamed(_Request):
    type: Literal["function"] = "function"
    function: ToolChoiceFunction


class JsonSchemaFormat(_Request):
    name: str = "response"
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessageIn] = Field(..., min_length=1)
    reasoning_format: Literal["none", "auto", "deepseek", "deepseek-legacy"] | None = Field(
        None, description="(llama-server's) none: a thinking model's <think> thought stays in content; "
                          "otherwise it comes apart, as reasoning_content")
    chat_template_kwargs: dict[str, TemplateValue] | None = Field(
        None, description="(llama-server's and vLLM's) more variables for the chat template: enable_thinking "
                          "false turns a Qwen3's thought off")
    reasoning_effort: str | None = Field(
        None, max_length=32, description="none: the template's thought off (enable_thinking false); else on, at "
                                         "this effort (low, medium, high...: reasoning_effort, as gpt-oss's reads it)")
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceNamed | None = None
    parallel_tool_calls: bool | None = Field(None, description="false: at most one tool call")

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_vars(cls, v: dict[str, TemplateValue] | None) -> dict[str, TemplateValue] | None:
        return check_template_vars(v)


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprobOut(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprobOut] | None = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None  # a thinking model's thought, as llama-server and DeepSeek return it
    tool_calls: list[ToolCall] | None = None


class CompletionTokensDetails(BaseModel):
    """Predicted Outputs' counts (only when the request sent a `prediction`): accepted, the prediction's
    tokens the answer took from it; rejected, its tokens drafted and not kept. See docs/predicted-outputs.md."""

    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    completion_tokens_details: CompletionTokensDetails | None = None


class AutoReport(BaseModel):
    """What mode `auto` chose for an answer, and why it did not draft when it did not."""

    steps: dict[str, int] = Field(description="target passes per choice: off, lookup, draft, prediction")
    explored: int = Field(0, description="passes that tried a choice believed not to pay, so wrong costs heal")
    why_not_draft: str | None = Field(None, description="the best drafting option's numbers when plain decoding won")


class Extension(BaseModel):
    """The `localspec` object on responses: how the answer was made."""

    model_config = ConfigDict(extra="allow")

    mode: str
    k: int | None = None
    grammar: Literal["enforced", "partial", "none"] = Field(
        "none", description="partial: the schema holds keywords the grammar does not keep (named in fallback)")
    fallback: str | None = Field(None, description="why a requested feature ran in a simpler way")
    drafted: int = 0
    accepted: int = 0
    acceptance_rate: float = 0.0
    drafted_by_position: list[int] = Field(default_factory=list)
    accepted_by_position: list[int] = Field(default_factory=list)
    prompt_tokens: int = 0
    reused_prefix_tokens: int = 0
    timings: dict[str, float] = Field(default_factory=dict)
    target_passes: int = Field(0, description="target forward passes after the first token")
    cache: dict[str, Any] | None = None
    route: dict[str, Any] | None = None
    auto: AutoReport | None = None
    # Left out of a one-choice answer, which stays as it was before n was served.
    choices: list[Extension] | None = Field(
        None, exclude_if=lambda v: v is None,
        description="n > 1: every choice's own object, by index (the object itself is choice 0's)")


class ChunkExtension(BaseModel):
    """The `localspec` object on a streamed text chunk, when the request asked for `origins`."""

    origin: Literal["draft", "prediction", "target", "cache"] = Field(
        description="draft: a drafter's token the target accepted; prediction: a predicted token it accepted; "
                    "target: its own; cache: replayed from the semantic cache")


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessageOut
    finish_reason: Literal["stop", "length", "tool_calls", "content_filter"] | None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
    localspec: Extension | None = None


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCall | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: Literal["stop", "length", "tool_calls", "content_filter"] | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    localspec: Extension | ChunkExtension | None = None


# ---------------------------------------------------------------- completions


class CompletionRequest(_Sampling):
    prompt: str | list[str] = Field(..., description="one prompt (a list must hold exactly one)")
    suffix: str | None = Field(None, description="text after the insertion point: fill-in-the-middle")
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    best_of: int | None = Field(None, description="only 1 is supported (n gives several completions)")


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None = None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: Literal["stop", "length"] | None
    logprobs: CompletionLogprobs | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    localspec: Extension | ChunkExtension | None = None


# ---------------------------------------------------------------- models, embeddings, errors


class ModelInfo(BaseModel):
    """localspec's extension on a /v1/models entry: what the name means and whether it is loaded."""

    model: str | None = Field(None, description="the model that answers the name (\"router\" for auto)")
    role: Literal["chat", "embedding"] = "chat"
    route: str | None = Field(None, description="the router tier it answers for (large, small, auto)")
    target: str | None = Field(None, description="the profile's target (on the profile's names only)")
    profile: str | None = None
    loaded: bool = Field(description="in memory now; false: the next request naming it loads it")
    on_demand: bool = Field(False, description="an installed model beyond the profile's, loaded when a request "
                                               "names it")
    adapter: str | None = Field(None, description="the LoRA adapter applied to the target (file name and scale)")


class ModelCard(BaseModel):
    """A served name as OpenAI's model object and Anthropic's at once (their fields do not collide), so
    either SDK's `models.list()` reads the one route."""

    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "localspec"
    type: Literal["model"] = "model"  # Anthropic's
    display_name: str = ""  # Anthropic's: the id
    created_at: str = "1970-01-01T00:00:00Z"  # Anthropic's (RFC 3339), as `created` says 0: not known
    localspec: ModelInfo | None = None

    @model_validator(mode="after")
    def _named(self) -> ModelCard:
        self.display_name = self.display_name or self.id
        return self


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
    has_more: bool = False  # Anthropic's paging: one page holds every name
    first_id: str | None = None
    last_id: str | None = None

    @model_validator(mode="after")
    def _ends(self) -> ModelList:
        self.first_id = self.data[0].id if self.data else None
        self.last_id = self.data[-1].id if self.data else None
        return self


class EmbeddingRequest(_Body):
    model: str = Field(max_length=512)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class CacheVerdict(BaseModel):
    entry_id: str
    evicted: bool


class CacheVerdictRequest(_Body):
    token: str = Field(max_length=128, description="localspec.cache.verdict_token from the response that served "
                                                   "the entry")


class PsModel(BaseModel):
    """One loaded model, as `ollama ps` shows it."""

    name: str
    role: Literal["target", "draft", "embedding"]
    tier: str | None = Field(None, description="the router tier it answers for (large, small)")
    size_bytes: int = Field(description="its weights file; about what it takes in memory, KV cache aside")
    processor: str = Field(description="where it runs: CPU, or the GPU with the layers offloaded")
    n_ctx: int | None = Field(None, description="context tokens per slot")
    slots: int | None = Field(None, description="sequence slots (parallel requests)")
    slots_busy: int | None = None
    keep_alive_s: float | None = Field(None, description="what the last request for it asked for (null: forever)")
    expires_at: float | None = Field(None, description="Unix time it unloads if no request comes (null: never, or "
                                                       "busy now)")
    on_demand: bool = Field(False, description="loaded because a request named it, beyond the profile's")


class PsReport(BaseModel):
    status: Literal["ok", "loading", "error", "idle"]
    profile: str | None = None
    models: list[PsModel] = Field(default_factory=list, description="loaded models (none while idle)")
    queue: int = Field(0, description="requests admitted and waiting for a slot")
    running: int = Field(0, description="requests decoding or waiting")
    keep_alive_s: float | None = Field(None, description="what the last request asked for (null: forever)")
    expires_at: float | None = Field(None, description="Unix time the models unload if no request comes (null: "
                                                       "never, or busy now)")
    rss_bytes: int = Field(0, description="the server process's resident memory")
    loading: list[str] = Field(default_factory=list, description="models loading on demand now")


class StopRequest(_Body):
    model: str = Field(max_length=512, description="a model name the server serves")


class StopReply(BaseModel):
    model: str
    unloaded: bool = Field(description="false: it was not loaded")


class Health(BaseModel):
    """`server` and `version` let a face tell a localspec server from anything else on the port."""

    status: Literal["ok", "loading", "error", "idle"] = Field(
        description="idle: the models were unloaded (keep_alive, stop) and load again on the next request")
    detail: str | None = None
    server: Literal["localspec"] = "localspec"
    version: str
