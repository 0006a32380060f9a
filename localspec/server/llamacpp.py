"""llama.cpp's own server API (llama-server's `/completion`, `/infill`, `/tokenize`, `/detokenize`,
`/apply-template`, `/props`) as the endpoint's own requests.

The tools written for llama-server (ggml-org's llama.vscode and llama.vim autocomplete through
`/infill`, token counters through `/tokenize`) reach the same models with only their address
changed. `/completion` becomes a `CompletionRequest`; `/infill` a fill-in-the-middle prompt laid
out as llama-server lays it out (the repo-level pattern of Qwen2.5-Coder where the vocabulary has
`<|repo_name|>` and `<|file_sep|>`), then a `CompletionRequest` too: the same cache, router and
speculation; `grammar` and `json_schema` become the engine's grammar as `response_format` does on
the OpenAI routes (the same converter and bounds). Answers go back in llama-server's shapes: one
JSON object, or SSE `data:` lines of `content` ending with one that says `stop: true` and why.

Fields that only steer llama-server's own machinery (`id_slot`, `cache_prompt`, `samplers`'
order, `t_max_prompt_ms`, `n_keep`, ...) are accepted and have no effect: this server places
requests and reuses prefixes itself. Fields whose value would change the answer in a way this
engine cannot (`mirostat`, `logit_bias`, `lora`, token-id prompts, ...) are a 400 naming them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field, field_validator

from localspec.engine.config import PromptPiece
from localspec.engine.events import Done
from localspec.engine.grammar_limits import GrammarTooLarge, GrammarUnparsable, check_gbnf
from localspec.server.errors import APIError
from localspec.server.schemas import (ChatCompletionRequest, ChatMessageIn, CompletionRequest, KeepAliveField,
                                      LocalspecOptions, Tool, _Body, _Request, check_stops)
from localspec.server.translate import FieldNames, Plan, SchemaGrammar, completion_plan, fim_pieces, schema_grammar

LLAMACPP_DEFAULT_TEMPERATURE = 0.8  # llama-server's when a request sends none
LLAMACPP_FIELDS = FieldNames(max_tokens="n_predict", prompt="prompt")
INFILL_FIELDS = FieldNames(max_tokens="n_predict", prompt="input_prefix")

FIM_REPO, FIM_FILE_SEP = "<|repo_name|>", "<|file_sep|>"  # Qwen2.5-Coder's repo-level tokens
REPO_MARKERS = (FIM_REPO, FIM_FILE_SEP)
REPO_NAME = "myproject"  # the repository name llama-server writes (the clients send none)
CURRENT_FILE = "filename"  # and the current file's: the clients send none either
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"  # between extra chunks, for a vocabulary without <|file_sep|>
FIM_BATCH = 2048
"""llama-server's default batch, which sizes its infill window: the prefix keeps its last 3/4 of it
in tokens, the suffix and the cursor line's start the first 1/4; the extra chunks fill what the
context has left. Kept here so an editor's completions see the same text they did there."""

MAX_EXTRA_CHUNKS = 256  # llama.vscode and llama.vim send 16 by default (ring_n_chunks)
MAX_TOKEN_IDS = 1 << 18  # /detokenize: longer than any context this server loads
MAX_RESPONSE_FIELDS = 64


class LlamaCppStopType(StrEnum):
    """Why an answer ended, as llama-server's `stop_type` says it."""

    EOS = "eos"  # the model's end token
    WORD = "word"  # one of `stop`'s strings: `stopping_word` names it
    LIMIT = "limit"  # n_predict, or n_indent / t_max_predict_ms cut it
    NONE = "none"  # none of those (llama-server's value while an answer runs)


# Fields with the value that means "off" in llama-server; another value changes the answer in a way
# this engine cannot, so it is a 400 naming the field.
UNSERVED = {"mirostat": 0, "typical_p": 1.0, "dynatemp_range": 0.0, "xtc_probability": 0.0, "dry_multiplier": 0.0,
            "top_n_sigma": -1.0, "ignore_eos": False, "n_probs": 0, "return_tokens": False}
UNSERVED_WHEN_GIVEN = ("logit_bias", "lora")  # empty means off


class ExtraChunk(_Request):
    """One chunk of `input_extra`: text from another place in the project, with its file's name."""

    filename: str = Field("tmp", max_length=1024)  # llama-server's default
    text: str = ""


class NativeGeneration(_Body):
    """What llama-server's generating routes share: the model (optional: the profile's target),
    length, sampling, stream, and the editor plugins' own cut-offs."""

    model: str | None = Field(None, max_length=512, description="default: the server's model")
    n_predict: int | None = Field(None, description="tokens to generate; -1: until the model stops; 0: the prompt "
                                                    "only (an editor warming the cache)")
    stream: bool = False
    temperature: float | None = Field(None, le=5.0, description="default 0.8 (llama-server's); <= 0: greedy")
    top_k: int | None = Field(None, description="<= 0: off")
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, gt=0.0, le=10.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    seed: int | None = Field(None, description="-1: a fresh random seed")
    stop: list[str] | None = None
    n_indent: int = Field(0, ge=0, le=1 << 16, description="a line after the first indented less ends the answer")
    t_max_predict_ms: int = Field(0, ge=0, description="past this time generating, the next newline ends the answer")
    n_cmpl: int = Field(1, description="completions of the prompt; more than one: an array of answers")
    response_fields: list[str] | None = Field(None, max_length=MAX_RESPONSE_FIELDS,
                                              description="the answer's fields to send ('timings/prompt_n' unnests)")
    keep_alive: KeepAliveField = None
    # llama-server's, with no effect here (see the module's docstring): declared so that their types are checked
    # and the unserved values named.
    mirostat: int | None = None
    typical_p: float | None = None
    dynatemp_range: float | None = None
    xtc_probability: float | None = None
    dry_multiplier: float | None = None
    top_n_sigma: float | None = None
    ignore_eos: bool | None = None
    n_probs: int | None = None
    return_tokens: bool | None = None
    grammar: str | None = Field(None, description="GBNF the answer must match; empty: none")
    json_schema: dict[str, Any] | None = Field(None, description="a JSON schema the answer must match; {}: any JSON")
    logit_bias: list[Any] | dict[str, Any] | None = None
    lora: list[Any] | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stops(cls, v: Any) -> Any:
        return check_stops([v] if isinstance(v, str) else v)

    @field_validator("response_fields")
    @classmethod
    def _short_fields(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and any(len(f) > 200 for f in v):
            raise ValueError("a response field's path is at most 200 characters")
        return v

    def check_served(self, *, parallel: int) -> None:
        for name, off in UNSERVED.items():
            value = getattr(self, name)
            if value is not None and value != off:
                raise APIError(400, f"{name}={value} is not served by this engine; leave it out (or {off}).",
                               "unsupported_value", name)
        for name in UNSERVED_WHEN_GIVEN:
            if getattr(self, name):
                raise APIError(400, f"{name} is not served by this server's llama.cpp API; leave it out.",
                               "unsupported_value", name)
        if not 1 <= self.n_cmpl <= parallel:  # llama-server's words, which llama.vscode reads to explain its setting
            raise APIError(400, f"Field 'n_cmpl': Value must be between 1 <= value <= {parallel}, but got "
                           f"{self.n_cmpl} (this server decodes {parallel} requests at once: --parallel).",
                           "invalid_value", "n_cmpl")
        if self.n_cmpl > 1 and self.stream:
            raise APIError(400, "n_cmpl above 1 is answered whole here: send stream false, or n_cmpl 1.",
                           "unsupported_value", "n_cmpl")
        if self.n_predict is not None and self.n_predict < -2:
            raise APIError(400, f"n_predict={self.n_predict}: send a count, or -1 to let the model stop by itself.",
                           "invalid_value", "n_predict")

    def constraint(self) -> SchemaGrammar | None:
        """The grammar the answer must match: `grammar` as sent (within the grammar bounds), or
        `json_schema`'s through the endpoint's converter; None when neither is sent. Converting costs
        CPU: called where the plan is built, off the event loop."""
        if self.grammar and self.json_schema is not None:  # llama-server refuses the pair too
            raise APIError(400, 'Either "json_schema" or "grammar" can be specified, but not both; send one.',
                           "invalid_value", "grammar")
        if self.json_schema is not None:
            return schema_grammar(self.json_schema, "json_schema")
        if not self.grammar:
            return None
        try:
            check_gbnf(self.grammar)  # the engine checks again; here the 400 comes before the request is queued
        except GrammarTooLarge as exc:
            raise APIError(400, str(exc), "grammar_too_large", "grammar") from exc
        except GrammarUnparsable as exc:
            raise APIError(400, f"grammar: {exc}", "invalid_grammar", "grammar") from exc
        return SchemaGrammar(self.grammar)

    def max_tokens(self, cap: int) -> int:
        """The endpoint's max_tokens: n_predict within the server's cap (as llama-server bounds it by the
        context rather than refusing it); 0 generates one token, which the answer leaves out."""
        if self.n_predict is None or self.n_predict < 0:
            return cap
        return max(1, min(self.n_predict, cap))

    @property
    def prompt_only(self) -> bool:
        return self.n_predict == 0

    def common(self, cap: int) -> dict[str, Any]:
        """The endpoint request's fields these set: model, sampling, length, stops, keep-alive."""
        sampling = dict(temperature=None if self.temperature is None else max(0.0, self.temperature),
                        top_k=None if self.top_k is None else max(0, self.top_k),
                        top_p=self.top_p or None,  # 0 keeps only the top token in llama.cpp; our floor is above 0
                        min_p=self.min_p, repeat_penalty=self.repeat_penalty,
                        presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                        seed=self.seed if self.seed is not None and self.seed >= 0 else None)
        if self.top_p == 0:
            sampling["top_k"] = 1
        return dict(model=self.model, max_tokens=self.max_tokens(cap), stop=self.stop, stream=self.stream,
                    keep_alive=self.keep_alive,
                    localspec=LocalspecOptions(default_temperature=LLAMACPP_DEFAULT_TEMPERATURE),
                    **{k: v for k, v in sampling.items() if v is not None})


class NativeCompletionRequest(NativeGeneration):
    """POST /completion: a raw prompt, continued."""

    prompt: str | list[Any] = Field(..., description="the prompt text (token ids are not served)")

    def text(self) -> str:
        if isinstance(self.prompt, str):
            return self.prompt
        if len(self.prompt) == 1 and isinstance(self.prompt[0], str):
            return self.prompt[0]
        raise APIError(400, "prompt: send one prompt as text; token-id prompts and several prompts at once are not "
                       "served here.", "unsupported_value", "prompt")


class InfillRequest(NativeGeneration):
    """POST /infill: the code before the cursor (`input_prefix`, then `prompt`, the cursor line's
    start) and after it (`input_suffix`), with chunks of the project as context (`input_extra`)."""

    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[ExtraChunk] = Field(default_factory=list, max_length=MAX_EXTRA_CHUNKS)
    prompt: str = ""


class TokenizeRequest(_Body):
    model: str | None = Field(None, max_length=512)
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    model: str | None = Field(None, max_length=512)
    tokens: list[int] = Field(default_factory=list, max_length=MAX_TOKEN_IDS)


def completion_request(body: NativeCompletionRequest, *, model: str, cap: int) -> CompletionRequest:
    return CompletionRequest(prompt=body.text(), **{**body.common(cap), "model": model})


def native_plan(body: NativeGeneration, endpoint_body: CompletionRequest, *, cap: int, fim_ok: bool,
                names: FieldNames) -> Plan:
    """The endpoint's completion plan, with the request's grammar (`constraint`) in it."""
    plan = completion_plan(endpoint_body, cap, fim_ok, names)
    if (grammar := body.constraint()) is not None:
        plan.request = plan.request.model_copy(update={"grammar": grammar.gbnf})
        plan.grammar_enforced, plan.grammar_unenforced = True, grammar.unenforced
        plan.grammar_field = "json_schema" if body.json_schema is not None else "grammar"
    return plan


class ApplyTemplateRequest(_Body):
    """POST /apply-template: a chat as /v1/chat/completions takes it, to render and not answer."""

    model: str | None = Field(None, max_length=512, description="default: the server's model")
    messages: list[ChatMessageIn] = Field(..., min_length=1)
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # checked as the chat request's

    def chat(self, *, model: str) -> ChatCompletionRequest:
        return ChatCompletionRequest(model=model, messages=self.messages, tools=self.tools,
                                     chat_template_kwargs=self.chat_template_kwargs)


# ---------------------------------------------------------------- the infill prompt


@dataclass(frozen=True)
class Tokenizer:
    """The target's text functions the infill layout needs (no special tokens parsed in the user's text)."""

    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]


@dataclass(frozen=True)
class InfillPrompt:
    pieces: tuple[PromptPiece, ...]  # the markers as tokens; code, file names and the like as text
    truncated: bool  # some of the prefix, suffix or extra context was left out to fit the context

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.pieces)


def _last(tok: Tokenizer, text: str, n: int) -> tuple[str, bool]:
    ids = tok.encode(text)
    if len(ids) <= n:
        return text, False
    return tok.decode(ids[len(ids) - n:]).lstrip("\ufffd") if n > 0 else "", True


def _first(tok: Tokenizer, text: str, n: int) -> tuple[str, bool]:
    ids = tok.encode(text)
    if len(ids) <= n:
        return text, False
    return tok.decode(ids[:n]).rstrip("\ufffd") if n > 0 else "", True


def infill_prompt(body: InfillRequest, tok: Tokenizer, *, n_ctx: int, n_predict: int, repo_level: bool) -> InfillPrompt:
    """The fill-in-the-middle prompt llama-server builds for `/infill`:

        <|repo_name|>myproject\\n<|file_sep|>{filename}\\n{text}...<|file_sep|>filename\\n
        <|fim_prefix|>{input_prefix}{prompt}<|fim_suffix|>{input_suffix}<|fim_middle|>

    (without `repo_level`, the chunks' texts each after a snippet separator, and no names). The prefix keeps
    its end and the suffix its start within the FIM_BATCH window; the extra chunks, newest last, fill what
    the context has left after the answer's room, the oldest dropped first."""
    room = max(0, n_ctx - n_predict - 8)  # 8: the markers
    window = min(FIM_BATCH, room)
    n_prompt = len(tok.encode(body.prompt))
    prefix, cut_prefix = _last(tok, body.input_prefix, 3 * window // 4)
    suffix, cut_suffix = _first(tok, body.input_suffix, max(0, window // 4 - 2 - n_prompt))
    fim = fim_pieces(prefix=prefix + body.prompt, suffix=suffix)
    head = [_marker(FIM_REPO), PromptPiece(text=f"{REPO_NAME}\n")] if repo_level else []
    tail = [_marker(FIM_FILE_SEP), PromptPiece(text=f"{CURRENT_FILE}\n")] if repo_level else []
    left = room - _count(tok, fim) - _count(tok, head + tail) - 2
    chunks: list[list[PromptPiece]] = []
    for chunk in reversed(body.input_extra):  # newest last: kept first
        pieces = ([_marker(FIM_FILE_SEP), PromptPiece(text=f"{chunk.filename}\n{chunk.text}")] if repo_level
                  else [PromptPiece(text=SNIPPET_SEPARATOR + chunk.text)])
        need = _count(tok, pieces) + (2 if repo_level else 0)
        if need > left:
            break
        chunks.append(pieces)
        left -= need
    dropped = len(chunks) < len(body.input_extra)
    extra = [piece for pieces in reversed(chunks) for piece in pieces]
    return InfillPrompt((*head, *extra, *tail, *fim), cut_prefix or cut_suffix or dropped)


def _marker(text: str) -> PromptPiece:
    return PromptPiece(text=text, special=True)


def _count(tok: Tokenizer, pieces: list[PromptPiece]) -> int:
    """Tokens of the pieces; a marker is one."""
    return sum(1 if p.special else len(tok.encode(p.text)) for p in pieces)


# ---------------------------------------------------------------- cut-offs the editors ask for


class Cutoff:
    """llama-server's two editor cut-offs, applied to the text as it streams:
    `n_indent`: a line after the first that starts indented less than this ends the answer there
    (its newline and indentation kept, as llama-server keeps them);
    `t_max_predict_ms`: past this long since the first piece, the next piece with a newline is the last."""

    def __init__(self, *, n_indent: int, t_max_predict_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.n_indent, self.t_max_s, self.clock = n_indent, t_max_predict_ms / 1000.0, clock
        self.text = ""
        self.line_start: int | None = None  # where the line being checked starts (after a newline)
        self.t_first: float | None = None
        self.stopped = False

    def feed(self, piece: str) -> str:
        """The part of `piece` the answer keeps; `stopped` says when nothing more is."""
        if self.stopped:
            return ""
        now = self.clock()
        if self.t_first is None:
            self.t_first = now
        start = len(self.text)
        self.text += piece
        if self.n_indent > 0 and (cut := self._short_line()) is not None:
            self.stopped = True
            self.text = self.text[:cut]
            return self.text[start:]
        if self.t_max_s > 0 and "\n" in piece and now - self.t_first > self.t_max_s:
            self.stopped = True
        return piece

    def _short_line(self) -> int | None:
        """Where the first line indented less than n_indent has its first character, if one has."""
        while True:
            if self.line_start is None:
                nl = self.text.find("\n")
                if nl < 0:
                    return None
                self.line_start = nl + 1
            pos = self.line_start
            while pos < len(self.text) and self.text[pos] in " \t":
                pos += 1
            if pos >= len(self.text):
                return None  # the line's first character has not come yet
            if pos - self.line_start < self.n_indent and self.text[pos] != "\n":
                return pos
            nl = self.text.find("\n", self.line_start)
            if nl < 0:
                return None
            self.line_start = nl + 1


# ---------------------------------------------------------------- answers


class LlamaCppTimings(BaseModel):
    """llama-server's `timings` (milliseconds)."""

    cache_n: int
    prompt_n: int
    prompt_ms: float
    prompt_per_token_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_token_ms: float
    predicted_per_second: float

    @classmethod
    def of(cls, done: Done, *, predicted_n: int) -> LlamaCppTimings:
        st = done.stats
        prompt_n = max(0, st.prompt_tokens - st.reused_prefix_tokens)
        return cls(cache_n=st.reused_prefix_tokens, prompt_n=prompt_n, prompt_ms=round(st.prefill_ms, 3),
                   prompt_per_token_ms=_per(st.prefill_ms, prompt_n), prompt_per_second=_rate(prompt_n, st.prefill_ms),
                   predicted_n=predicted_n, predicted_ms=round(st.decode_ms, 3),
                   predicted_per_token_ms=_per(st.decode_ms, predicted_n),
                   predicted_per_second=_rate(predicted_n, st.decode_ms))


def _per(ms: float, n: int) -> float:
    return round(ms / n, 3) if n > 0 else 0.0


def _rate(n: int, ms: float) -> float:
    return round(n / (ms / 1000.0), 3) if n > 0 and ms > 0 else 0.0


@dataclass(frozen=True)
class Finished:
    """One answer as the reply read it: its text (after the cut-offs), and why it ended."""

    text: str
    done: Done
    stop_type: LlamaCppStopType
    truncated: bool = False

    @property
    def stopping_word(self) -> str:
        """The stop string that ended the answer (llama-server's `stopping_word`); "" when none did."""
        return (self.done.stop_sequence or "") if self.stop_type is LlamaCppStopType.WORD else ""


def stop_type(done: Done, *, cut: bool) -> LlamaCppStopType:
    """`cut`: an editor's cut-off (n_indent, t_max_predict_ms) ended it, which llama-server counts as a limit."""
    if cut or done.finish_reason == "length":
        return LlamaCppStopType.LIMIT
    if done.finish_reason == "stop":
        return LlamaCppStopType.EOS if done.stop_sequence is None else LlamaCppStopType.WORD
    return LlamaCppStopType.NONE


def final_answer(fin: Finished, *, model: str, n_ctx: int, settings: dict[str, Any], prompt_only: bool,
                 streamed: bool, index: int = 0) -> dict[str, Any]:
    """llama-server's finished answer; streamed, its text came in the earlier lines."""
    st = fin.done.stats
    predicted = 0 if prompt_only else st.completion_tokens
    return {"index": index, "content": "" if streamed or prompt_only else fin.text, "tokens": [], "id_slot": -1,
            "stop": True, "model": model, "tokens_predicted": predicted, "tokens_evaluated": st.prompt_tokens,
            "generation_settings": {"n_ctx": n_ctx, "model": model, **settings}, "prompt": "",
            "has_new_line": "\n" in fin.text and not prompt_only, "truncated": fin.truncated,
            "stop_type": str(fin.stop_type), "stopping_word": fin.stopping_word,
            "tokens_cached": st.prompt_tokens + predicted,
            "timings": LlamaCppTimings.of(fin.done, predicted_n=predicted).model_dump()}


def partial_answer(text: str, *, index: int = 0) -> dict[str, Any]:
    """One streamed line: a piece of the answer."""
    return {"index": index, "content": text, "tokens": [], "stop": False, "id_slot": -1}


def picked(answer: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    """The answer's `response_fields` only, as llama-server picks them: a path with slashes reads
    nested fields and is the key of its value (`timings/prompt_n`); a missing one is left out."""
    if not fields:
        return answer
    out: dict[str, Any] = {}
    for path in fields:
        value: Any = answer
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out


class TokenPiece(BaseModel):
    id: int
    piece: str | list[int]  # the text, or its bytes when they are not valid UTF-8 alone


def token_piece(token: int, raw: bytes) -> TokenPiece:
    try:
        return TokenPiece(id=token, piece=raw.decode("utf-8"))
    except UnicodeDecodeError:
        return TokenPiece(id=token, piece=list(raw))

