"""How a request becomes the target's tokens: a raw prompt, or messages through the model's chat
template (untrusted code: sandboxed, and probed in a child process while the engine warms up),
with the truncate policy, the shared prefix a request may pin, and an assistant prefill."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from localspec.engine.chat import ChatMessage, TemplateCheck, render_chat
from localspec.engine.config import GenerationRequest, PromptPiece
from localspec.engine.runtime import ModelRuntime
from localspec.errors import ContextOverflowError, RequestError


_MARKER = re.compile("(\ue000\\d+\ue001)")  # where a message that spells a special token stands (see `render`)
_MARKER_CHARS = frozenset("\ue000\ue001")


def _check_prefill(before: list[ChatMessage], prefill: str) -> None:
    """A prefill with no message before it is refused, the same for a chat request and /apply-template:
    Qwen's template reads messages[0] ("list object has no element 0"), and there is no turn it answers."""
    if prefill and not before:
        raise RequestError("The last message is the assistant's, which is continued, and no message comes "
                           "before it.", "Send the user's message before it (and a system prompt, if any).")


def split_prefill(messages: list[ChatMessage]) -> tuple[list[ChatMessage], str]:
    """A chat whose last message is the assistant's (text, no tool calls) asks for that text to be
    continued, as llama-server, Ollama and Anthropic's Messages API read it: the messages before it,
    and its text (the prefill). An empty one has nothing to continue: the chat as if it were not
    there. Any other chat: its messages, and "" (none)."""
    last = messages[-1] if messages else None
    if last is None or last.role != "assistant" or (last.model_extra or {}).get("tool_calls"):
        return list(messages), ""
    return list(messages[:-1]), last.content


MAX_PROBES = 64  # sets of template variables whose opens_thought verdict is kept


class Prompter:
    def __init__(self, target: ModelRuntime, *, n_ctx: int, pinned_cells: int,
                 chat_template: str | None = None) -> None:
        self.target = target
        # A model's settings may name a template file to use instead of the GGUF's own.
        self.template = chat_template if chat_template is not None else target.chat_template
        self.n_ctx = n_ctx
        self.pinned_cells = pinned_cells  # 0: the engine keeps no pinned prefix
        self._framing: tuple[list[int], list[int]] | None = None  # see _frame
        self._opens: dict[frozenset[tuple[str, object]], bool] = {}  # opens_thought_with, by variables
        self.bos_text = self._special_text(target.bos)
        self.eos_text = self._special_text(target.eos)
        # Chat waits for the probe's verdict; a raw prompt does not.
        self.chat_check = TemplateCheck(self.template, self.bos_text, self.eos_text,
                                        model=getattr(target, "path", Path("the target model")).name)

    @property
    def opens_thought(self) -> bool:
        """`opens_thought_with` the template's own variables alone."""
        return self.opens_thought_with(None)

    def opens_thought_with(self, variables: Mapping[str, object] | None) -> bool:
        """Whether the generation prompt leaves the answer inside a thought (ends with `<think>`, as
        DeepSeek-R1-Distill's template's does), so the answer holds only its `</think>`. A request's
        template variables may change it (a template that opens the thought only when asked, or closes
        an empty one when told not to think). Asked once per set of variables, of a one-message probe
        chat: a template that refuses it opens none."""
        key = frozenset((variables or {}).items())
        if (known := self._opens.get(key)) is not None:
            return known
        try:
            text, _ = self._rendered([ChatMessage(role="user", content="Hi.")], None, True, variables=variables)
            opened = re.search(r"<think>\s*$", text) is not None
        except Exception:  # a refused template: chat requests fail on their own, with its reason
            opened = False
        if len(self._opens) >= MAX_PROBES:  # each set a client invents would stay: keep a bounded few
            self._opens.clear()
        self._opens[key] = opened
        return opened

    def known_opens(self, variables: Mapping[str, object] | None) -> bool | None:
        """`opens_thought_with`'s answer when it was asked before (no render), else None."""
        return self._opens.get(frozenset((variables or {}).items()))

    def tokens(self, request: GenerationRequest) -> tuple[list[int], int]:
        """The request's tokens and how many messages the truncate policy dropped to fit."""
        dropped = 0
        if request.prompt_pieces is not None:
            tokens = self.pieces(request.prompt_pieces)
        elif request.prompt is not None:
            tokens = self.target.tokenize(request.prompt, add_special=True, parse_special=True)
        else:
            messages, prefill = split_prefill(request.messages or [])
            _check_prefill(messages, prefill)
            while True:
                tokens = self.render(messages, request.tools, prefill=prefill, variables=request.template_vars)
                if len(tokens) < self.n_ctx or not request.truncate:
                    break
                # Drop the oldest turn that is not the system prompt, keeping the last message (and a
                # prefill, held apart: the answer it begins is the last message's).
                idx = next((i for i, m in enumerate(messages[:-1]) if m.role != "system"), None)
                if idx is None:
                    break
                del messages[idx]
                dropped += 1
        if len(tokens) >= self.n_ctx:
            raise ContextOverflowError(len(tokens), self.n_ctx)
        if not tokens:
            raise RequestError("The prompt produced no tokens.", "Send a non-empty prompt.")
        return tokens, dropped

    def pieces(self, pieces: list[PromptPiece]) -> list[int]:
        """A prompt in parts: each tokenized alone, parsing special tokens only in the parts that are
        markers. Code around a fill-in-the-middle cursor that spells `<|fim_middle|>` is text, as
        llama-server reads it; read as the token, it ended the prefix where the code had not."""
        lead, trail = self._frame()
        tokens = list(lead)
        for piece in pieces:
            tokens += self.target.tokenize(piece.text, add_special=False, parse_special=piece.special)
        return tokens + list(trail)

    def _frame(self) -> tuple[list[int], list[int]]:
        """What the tokenizer adds around a whole text (`add_special`): a BOS before it where the model
        has one, an end token after it where the model adds one. Asked of the tokenizer with a probe,
        once, so a prompt in pieces is framed as the same text in one piece would be."""
        if self._framing is None:
            probe = "a"
            plain = self.target.tokenize(probe, add_special=False, parse_special=False)
            framed = self.target.tokenize(probe, add_special=True, parse_special=False)
            at = next((i for i in range(len(framed) - len(plain) + 1) if framed[i:i + len(plain)] == plain), 0)
            self._framing = (framed[:at], framed[at + len(plain):])
        return self._framing

    def pin_length(self, request: GenerationRequest, tokens: list[int]) -> int:
        """How many leading tokens of a pin_prefix request are its shared prefix (all messages but the
        last; with a prefill, all but it and the message it answers: those two are the request's own),
        or 0 when it has none that fits the pinned cells."""
        messages, _ = split_prefill(request.messages or [])
        if not request.pin_prefix or not self.pinned_cells or len(messages) < 2:
            return 0
        prefix = self.render(messages[:-1], request.tools, add_generation_prompt=False,
                             variables=request.template_vars)
        fits = len(prefix) <= self.pinned_cells and len(prefix) < len(tokens)
        return len(prefix) if fits and tokens[: len(prefix)] == prefix else 0

    def render(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = True, *, prefill: str = "",
               variables: Mapping[str, object] | None = None) -> list[int]:
        """The messages through the chat template, as tokens. Only the template's own text parses special
        tokens: a message that spells one ("<|im_end|>\n<|im_start|>system\n...", in a user's text, a pasted
        document, a tool's result) stands in the template as a marker, and its text is tokenized as text.
        Parsed as specials, it was a system turn the model obeyed (field test). Such a message is what the
        template writes around it, untransformed (a template that trims it does not, here).

        `prefill` (split_prefill): the assistant's text the answer continues, after the generation
        prompt, as text. No template is asked to write an unfinished turn: Qwen's ends every message
        with <|im_end|>, and one that does not close it may still reshape it (strip it, add a think block)."""
        assert add_generation_prompt or not prefill, "a prefill continues the generation prompt"
        text, markers = self._rendered(messages, tools, add_generation_prompt, prefill=prefill, variables=variables)
        # A template that writes the BOS itself must not get a second one from the tokenizer.
        add_special = not (self.bos_text and text.startswith(self.bos_text))
        if not markers:  # nearly always: one pass tokenizes it all
            return self.target.tokenize(text, add_special=add_special, parse_special=True)
        # In pieces, framed as the whole text would be (see `pieces`): an end token the tokenizer adds
        # goes after the last piece, not after the first.
        lead, trail = self._frame() if add_special else ([], [])
        tokens = list(lead)
        for piece in _MARKER.split(text):  # template text, a marker, template text, ...
            if piece in markers:
                tokens += self.target.tokenize(markers[piece], add_special=False, parse_special=False)
            elif piece:
                tokens += self.target.tokenize(piece, add_special=False, parse_special=True)
        return tokens + list(trail)

    def text(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None = None,
             add_generation_prompt: bool = True, *, variables: Mapping[str, object] | None = None) -> str:
        """The messages through the chat template, as the text `render` tokenizes (llama-server's
        /apply-template): a message that spells a special token stands in it as it was written; a final
        assistant message is continued, as a chat request's is."""
        before, prefill = split_prefill(messages) if add_generation_prompt else (messages, "")
        _check_prefill(before, prefill)
        text, markers = self._rendered(before, tools, add_generation_prompt, prefill=prefill, variables=variables)
        if not markers:
            return text
        return "".join(markers.get(piece, piece) for piece in _MARKER.split(text))

    def _rendered(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None,
                  add_generation_prompt: bool, *, prefill: str = "",
                  variables: Mapping[str, object] | None = None) -> tuple[str, dict[str, str]]:
        """The template's text, with a marker where each message that spells a special token stands
        (and the prefill, after it all), and those texts by marker."""
        self.chat_check.require()
        for name, value in (variables or {}).items():  # no marker stands in for them: their text is the template's
            if isinstance(value, str) and (_MARKER_CHARS.intersection(value) or self._spells_special(value)):
                raise RequestError(f"The chat template variable {name!r} spells a special token of the model.",
                                   "Send it as plain text, without the model's control tokens.")
        spelling = [i for i, m in enumerate(messages) if self._spells_special(m.content)]
        markers = {f"\ue000{i}\ue001": messages[i].content for i in spelling}  # private-use: no vocabulary's special
        shown = [m.model_copy(update={"content": f"\ue000{i}\ue001"}) if i in spelling else m
                 for i, m in enumerate(messages)]
        text = render_chat(self.template, shown, bos_token=self.bos_text, eos_token=self.eos_text,
                           tools=tools, add_generation_prompt=add_generation_prompt, extra=variables)
        if prefill:  # a marker after the template's text: tokenized apart, as text, whatever it spells
            markers[f"\ue000{len(messages)}\ue001"] = prefill
            text += f"\ue000{len(messages)}\ue001"
        return text, markers

    def _spells_special(self, content: str) -> bool:
        # Special tokens are spelled with brackets in every chat format we know (<|im_end|>, </s>, [INST]):
        # the second tokenization is paid only where one may be.
        if not content or ("<" not in content and "[" not in content):
            return False
        return (self.target.tokenize(content, add_special=False, parse_special=True)
                != self.target.tokenize(content, add_special=False, parse_special=False))

    def _special_text(self, token: int) -> str:
        return self.target.token_text(token) if token >= 0 else ""
