"""Engine settings and the request shape. Pydantic validates both; CLI flags override fields."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, field_validator, model_validator

from localspec.engine.chat import ChatMessage
from localspec.engine.sampling import SamplingParams

Mode = Literal["auto", "off", "draft", "lookup"]
MODES: tuple[str, ...] = ("auto", "off", "draft", "lookup")
# The longest draft any request or setting may ask for. The target context is sized so that one
# sequence can verify MAX_DRAFT_K + 1 rows in one pass (Engine.load); the runtime splits a step
# holding more rows than that, so every accepted k is served.
MAX_DRAFT_K = 64


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n_ctx: int = Field(4096, ge=64, description="context tokens per parallel slot")
    parallel: int = Field(1, ge=1, le=64, description="sequence slots sharing one llama.cpp context")
    n_batch: int = Field(512, ge=16, description="most tokens in one llama_decode")
    prefill_budget: int = Field(256, ge=1, description="prompt tokens per step, so long prompts share the engine")
    pinned_prefix_cells: int = Field(
        1024, ge=0, description="KV cells kept for one shared prompt prefix (GenerationRequest.pin_prefix); 0: none"
    )
    n_threads: int | None = Field(None, ge=1)
    n_gpu_layers: int = -1
    flash_attn: Literal["auto", "on", "off"] = "auto"
    mode: Mode = Field("auto", description="auto picks drafter and k per step from measured costs")
    auto_k_max: int = Field(16, ge=1, le=32, description="longest draft auto considers (copies pay most past 8)")
    auto_explore: float = Field(0.01, ge=0.0, le=0.2,
                                description="most of its time auto spends trying choices it believes do not pay")
    copy_k_max: int = Field(
        48, ge=1, le=MAX_DRAFT_K,
        description="longest lookup draft auto considers: a copy of the prompt or an earlier answer, accepted "
                    "whole, pays more the longer it is (a 2-core CPU verifies 49 rows in 23 single-row passes)",
    )
    draft_k: int = Field(6, ge=0, le=32, description="most tokens the draft model proposes per step")
    draft_p_min: float = Field(0.5, ge=0.0, le=1.0, description="greedy drafting stops below this top-1 probability")
    lookup_k: int = Field(8, ge=0, le=MAX_DRAFT_K)
    prediction_k_max: int = Field(16, ge=1, le=32,
                                  description="most tokens of a request's prediction drafted per step")
    lookup_n_min: int = Field(2, ge=1)
    lookup_n_max: int = Field(16, ge=1, description="longest suffix n-gram matched (longer matches are surer bets)")
    lookup_history_tokens: int = Field(
        32768, ge=0, le=1_048_576,
        description="tokens of finished requests, per API key owner, that lookup may copy from (0 = none)",
    )
    lora_path: str | None = Field(None, description="LoRA adapter GGUF applied to the target (never the draft)")
    lora_scale: float = Field(1.0, allow_inf_nan=False, description="how strongly the adapter's delta is applied")
    repack_weights: bool = Field(True, description="CPU: llama.cpp's repacked weight layout (faster decoding)")
    mmap: bool = Field(
        False, description="memory-map the model file; with repack_weights it keeps ~40% more resident memory"
    )


class PromptPiece(BaseModel):
    """A part of a raw prompt, and whether special-token spellings in it are the tokens (the markers a
    server writes around a client's code) or text (the code itself, which may spell one)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str
    special: bool = False


def _template_value(v: object) -> bool | int | float | str:
    if isinstance(v, bool | int | float) or (isinstance(v, str) and len(v) <= 1000):
        return v
    raise ValueError("a chat template variable is a boolean, a number or a string of at most 1000 characters")


TemplateValue = Annotated[bool | int | float | str,
                          PlainValidator(_template_value, json_schema_input_type=bool | int | float | str)]
"""A chat template variable's value: a flag, a number or a short text (never a structure a template could
walk for long)."""
MAX_TEMPLATE_VARS = 16
TEMPLATE_OWN_VARS = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token",
                               "raise_exception", "strftime_now", "range", "namespace", "cycler", "joiner",
                               "dict"})  # what rendering sets, and the sandbox's helpers
# A letter first: the sandbox's guards are named _localspec_..., and a variable shadows a global of its name.
_TEMPLATE_VAR = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")


def check_template_vars(v: dict[str, TemplateValue] | None) -> dict[str, TemplateValue] | None:
    """Refuse what would not be the request's own variable (a pydantic validator's ValueError)."""
    if v is None:
        return None
    if len(v) > MAX_TEMPLATE_VARS:
        raise ValueError(f"at most {MAX_TEMPLATE_VARS} chat template variables")
    for name in v:
        if not _TEMPLATE_VAR.fullmatch(name):
            raise ValueError(f"{name[:80]!r} is not a template variable name (a letter, then letters, digits "
                             "and _; at most 64)")
        if name in TEMPLATE_OWN_VARS:
            raise ValueError(f"{name!r} is the chat template's own variable: the request sets it")
    return v


class GenerationRequest(BaseModel):
    """A prompt or chat messages, and how to continue it."""

    model_config = ConfigDict(extra="forbid")

    prompt: str | None = None
    prompt_pieces: list[PromptPiece] | None = Field(
        None, description="raw prompt only: the prompt in parts, each tokenized with its own special-token "
        "parsing; their texts joined are `prompt` (which the cache and the router read)",
    )
    messages: list[ChatMessage] | None = None
    max_tokens: int = Field(256, gt=0, le=1_000_000)
    sampling: SamplingParams = SamplingParams()
    stop: list[str] = Field(default_factory=list)
    mode: Mode | None = None  # None: the engine's configured mode
    k: int | None = Field(None, ge=0, le=MAX_DRAFT_K, description="draft length; None: the mode's default")
    truncate: bool = Field(False, description="chat only: drop the oldest turns (never the system prompt) to fit")
    grammar: str | None = Field(None, description="GBNF (root rule 'root') the output must match")
    logprobs: int | None = Field(None, ge=0, le=20,
                                 description="report each token's logprob and this many alternatives")
    tools: list[dict] | None = Field(None, description="chat only: tool definitions handed to the chat template")
    template_vars: dict[str, TemplateValue] | None = Field(
        None, description="chat only: more variables for the chat template, as llama-server's and vLLM's "
        "chat_template_kwargs (enable_thinking: false turns a Qwen3's thought off); the template's own are refused",
    )
    prediction: str | None = Field(
        None, description="the expected answer (Predicted Outputs): its tokens are drafted while the output follows it"
    )
    history_scope: str = Field(
        "local", max_length=200,
        description="whose earlier requests lookup may copy from: the server sets its API key's owner",
    )
    pin_prefix: bool = Field(
        False, description="chat only: the messages before the last are shared by many requests (a judge's "
        "instructions and examples); keep their KV apart so a later request skips their prefill",
    )

    @field_validator("template_vars")
    @classmethod
    def _template_vars(cls, v: dict[str, TemplateValue] | None) -> dict[str, TemplateValue] | None:
        return check_template_vars(v)

    @model_validator(mode="after")
    def _one_input(self) -> GenerationRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' or 'messages'")
        if self.prompt is not None and not self.prompt:
            raise ValueError("the prompt is empty")
        if self.prompt_pieces is not None and "".join(p.text for p in self.prompt_pieces) != self.prompt:
            raise ValueError("'prompt_pieces' must join to 'prompt'")
        if self.messages is not None and not self.messages:
            raise ValueError("'messages' is empty")
        if self.prediction is not None and not self.prediction:
            raise ValueError("the prediction is empty")
        if self.truncate and self.messages is None:
            raise ValueError("'truncate' applies to chat messages only")
        if self.template_vars and self.messages is None:
            raise ValueError("'template_vars' apply to chat messages only")
        return self


def output_rows(config: EngineConfig) -> int:
    """Logits rows the target context serves in one llama_decode: one sequence's longest possible
    verification (MAX_DRAFT_K + 1 rows) or every slot at its configured k, whichever is more.
    llama.cpp reserves n_vocab floats per row (0.6 MB for Qwen) in its compute buffer; a step that
    needs more rows is split by the runtime rather than refused."""
    # Not copy_k_max: a long copy in several slots at once is rare, and 0.6 MB a row is not.
    configured = max(config.draft_k, config.lookup_k, config.auto_k_max, config.prediction_k_max) + 1
    return min(config.n_batch, max(config.parallel * configured, MAX_DRAFT_K + 1))


class RequestDefaults(BaseModel):
    """A model's own request defaults (its registry entry's settings), applied when it is the target:
    a request's explicit values win, then these, then the built-in defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sampling: SamplingParams = SamplingParams()  # only the fields set here (model_fields_set) count
    stop: list[str] = Field(default_factory=list)  # used when a request names no stop string
    template_vars: dict[str, TemplateValue] = Field(default_factory=dict)  # under a chat request's own

    def apply(self, request: GenerationRequest) -> GenerationRequest:
        """The request with these defaults under its own values. Idempotent, so a face may apply it
        before the cache key and the engine again at submit."""
        own = request.sampling.model_fields_set if "sampling" in request.model_fields_set else set()
        mine = self.sampling.model_fields_set - own
        variables = (None if request.messages is None or not self.template_vars
                     else {**self.template_vars, **(request.template_vars or {})})
        if not mine and (request.stop or not self.stop) and variables in (None, request.template_vars):
            return request
        sampling = request.sampling
        if mine:
            values = {**sampling.model_dump(), **self.sampling.model_dump(include=mine)}
            sampling = SamplingParams.model_construct(set(own) | mine, **values)
        stop = request.stop or list(self.stop)
        return request.model_copy(update={"sampling": sampling, "stop": stop,
                                          "template_vars": variables or request.template_vars})
