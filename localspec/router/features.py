"""What the router reads from a request: the whole conversation, not just its last message.

Every feature is a float on a small scale (counts are capped, lengths are logged), so the
heuristic's weights and the learned model's coefficients stay readable.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# Hints a request may carry (a request field, or the TUI's "fast"/"best" toggle).
SMALL_HINTS = frozenset({"fast", "small", "cheap", "quick"})
LARGE_HINTS = frozenset({"best", "large", "quality", "smart"})

_CODE_WORDS = re.compile(
    r"\b(def|class|return|import|function|implement|python|code|script|algorithm|regex|list|dict|string|"
    r"array|parse|recursion|recursive|sort|loop|lambda|json|sql|bug|compile|api|test)\b",
    re.IGNORECASE,
)
_MATH_WORDS = re.compile(
    r"\b(how many|how much|percent|percentage|total|sum|average|each|per|times|twice|half|third|quarter|"
    r"remain|remaining|left|more than|less than|fewer|cost|costs|price|profit|discount|ratio|rate|"
    r"minutes|hours|days|weeks|dollars|cents)\b",
    re.IGNORECASE,
)
# Words that add a condition or a step: multi-step tasks trip small models.
_STEP_WORDS = re.compile(
    r"\b(then|after|before|if|unless|except|without|but|while|also|every|each|only|must|should|"
    r"remaining|rest|again|afterwards|instead|otherwise|ignore|ignoring|case|cases)\b",
    re.IGNORECASE,
)
_NUMBER = re.compile(r"(?<![A-Za-z_])\d+(?:[.,]\d+)?")
_OPERATOR = re.compile(r"[+\-*/=%^]")
_SENTENCE = re.compile(r"[.!?](?:\s|$)")

FEATURE_NAMES: tuple[str, ...] = (
    "log_tokens",  # log(1 + approximate tokens of every message), tokens ~ chars / 4
    "turns",  # user turns in the conversation (1 for a plain prompt)
    "code_markers",  # backticks, code keywords, "function", "implement" ... (capped at 10)
    "math_markers",  # "how many", "percent", units, money ... (capped at 10)
    "numbers",  # numeric literals in the last user message (capped at 10)
    "operators",  # arithmetic operators in the last user message (capped at 10)
    "sentences",  # sentences in the last user message (capped at 10)
    "step_words",  # conditions and sequencing words in the last user message (capped at 10)
    "log_max_tokens",  # log(1 + requested max_tokens), 0 when not given
    "hint_small",  # 1 when the request asks for the fast tier
    "hint_large",  # 1 when it asks for the best tier
)


@dataclass(frozen=True)
class RequestText:
    """The text views the features and the embedding are computed from."""

    full: str  # every message, "role: content", one per line
    last_user: str  # the last user message (the prompt for a plain completion)
    turns: int


def request_text(messages: list[dict] | None, prompt: str | None) -> RequestText:
    if messages:
        lines = [f"{m.get('role', 'user')}: {_content(m)}" for m in messages]
        users = [_content(m) for m in messages if m.get("role") == "user"]
        last = users[-1] if users else _content(messages[-1])
        return RequestText("\n".join(lines), last, max(1, len(users)))
    text = prompt or ""
    return RequestText(text, text, 1)


def _content(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _capped(n: int, cap: int = 10) -> float:
    return float(min(n, cap))


def extract_features(text: RequestText, max_tokens: int | None, hint: str | None) -> dict[str, float]:
    """The named features of one request, in FEATURE_NAMES order."""
    full, last = text.full, text.last_user
    code = full.count("```") * 2 + len(_CODE_WORDS.findall(full)) + full.count("()")
    hint_key = (hint or "").strip().lower()
    return {
        "log_tokens": math.log1p(len(full) / 4.0),
        "turns": float(text.turns),
        "code_markers": _capped(code),
        "math_markers": _capped(len(_MATH_WORDS.findall(full))),
        "numbers": _capped(len(_NUMBER.findall(last))),
        "operators": _capped(len(_OPERATOR.findall(last))),
        "sentences": _capped(max(1, len(_SENTENCE.findall(last.strip() + " ")))),
        "step_words": _capped(len(_STEP_WORDS.findall(last))),
        "log_max_tokens": math.log1p(max_tokens) if max_tokens else 0.0,
        "hint_small": 1.0 if hint_key in SMALL_HINTS else 0.0,
        "hint_large": 1.0 if hint_key in LARGE_HINTS else 0.0,
    }


def feature_vector(features: dict[str, float]) -> list[float]:
    return [float(features[name]) for name in FEATURE_NAMES]
