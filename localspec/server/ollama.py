"""Ollama's API (`/api/chat`, `/api/generate`, ...) as the endpoint's own requests.

A tool written for Ollama (its Python and JS libraries, editors' Ollama providers) reaches the
same models with only its address changed. `/api/chat` becomes a `ChatCompletionRequest`,
`/api/generate` a chat turn (or, `raw` or with a `suffix`, a `CompletionRequest`), and both take
the endpoint's path from there: the same template, grammar, cache, router and speculation. The
answers go back in Ollama's shapes: one JSON object, or (its default) newline-delimited JSON.

Ollama's runtime options (`num_ctx`, `num_thread`, `num_gpu`, ...) are the server's to set and
are ignored, as Ollama ignores those it cannot apply; sampling options this engine lacks
(`mirostat`, `tfs_z`, `typical_p`) are a 400 naming them, since they would change the answer.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field, field_validator, model_validator

from localspec.engine.config import TemplateValue
from localspec.engine.events import Done
from localspec.server.errors import APIError
from localspec.server.translate import FieldNames
from localspec.server.schemas import (ChatCompletionRequest, ChatMessageIn, CompletionRequest, FunctionCall,
                                      JsonSchemaFormat, KeepAliveField, LocalspecOptions, ResponseFormat, Tool,
                                      ToolCall, _Body, _Request, check_stops, loads_bounded)

OLLAMA_API_VERSION = "0.9.0"
"""The Ollama release whose API these routes follow (`think`, `tool_name`, /api/show's
`capabilities`), as `/api/version` reports it: clients compare it with the least version they work
with (VS Code Copilot's Ollama provider refuses below 0.6.4), so localspec's own version there
(0.1.0) locked them out. localspec's version is /health's."""
OLLAMA_DEFAULT_TEMPERATURE = 0.8  # Ollama's when neither the request nor the model's settings set one
OLLAMA_FIELDS = FieldNames(max_tokens="options.num_predict", schema="format")
UNSERVED_OPTIONS = {"mirostat": 0, "tfs_z": 1.0, "typical_p": 1.0}  # their "off" values


DEFAULT_TAG = ":latest"


def untagged(name: str) -> str:
    """A model name without Ollama's default tag: Ollama reads `x` and `x:latest` as one model, and
    clients send either (a name copied from Ollama, or `:latest` added to a listed one)."""
    return name.removesuffix(DEFAULT_TAG) or name


def tagged(name: str) -> str:
    """A served name as Ollama lists it, with its tag: clients key the listing by it and add
    `:latest` to a bare name before they look it up (Open WebUI), so a bare listed name was no model."""
    return name if ":" in name else name + DEFAULT_TAG


ModelName = Annotated[str, Field(max_length=512), AfterValidator(untagged)]
"""A request's `model`, in the endpoint's spelling (see `untagged`)."""


class Options(_Request):
    """Ollama's `options`: the sampling ones map to the engine's; runtime ones are ignored (extra)."""

    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, gt=0.0, le=10.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    seed: int | None = Field(None, ge=0)
    stop: list[str] | str | None = None
    num_predict: int | None = Field(None, description="tokens to generate; -1 or -2: until the model stops")
    mirostat: int | None = None
    tfs_z: float | None = None
    typical_p: float | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: list[str] | str | None) -> list[str] | str | None:
        return check_stops(v)  # past the chat request's own check, ValidationError made a 500

    def check_served(self) -> None:
        for name, off in UNSERVED_OPTIONS.items():
            value = getattr(self, name)
            if value is not None and value != off:
                raise APIError(400, f"options.{name}={value} is not served by this engine; leave it out (or {off}).",
                               "unsupported_value", f"options.{name}")

    def sampling(self) -> dict[str, Any]:
        """The fields of an endpoint request these options set."""
        self.check_served()
        fields = {k: getattr(self, k) for k in ("temperature", "top_p", "top_k", "min_p", "repeat_penalty",
                                                "presence_penalty", "frequency_penalty", "seed", "stop")}
        if self.num_predict is not None and self.num_predict > 0:
            fields["max_tokens"] = self.num_predict
        elif self.num_predict == 0 or (self.num_predict is not None and self.num_predict < -2):
            raise APIError(400, f"options.num_predict={self.num_predict}: send a positive count, or -1 to let the "
                           "model stop by itself.", "invalid_value", "options.num_predict")
        return {k: v for k, v in fields.items() if v is not None}


class OllamaFunction(_Request):
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class OllamaToolCall(_Request):
    function: OllamaFunction


class OllamaMessage(_Request):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None  # a tool message's: which tool answered
    thinking: str | None = None  # another model's reasoning, sent back by clients: dropped

    @field_validator("content", mode="before")
    @classmethod
    def _null_is_empty(cls, value: Any) -> Any:
        return "" if value is None else value  # clients send null on an assistant turn of tool calls alone


class _Generation(_Body):
    model: ModelName
    format: Literal["json", ""] | dict[str, Any] | None = None
    options: Options | None = None
    stream: bool = True  # Ollama's default
    keep_alive: KeepAliveField = None
    # A thinking model's thought on or off, or its effort (gpt-oss), as its chat template reads them;
    # a template that reads neither ignores it. What thought there is comes apart as `thinking`.
    think: bool | Literal["high", "medium", "low"] | None = None

    def response_format(self) -> ResponseFormat | None:
        if not self.format:
            return None
        if self.format == "json":
            return ResponseFormat(type="json_object")
        return ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(name="format", schema=self.format))

    def think_vars(self) -> dict[str, TemplateValue] | None:
        """`think` as the chat template's variables (llama-server's chat_template_kwargs)."""
        if self.think is None:
            return None
        if isinstance(self.think, bool):
            return {"enable_thinking": self.think}
        return {"enable_thinking": True, "reasoning_effort": self.think}

    def common(self) -> dict[str, Any]:
        """The endpoint request's fields these share: sampling, length, stream, keep-alive."""
        return dict(model=self.model, stream=self.stream, keep_alive=self.keep_alive,
                    localspec=LocalspecOptions(default_temperature=OLLAMA_DEFAULT_TEMPERATURE),
                    **(self.options.sampling() if self.options else {}))


class OllamaChatRequest(_Generation):
    messages: list[OllamaMessage] = Field(default_factory=list, description="none: load the model and answer")
    tools: list[Tool] | None = None  # OpenAI's shape, as Ollama takes it


class OllamaGenerateRequest(_Generation):
    prompt: str = Field("", description="empty: load the model and answer")
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    raw: bool = False
    images: list[str] | None = None
    context: list[int] | None = None


def _no_images(images: list[str] | None, where: str) -> None:
    if images:
        raise APIError(400, f"{where}: images are not served; this server's models read text only.",
                       "unsupported_value", where)


def chat_request(body: OllamaChatRequest) -> ChatCompletionRequest:
    messages = []
    for i, m in enumerate(body.messages):
        _no_images(m.images, f"messages.{i}.images")
        calls = [ToolCall(id=f"call_{i}_{j}", function=FunctionCall(
                     name=c.function.name, arguments=c.function.arguments if isinstance(c.function.arguments, str)
                     else json.dumps(c.function.arguments)))
                 for j, c in enumerate(m.tool_calls or [])]
        messages.append(ChatMessageIn(role=m.role, content=m.content, tool_calls=calls or None,
                                      name=m.tool_name if m.role == "tool" else None))
    return ChatCompletionRequest(messages=messages, tools=body.tools, response_format=body.response_format(),
                                 chat_template_kwargs=body.think_vars(), **body.common())


def generate_request(body: OllamaGenerateRequest) -> ChatCompletionRequest | CompletionRequest:
    """A chat turn (the model's template around `system` and `prompt`), or, `raw` or with a `suffix`
    (fill-in-the-middle), the prompt as it is."""
    _no_images(body.images, "images")
    if body.template:
        raise APIError(400, "template is not served: the model's own chat template applies (send raw: true with "
                       "the whole prompt to use another).", "unsupported_value", "template")
    if body.context:
        raise APIError(400, "context is not served (Ollama deprecated it): send the conversation to /api/chat.",
                       "unsupported_value", "context")
    if body.raw or body.suffix is not None:
        if body.format:
            raise APIError(400, "format needs a chat turn: leave out raw and suffix, or format.", "invalid_value",
                           "format")
        return CompletionRequest(prompt=body.prompt, suffix=body.suffix, **body.common())
    system = [ChatMessageIn(role="system", content=body.system)] if body.system else []
    return ChatCompletionRequest(messages=[*system, ChatMessageIn(role="user", content=body.prompt)],
                                 response_format=body.response_format(), chat_template_kwargs=body.think_vars(),
                                 **body.common())


class OllamaEmbedRequest(_Body):
    model: ModelName
    input: str | list[str]
    truncate: bool = True  # a text past the embedding model's window is cut to fit; false: a 400
    keep_alive: str | float | None = None


class LegacyEmbeddingRequest(_Body):
    model: ModelName
    prompt: str


class ShowRequest(_Body):
    model: ModelName

    @model_validator(mode="before")
    @classmethod
    def _name_is_model(cls, data: Any) -> Any:
        """`name`: the field's older spelling, which Ollama still reads and Continue sends."""
        if isinstance(data, dict) and data.get("model") is None and "name" in data:
            return {**data, "model": data["name"]}
        return data


class PullRequest(ShowRequest):
    """`/api/pull`: a registry id or alias, or a Hub reference (hf.co/USER/REPO[:QUANT], as Ollama takes it)."""

    stream: bool = True
    insecure: bool = False  # Ollama's, for its own registry over plain HTTP: the Hub is always HTTPS here


class DeleteRequest(ShowRequest):
    """`/api/delete`: an installed model's name."""



# ---------------------------------------------------------------- answers


def now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class Timings(BaseModel):
    """Ollama's counts and durations (nanoseconds) on a finished answer."""

    total_duration: int
    load_duration: int = 0
    prompt_eval_count: int
    prompt_eval_duration: int
    eval_count: int
    eval_duration: int

    @classmethod
    def of(cls, done: Done, *, total_s: float) -> Timings:
        st = done.stats
        return cls(total_duration=int(total_s * 1e9), prompt_eval_count=st.prompt_tokens,
                   prompt_eval_duration=int(st.prefill_ms * 1e6), eval_count=st.completion_tokens,
                   eval_duration=int(st.decode_ms * 1e6))


class OllamaCall(BaseModel):
    function: OllamaFunction


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str = ""
    thinking: str | None = None  # a thinking model's thought, apart from the content (as Ollama's)
    tool_calls: list[OllamaCall] | None = None


def ollama_calls(calls: list[ToolCall]) -> list[OllamaCall] | None:
    """OpenAI's calls (arguments as JSON text) in Ollama's shape (arguments as an object)."""
    out = []
    for c in calls:
        try:
            args: dict[str, Any] | str = loads_bounded(c.function.arguments)
        except ValueError:
            args = c.function.arguments
        out.append(OllamaCall(function=OllamaFunction(name=c.function.name,
                                                      arguments=args if isinstance(args, dict) else {"value": args})))
    return out or None


class _Line(BaseModel):
    """What every line of Ollama's answers carries; the last has done and its reason."""

    model: str
    created_at: str = Field(default_factory=now_iso)
    done: bool
    done_reason: Literal["stop", "length", "load", "unload"] | None = None


class ChatLine(_Line):
    message: AssistantMessage


class GenerateLine(_Line):
    response: str
    thinking: str | None = None


def done_reason(done: Done) -> Literal["stop", "length"]:
    return "length" if done.finish_reason == "length" else "stop"


def ndjson_dict(data: dict[str, Any]) -> bytes:
    return json.dumps(data, ensure_ascii=False).encode() + b"\n"


def ndjson(line: BaseModel, timings: Timings | None = None) -> bytes:
    data = line.model_dump(mode="json", exclude_none=True)
    if timings is not None:
        data.update(timings.model_dump())
    return json.dumps(data, ensure_ascii=False).encode() + b"\n"
