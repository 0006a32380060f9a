"""Render chat messages with the GGUF's own template, in a sandbox.

A GGUF's chat template is code from whoever made the file. Jinja's immutable sandbox refuses
attribute access to Python internals (`__class__`, `__globals__`, ...) and mutation, so a hostile
template fails with an error instead of running.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from jinja2 import TemplateError
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from pydantic import BaseModel, ConfigDict

from localspec.errors import RequestError

# Used when a GGUF carries no template: ChatML, which Qwen and many others speak.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""


def _raise(message: str) -> None:
    raise TemplateError(message)


class _StrictSandbox(ImmutableSandboxedEnvironment):
    """Refuse unsafe attribute access at once; the stock sandbox renders `{{ f.__globals__ }}` as ''."""

    def unsafe_undefined(self, obj, attribute):
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")


def _env() -> ImmutableSandboxedEnvironment:
    env = _StrictSandbox(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def render_chat(
    template: str | None,
    messages: list[ChatMessage],
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    tools: list[dict] | None = None,
) -> str:
    env = _env()
    try:
        tpl = env.from_string(template or CHATML)
        kwargs = dict(
            messages=[m.model_dump(exclude_none=True) for m in messages],
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
        )
        if tools:
            kwargs["tools"] = tools
        return tpl.render(**kwargs)
    except SecurityError as exc:
        raise RequestError(
            f"The model's chat template tried something unsafe and was refused: {exc}.",
            "Use a GGUF with a trustworthy chat template, or pass a raw prompt instead of messages.",
        ) from exc
    except TemplateError as exc:
        raise RequestError(f"The chat template failed: {exc}.", "Check the messages' roles and order.") from exc
