"""Reading a model's answer: the code it wrote, the number it concluded with.

Shared by the cascade's validity check and the evaluation's task checker.
"""

from __future__ import annotations

import ast
import re

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_ANSWER = re.compile(r"answer\s*(?:is)?\s*[:=]?\s*\**\s*\$?\s*(-?[\d,]*\.?\d+(?:[eE][-+]?\d+)?)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d[\d,]*\.?\d*(?:[eE][-+]?\d+)?|-?\.\d+")
_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_FRAC = re.compile(r"\\d?frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}")
_CODE_LANGS = {"", "python", "py", "python3"}


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block; an unclosed last fence runs to the end."""
    return [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]


def extract_code(text: str) -> str:
    """The Python the answer holds: its fenced python blocks joined, else the whole text."""
    blocks = [body for lang, body in code_blocks(text) if lang in _CODE_LANGS]
    return "\n\n".join(blocks) if blocks else text


def parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def _number(raw: str) -> float | None:
    frac = _FRAC.search(raw)
    if frac:
        try:
            return float(frac.group(1)) / float(frac.group(2))
        except (ValueError, ZeroDivisionError):
            return None
    for num in _NUMBER.findall(raw):
        try:
            return float(num.replace(",", ""))
        except ValueError:
            continue
    return None


def extract_number(text: str) -> float | None:
    """The final numeric answer: the last \\boxed{...}, else after the last "Answer:", else the
    last number in the text."""
    for raw in reversed(_BOXED.findall(text)):
        value = _number(raw)
        if value is not None:
            return value
    candidates = _ANSWER.findall(text) or _NUMBER.findall(text)
    for raw in reversed(candidates):
        try:
            return float(raw.replace(",", ""))
        except ValueError:
            continue
    return None
