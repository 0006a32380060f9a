"""API request bodies to engine requests: sampling, stops, grammars, tools, fill-in-the-middle.

Everything here is pure (no engine state) except the FIM check, which asks the tokenizer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
import json
import re
import uuid
from typing import Any, Literal
from dataclasses import dataclass

from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

from localspec.engine.chat import ChatMessage
from localspec.engine.config import GenerationRequest, PromptPiece, TemplateValue
from localspec.engine.grammar_limits import GrammarTooLarge, check_gbnf, check_schema
from localspec.engine.json_schema import (SchemaInvalid, bounded_ranges, check_refs, check_shapes, hoisted,
                                          root_ref_inlined, unenforced, with_range_rules)
from localspec.engine.sampling import SamplingParams, with_fallbacks
from localspec.server.errors import APIError
from localspec.engine.thoughts import ThoughtSplit, marker_start, split_reasoning
from localspec.server.schemas import (
    DEFAULT_TEMPERATURE,
    ChatCompletionRequest,
    ChatMessageIn,
    CompletionRequest,
    ContentPart,
    FunctionCall,
    ToolCall,
    ToolChoiceNamed,
    _Sampling,
    loads_bounded,
)

FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE = "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"
FIM_MARKERS = (FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE)
TOOL_CALL = "<tool_call>"  # where a call begins in an answer (Qwen's and Hermes' format)
_TOOL_CALL_RE = re.compile(re.escape(TOOL_CALL) + r"\s*(\{.*?\})\s*</tool_call>", re.DOTALL)
JSON_FENCE = "```json"  # a call a small model writes as a code block instead (see parse_tool_calls)
_JSON_FENCE_RE = re.compile(re.escape(JSON_FENCE) + r"\s*(\{.*?\})\s*```", re.DOTALL)
CALL_STARTS = (TOOL_CALL, JSON_FENCE)  # where a call may begin anywhere in an answer; a bare one starts it


@dataclass(frozen=True)
class FieldNames:
    """What the request's own API calls the fields the plan checks, for its errors to name: a
    Responses or Ollama request becomes a chat request, and its client never sent `max_tokens`."""

    max_tokens: str = "max_tokens"
    schema: str = "response_format.json_schema.schema"  # a JSON schema for the answer
    tool_parameters: str = "tools[{i}].function.parameters"  # {i}: the tool's index
    prompt: str = "messages"  # what the prompt is rendered from (named when it overflows the context)


CHAT_FIELDS = FieldNames()


@dataclass
class Plan:
    """The engine request plus what the response needs to know about how it was built."""

    request: GenerationRequest
    grammar_enforced: bool = False  # a grammar constrains the output (response_format or forced tools)
    grammar_unenforced: tuple[str, ...] = ()  # schema keywords it does not keep (their paths): "partial"
    tool_mode: str | None = None  # None | "auto" | "forced"
    fallback: str | None = None
    cache: bool = True  # False: the semantic cache is bypassed (the request opted out, or several choices)
    cache_bypass: str | None = None  # why, when it was not the request's own opt-out (localspec.cache.reason)
    one_tool_call: bool = False  # parallel_tool_calls=false: the first call only
    prompt_field: str = "messages"  # the request's field its prompt came from (FieldNames.prompt)
    grammar_field: str | None = None  # the field a client's own grammar came in (llama.cpp's), named if it won't parse
    choices: int = 1  # the request's n: one engine job per choice (per_choice)
    # A thinking model's thought is split from the content (engine/thoughts.py): whether the prompt opened it;
    # None: the answer is left whole (reasoning_format "none", a raw prompt, a prefill, a grammar).
    thinking: bool | None = None

    @property
    def grammar_kept(self) -> Literal["enforced", "partial", "none"]:
        """What the reply says of the schema: kept whole, kept but for `grammar_unenforced`, or none given."""
        if not self.grammar_enforced:
            return "none"
        return "partial" if self.grammar_unenforced else "enforced"

    def per_choice(self) -> list[Plan]:
        """One plan per choice. With a seed, choice i samples with seed + i: each choice reproducible,
        and no two alike (n jobs of one seed would draw the same answer n times). Without one, each
        job draws its own seed in the engine."""
        seed = self.request.sampling.seed
        if seed is None:
            return [self] * self.choices
        return [dataclasses.replace(self, request=self.request.model_copy(
                    update={"sampling": self.request.sampling.model_copy(update={"seed": seed + i})}))
                for i in range(self.choices)]

    def answer(self, text: str) -> tuple[str | None, str | None, list[ToolCall]]:
        """A whole answer's thought (None: it has none, or it is not split), its content, and its tool
        calls: read in the content only, so a thought that mentions <tool_call> makes no call."""
        thought, content = (None, text) if self.thinking is None else split_reasoning(text, opened=self.thinking)
        rest, calls = self.tool_calls(content)
        return thought, rest, calls

    def thought_split(self) -> ThoughtSplit | None:
        """What of a streamed answer is thought and what content (a new splitter for each stream; None:
        not split). It goes before the content's text_gate."""
        return None if self.thinking is None else ThoughtSplit(opened=self.thinking)

    def tool_calls(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """The content's tool calls (none unless tools were offered), and the text left over."""
        if not self.tool_mode:
            return text, []
        names = {t["function"]["name"] for t in self.request.tools or ()}
        content, calls = parse_tool_calls(text, self.tool_mode == "forced", names=names)
        return content, calls[:1] if self.one_tool_call else calls

    def text_gate(self) -> CallWatch | HoldAll | None:
        """What of a streamed answer's text may be sent as it comes (a new gate for each stream): all
        of it without tools (None); with tools offered, what cannot be part of a call (CallWatch);
        none of a forced call, which is the call's JSON (HoldAll). The rest goes at the end, from the
        whole answer's content."""
        if self.tool_mode == "auto":
            return CallWatch()
        return HoldAll() if self.tool_mode else None


def _sampling(body: _Sampling) -> SamplingParams:
    # Only what the body sends counts as the request's own: the model's settings fill the rest,
    # and OpenAI's temperature 1.0 (or the client's own fallback) applies only when they set none either.
    given = dict(temperature=body.temperature, top_p=body.top_p, frequency_penalty=body.frequency_penalty,
                 presence_penalty=body.presence_penalty, seed=body.seed, top_k=body.top_k, min_p=body.min_p,
                 repeat_penalty=body.repeat_penalty)
    own = body.localspec.default_temperature if body.localspec else None
    return with_fallbacks(SamplingParams(**{k: v for k, v in given.items() if v is not None}),
                          temperature=DEFAULT_TEMPERATURE if own is None else own)


def _choices(body: _Sampling, parallel: int) -> int:
    """n, checked: each choice takes one of the --parallel slots, all decoding together."""
    n = body.n
    if n > 1 and body.prediction is not None:  # as OpenAI's Predicted Outputs: one answer follows the prediction
        raise APIError(400, f"n={n} cannot be combined with a prediction (nor can it on OpenAI); ask for n=1, or "
                       "leave the prediction out.", "unsupported_value", "n")
    if n < 1:
        raise APIError(400, f"n={n} asks for no choices; ask for at least 1 (the default).", "invalid_value", "n")
    if n > parallel:
        raise APIError(400, f"n={n} is more choices than this server decodes at once (--parallel {parallel}); ask "
                       f"for at most {parallel}, or start the server with a larger --parallel.", "invalid_value", "n")
    return n


def _cache(body: _Sampling, n: int) -> dict[str, Any]:
    """The plan's cache fields. Several choices bypass the cache: one cached answer served as every
    choice is not n draws, and n answers to one prompt make no one entry."""
    if not _use_cache(body):
        return dict(cache=False)
    if n > 1:
        return dict(cache=False, cache_bypass=f"n={n}: each choice is generated (one cached answer would be "
                                              "every choice)")
    return dict(cache=True)


def _common(body: _Sampling, max_tokens: int | None, cap: int, names: FieldNames) -> dict[str, Any]:
    if body.logit_bias:  # accepted and ignored before: {"9707": -100} still answered "Hello!"
        raise APIError(400, "logit_bias is not supported by this server; remove it (a stop string or a "
                       "response_format grammar can steer the output instead).", "unsupported_value", "logit_bias")
    if max_tokens is not None and max_tokens > cap:
        raise APIError(400, f"{names.max_tokens}={max_tokens} is above this server's cap of {cap}; ask for at most "
                       f"{cap}, or start the server with a larger --max-tokens-cap.", "invalid_value", names.max_tokens)
    opts = body.localspec
    return dict(
        max_tokens=max_tokens or cap, sampling=_sampling(body), stop=body.stops,
        mode=opts.mode if opts else None, k=opts.k if opts else None, prediction=_prediction(body),
    )


def _prediction(body: _Sampling) -> str | None:
    """The predicted text: the string, or the text parts joined. A prediction longer than the context
    is refused by the engine, which knows the tokenizer."""
    if body.prediction is None:
        return None
    content = body.prediction.content
    if isinstance(content, str):
        text = content
    else:
        text = "".join(_part_text(p, "prediction") for p in content)
    if not text:
        raise APIError(400, "The prediction is empty; send the text you expect, or leave 'prediction' out.",
                       "invalid_value", "prediction")
    return text


def _part_text(part: ContentPart, param: str) -> str:
    """A content part's text. A text part without any was refused as if text parts were not supported."""
    if part.type != "text":
        raise APIError(400, f"{param}: content parts of type '{part.type}' are not supported; send text parts.",
                       "unsupported_value", param)
    if part.text is None:
        raise APIError(400, f"{param}: a text content part has no 'text'; add it, or leave the part out.",
                       "invalid_value", param)
    return part.text


@dataclass(frozen=True)
class SchemaGrammar:
    """A JSON schema's grammar, and where the schema holds keywords the grammar does not keep."""

    gbnf: str
    unenforced: tuple[str, ...] = ()


def schema_grammar(schema: dict[str, Any] | None, field: str = "response_format.json_schema.schema",
                   checked: tuple[str, ...] | None = None) -> SchemaGrammar:
    """The grammar for a JSON schema, after checking it against the grammar bounds and its refs (a 400
    naming the field). `checked`: already checked part by part (the forced tools), with these unenforced."""
    if not schema:
        return SchemaGrammar(JSON_GBNF)
    param = field.split(".")[0].split("[")[0]
    try:
        if checked is None:
            check_schema(schema, field)
            check_shapes(schema, field)
            check_refs(schema, field)
        # Ranged before the root ref is inlined: the bounds replaced where `unenforced` reads them (a
        # root ref to a bounded number, inlined first, was an unbounded number counted as kept).
        ranged, range_rules = bounded_ranges(schema, field)
        gbnf = with_range_rules(str(json_schema_to_gbnf(json.dumps(root_ref_inlined(ranged)))), range_rules)
        if gbnf is not None and range_rules and _too_large(gbnf):
            gbnf = None  # the ranges' own rules (a few KB a number) past the grammar's bounds: named instead
        kept_bounds = gbnf is not None
        if gbnf is None:  # the bounds could not be placed: the converter's grammar, and they are named
            gbnf = str(json_schema_to_gbnf(json.dumps(root_ref_inlined(schema))))
        check_gbnf(gbnf)
    except GrammarTooLarge as exc:
        raise APIError(400, exc.cause, "schema_too_large", param) from exc
    except SchemaInvalid as exc:
        raise APIError(400, str(exc), "invalid_schema", param) from exc
    except Exception as exc:  # the converter raises plain exceptions for unsupported constructs
        raise APIError(400, f"{field}: Unsupported JSON schema: {exc}", "invalid_schema", param) from exc
    named = tuple(unenforced(schema, field, bounds_kept=kept_bounds)) if checked is None else checked
    if checked is not None and not kept_bounds:
        named += tuple(p for p in unenforced(schema, field, bounds_kept=False) if p not in named)
    return SchemaGrammar(gbnf, named)


def _too_large(gbnf: str) -> bool:
    try:
        check_gbnf(gbnf)
    except GrammarTooLarge:
        return True
    return False


def _text(m: ChatMessageIn) -> str:
    if m.content is None:
        return ""
    if isinstance(m.content, str):
        return m.content
    return "".join(_part_text(p, "messages") for p in m.content)


def _messages(body: ChatCompletionRequest) -> list[ChatMessage]:
    out = []
    for m in body.messages:
        role = {"developer": "system", "function": "tool"}.get(m.role, m.role)
        extra: dict[str, Any] = {}
        if m.tool_calls:
            calls = []
            for c in m.tool_calls:
                try:
                    args = loads_bounded(c.function.arguments or "{}")
                except ValueError:  # not JSON, or nested too deep: the text as it came
                    args = c.function.arguments
                calls.append({"type": "function", "function": {"name": c.function.name, "arguments": args}})
            extra["tool_calls"] = calls
        if m.tool_call_id:
            extra["tool_call_id"] = m.tool_call_id
        if m.name:
            extra["name"] = m.name
        out.append(ChatMessage(role=role, content=_text(m), **extra))
    return out


def _tool_grammar(body: ChatCompletionRequest, names: FieldNames) -> SchemaGrammar:
    tools = body.tools or []
    if isinstance(body.tool_choice, ToolChoiceNamed):
        tools = [t for t in tools if t.function.name == body.tool_choice.function.name]
        if not tools:
            raise APIError(400, f"tool_choice names '{body.tool_choice.function.name}', which is not in tools.",
                           "invalid_value", "tool_choice")
    options, defs, dropped = [], {}, []
    for i, t in enumerate(tools):
        params = t.function.parameters or {"type": "object"}
        field = names.tool_parameters.format(i=i)
        try:
            check_schema(params, field)
            check_shapes(params, field)
            check_refs(params, field)
            bounded_ranges(params, field)  # bounds that leave no value, named here: in the tools together they
            dropped += unenforced(params, field)  # were "tools.$defs.tool0...", a path the client never sent
        except GrammarTooLarge as exc:
            raise APIError(400, exc.cause, "schema_too_large", "tools") from exc
        except SchemaInvalid as exc:
            raise APIError(400, str(exc), "invalid_schema", "tools") from exc
        # Each tool's parameters and definitions stand in the root's $defs, their refs re-rooted there:
        # under `arguments`, a pydantic model's "#/$defs/Addr" pointed at the combined schema's root (a 400).
        defs.update(hoisted(root_ref_inlined(params), f"tool{i}"))
        options.append({"type": "object", "properties": {"name": {"const": t.function.name},
                                                         "arguments": {"$ref": f"#/$defs/tool{i}"}},
                        "required": ["name", "arguments"]})
    combined = {**(options[0] if len(options) == 1 else {"oneOf": options}), "$defs": defs}
    try:
        check_schema(combined, "tools")  # the tools together: total size
    except GrammarTooLarge as exc:
        raise APIError(400, exc.cause, "schema_too_large", "tools") from exc
    return schema_grammar(combined, "tools", checked=tuple(dropped))


def chat_plan(body: ChatCompletionRequest, cap: int, names: FieldNames = CHAT_FIELDS, *, parallel: int = 1) -> Plan:
    """`names`: what the request's own API calls the fields its errors name (FieldNames). `parallel`:
    the server's --parallel, the most choices (n) a request may ask for (the Responses and Ollama
    faces build their chat request with n=1)."""
    n = _choices(body, parallel)
    if body.max_completion_tokens and names is CHAT_FIELDS:  # OpenAI's newer name, when the client sent it
        names = dataclasses.replace(names, max_tokens="max_completion_tokens")
    common = _common(body, body.max_completion_tokens or body.max_tokens, cap, names)
    schema: SchemaGrammar | None = None
    tool_mode = None
    tools = None
    forced = body.tool_choice == "required" or isinstance(body.tool_choice, ToolChoiceNamed)
    if forced and not body.tools:  # was answered in plain text, as if no call had been asked for
        raise APIError(400, "tool_choice asks for a tool call but the request has no tools; send tools, or "
                       "leave tool_choice out.", "invalid_value", "tool_choice")
    if body.top_logprobs and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true; set it, or leave top_logprobs out.",
                       "invalid_value", "top_logprobs")
    if body.tools and body.tool_choice != "none":
        tools = [t.model_dump(exclude_none=True) for t in body.tools]
        if forced:
            schema, tool_mode = _tool_grammar(body, names), "forced"
        else:
            tool_mode = "auto"  # free text; <tool_call> blocks in the answer become tool_calls
    # A forced call's grammar wins: response_format shapes text, and the call writes none (OpenAI takes
    # both; instructor's RESPONSES_TOOLS mode sends its schema as the format and as the forced tool).
    if body.response_format and body.response_format.type != "text" and schema is None:
        if body.response_format.type == "json_object":
            schema = SchemaGrammar(JSON_GBNF)
        else:
            js = body.response_format.json_schema
            if js is None:
                raise APIError(400, "response_format json_schema needs a 'json_schema' object.",
                               "invalid_value", "response_format")
            schema = schema_grammar(js.schema_, names.schema)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    request = GenerationRequest(
        messages=_messages(body), grammar=schema.gbnf if schema else None, logprobs=logprobs, tools=tools,
        template_vars=template_vars(body), **common
    )
    unkept = schema.unenforced if schema else ()
    return Plan(request, grammar_enforced=schema is not None, grammar_unenforced=unkept, tool_mode=tool_mode,
                fallback=_fallback(request, unkept), one_tool_call=body.parallel_tool_calls is False,
                prompt_field=names.prompt, choices=n, **_cache(body, n))


def template_vars(body: ChatCompletionRequest) -> dict[str, TemplateValue] | None:
    """The chat template's variables a request sets: `reasoning_effort` as thinking models' templates read
    it (`none`: enable_thinking false, as Qwen3's; else true, and the effort for gpt-oss's), under its
    own `chat_template_kwargs`."""
    effort: dict[str, TemplateValue] = {}
    if body.reasoning_effort == "none":
        effort = {"enable_thinking": False}
    elif body.reasoning_effort is not None:
        effort = {"enable_thinking": True, "reasoning_effort": body.reasoning_effort}
    return {**effort, **(body.chat_template_kwargs or {})} or None


def completion_plan(body: CompletionRequest, cap: int, fim_ok: bool, names: FieldNames = CHAT_FIELDS, *,
                    parallel: int = 1) -> Plan:
    """`parallel`: as chat_plan's (llama.cpp's n_cmpl is its own field, checked by its route)."""
    n = _choices(body, parallel)
    common = _common(body, body.max_tokens, cap, names)
    if body.best_of not in (None, 1):
        raise APIError(400, f"best_of={body.best_of} is not supported (this server does not rank candidates by "
                       "log probability); leave it out, or ask for n choices instead.", "unsupported_value", "best_of")
    prompt, pieces = body.prompt, None
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise APIError(400, "Send exactly one prompt; batched prompts are not supported.",
                           "unsupported_value", "prompt")
        prompt = prompt[0]
    if body.suffix is not None:
        if not fim_ok:
            raise APIError(400, "This model has no fill-in-the-middle tokens; 'suffix' is not supported.",
                           "unsupported_value", "suffix")
        pieces = fim_pieces(prefix=prompt, suffix=body.suffix)
        prompt = "".join(p.text for p in pieces)
    if not prompt:
        raise APIError(400, "The prompt is empty.", "invalid_value", "prompt")
    request = GenerationRequest(prompt=prompt, prompt_pieces=pieces, logprobs=body.logprobs, **common)
    return Plan(request, prompt_field="prompt", choices=n, **_cache(body, n))


def fim_pieces(*, prefix: str, suffix: str) -> list[PromptPiece]:
    """A fill-in-the-middle prompt: the markers as tokens, the client's code around them as text."""
    return [PromptPiece(text=FIM_PREFIX, special=True), PromptPiece(text=prefix),
            PromptPiece(text=FIM_SUFFIX, special=True), PromptPiece(text=suffix),
            PromptPiece(text=FIM_MIDDLE, special=True)]


def _use_cache(body: _Sampling) -> bool:
    return not (body.localspec and body.localspec.cache is False)


def _fallback(request: GenerationRequest, unenforced: tuple[str, ...] = ()) -> str | None:
    notes = []
    if unenforced:
        notes.append(f"the grammar does not enforce {', '.join(unenforced[:8])}"
                     f"{f' and {len(unenforced) - 8} more' if len(unenforced) > 8 else ''}: check those values")
    if request.grammar and not request.sampling.greedy:
        notes.append("grammar with temperature > 0 decodes without speculation (greedy grammar requests speculate)")
    return "; ".join(notes) or None


class HoldAll:
    """A gate that sends nothing before the end: the text is parsed whole (a forced call's JSON)."""

    def feed(self, text: str) -> str:
        return ""


class CallWatch:
    """The text of an answer that may hold tool calls (tool mode "auto"), sent as it becomes certain
    to be the start of the content that `parse_tool_calls` will leave: `feed` takes the answer's next
    text and returns what may be sent now.

    Held back: a suffix that may be the start of a call (CALL_STARTS, as StopMatcher holds a stop
    string's), everything from a call's start on (parsed at the end), and trailing whitespace (a call
    after it makes it the content's end, which is stripped). An answer that starts with whitespace is
    held whole: that whitespace is content unless a call follows, which strips it, so nothing of it is
    certain before the end; so is one that starts with "{", which may be a bare call."""

    def __init__(self) -> None:
        self._held = ""  # the answer's text after what was sent
        self._started = False  # the answer's first character was seen, and it was neither whitespace nor "{"
        self._closed = False  # a call began, or the answer starts with whitespace: nothing more before the end

    def feed(self, text: str) -> str:
        if self._closed or not text:
            return ""
        held = self._held + text
        if not self._started:
            self._started = not (held[0].isspace() or held[0] == "{")
            self._closed = not self._started
            if self._closed:
                return ""
        found = [at for start in CALL_STARTS if (at := held.find(start)) >= 0]
        if found:
            at = min(found)
            self._closed = True
        else:
            at = len(held) - max(marker_start(held, start) for start in CALL_STARTS)
        cut = len(held[:at].rstrip())
        self._held = held[cut:]
        return held[:cut]


def parse_tool_calls(text: str, forced: bool, *, names: Collection[str] = ()) -> tuple[str | None, list[ToolCall]]:
    """Tool calls in the answer, and the text left over (None when only calls remain).

    A call is a `<tool_call>{"name": ..., "arguments": ...}</tool_call>` block, the format the chat template
    teaches. Where the answer has none, and `names` (the offered tools) are given, two forms a small model
    writes instead count when they name an offered tool: a ```json code block, and the whole answer as
    one JSON object (Qwen2.5-Coder 1.5B wrote both, at temperature 1, for Claude Code-style tools; with
    "function" for "name" too). llama-server's Hermes parser takes such forms as well."""
    if forced:
        call = _call(text)
        return (None, [call]) if call else (text, [])
    calls = [c for blob in _TOOL_CALL_RE.findall(text) if (c := _call(blob))]
    if calls:
        rest = _TOOL_CALL_RE.sub("", text)
    elif names:
        fenced = [(m, c) for m in _JSON_FENCE_RE.finditer(text) if (c := _call(m.group(1), names))]
        calls = [c for _, c in fenced]
        rest = "".join(text[a:b] for a, b in zip([0, *(m.end() for m, _ in fenced)],
                                                 [*(m.start() for m, _ in fenced), len(text)], strict=True))
        if not calls and text.lstrip().startswith("{") and (bare := _call(text.strip(), names)):
            calls, rest = [bare], ""
    if not calls:
        return text, []
    return (rest.strip() or None), calls


def _call_json(blob: str) -> Any:
    """A call's JSON, or None where it is not JSON (or nested too deep to be a call). Qwen2.5's chat
    template shows the call as `{{"name": <function-name>, ...}}` (a Jinja string, so the braces stay
    doubled) and the model copies them: `{{...}}` is read as the object inside."""
    inner = blob.strip()
    doubled = inner.startswith("{{") and inner.endswith("}}")
    for text in (blob, inner[1:-1]) if doubled else (blob,):
        try:
            return loads_bounded(text)
        except ValueError:
            continue
    return None


def _call(blob: str, names: Collection[str] | None = None) -> ToolCall | None:
    """One call's JSON as a ToolCall: `name` (or `function`, a name or OpenAI's {"name", "arguments"}) and
    `arguments` (or `parameters`); with `names`, only a call of one of them."""
    obj = _call_json(blob)
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict) and "name" not in obj:
        obj = obj["function"]
    name = obj.get("name", obj.get("function"))
    if not isinstance(name, str) or (names is not None and name not in names):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return ToolCall(id=f"call_{uuid.uuid4().hex[:24]}",
                    function=FunctionCall(name=name, arguments=args if isinstance(args, str) else json.dumps(args)))
