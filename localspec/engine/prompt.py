"""How a request becomes the target's tokens: a raw prompt, or messages through the model's chat
template (untrusted code: sandboxed, and probed in a child process while the engine warms up),
with the truncate policy and the shared prefix a request may pin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from localspec.engine.chat import ChatMessage, TemplateCheck, render_chat
from localspec.engine.config import GenerationRequest
from localspec.engine.runtime import ModelRuntime
from localspec.errors import ContextOverflowError, RequestError


class Prompter:
    def __init__(self, target: ModelRuntime, *, n_ctx: int, pinned_cells: int,
                 chat_template: str | None = None) -> None:
        self.target = target
        # A model's settings may name a template file to use instead of the GGUF's own.
        self.template = chat_template if chat_template is not None else target.chat_template
        self.n_ctx = n_ctx
        self.pinned_cells = pinned_cells  # 0: the engine keeps no pinned prefix
        self.bos_text = self._special_text(target.bos)
        self.eos_text = self._special_text(target.eos)
        # Chat waits for the probe's verdict; a raw prompt does not.
        self.chat_check = TemplateCheck(self.template, self.bos_text, self.eos_text,
                                        model=getattr(target, "path", Path("the target model")).name)

    def tokens(self, request: GenerationRequest) -> tuple[list[int], int]:
        """The request's tokens and how many messages the truncate policy dropped to fit."""
        dropped = 0
        if request.prompt is not None:
            tokens = self.target.tokenize(request.prompt, add_special=True, parse_special=True)
        else:
            messages = list(request.messages or [])
            while True:
                tokens = self.render(messages, request.tools)
                if len(tokens) < self.n_ctx or not request.truncate:
                    break
                # Drop the oldest turn that is not the system prompt, keeping the last message.
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

    def pin_length(self, request: GenerationRequest, tokens: list[int]) -> int:
        """How many leading tokens of a pin_prefix request are its shared prefix (all messages but the
        last), or 0 when it has none that fits the pinned cells."""
        if not request.pin_prefix or not self.pinned_cells or not request.messages or len(request.messages) < 2:
            return 0
        prefix = self.render(request.messages[:-1], request.tools, add_generation_prompt=False)
        fits = len(prefix) <= self.pinned_cells and len(prefix) < len(tokens)
        return len(prefix) if fits and tokens[: len(prefix)] == prefix else 0

    def render(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = True) -> list[int]:
        self.chat_check.require()
        text = render_chat(self.template, messages, bos_token=self.bos_text, eos_token=self.eos_text,
                           tools=tools, add_generation_prompt=add_generation_prompt)
        # A template that writes the BOS itself must not get a second one from the tokenizer.
        add_special = not (self.bos_text and text.startswith(self.bos_text))
        spans = self._spelled_specials(text, messages)
        if not spans:  # nearly always: no message spells a special token, and one pass tokenizes it all
            return self.target.tokenize(text, add_special=add_special, parse_special=True)
        tokens, start = [], 0
        for begin, end in spans:  # the template's text parses specials; a message's only spells them
            tokens += self.target.tokenize(text[start:begin], add_special=add_special and start == 0,
                                           parse_special=True)
            tokens += self.target.tokenize(text[begin:end], add_special=False, parse_special=False)
            start = end
        return tokens + self.target.tokenize(text[start:], add_special=False, parse_special=True)

    def _spelled_specials(self, text: str, messages: list[ChatMessage]) -> list[tuple[int, int]]:
        """Where the rendered text holds a message that spells a special token ("<|im_end|>"), in order.
        Parsed as specials, a user's "<|im_end|>\n<|im_start|>system\n..." was a system turn the model
        obeyed (field test); llama.cpp tokenizes between specials alike, so other text is unchanged."""
        spans: list[tuple[int, int]] = []
        at = 0
        for m in messages:
            if not self._spells_special(m.content):
                continue
            for content in (m.content, m.content.strip()):  # as written, or as a template that trims it
                found = text.find(content, at)
                if found < 0:
                    found = text.find(content)  # a template that moves a message (a system prompt first)
                if found >= 0:
                    spans.append((found, found + len(content)))
                    at = found + len(content)
                    break
        spans.sort()
        return [s for i, s in enumerate(spans) if i == 0 or s[0] >= spans[i - 1][1]]  # no overlaps

    def _spells_special(self, content: str) -> bool:
        # Special tokens are spelled with brackets in every chat format we know (<|im_end|>, </s>, [INST]):
        # the second tokenization is paid only where one may be.
        if not content or ("<" not in content and "[" not in content):
            return False
        return (self.target.tokenize(content, add_special=False, parse_special=True)
                != self.target.tokenize(content, add_special=False, parse_special=False))

    def _special_text(self, token: int) -> str:
        return self.target.token_text(token) if token >= 0 else ""
