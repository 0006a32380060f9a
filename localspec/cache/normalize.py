"""The normal form two prompts must share to count as the same request (the exact-match key)."""

from __future__ import annotations

import re
import unicodedata

_SPACE = re.compile(r"\s+")
_TRAILING = re.compile(r"[\s?.!:;]+$")


def normalize_prompt(text: str) -> str:
    """NFKC, case-folded, whitespace collapsed, trailing punctuation dropped.

    Case is folded here; the false-hit guard still compares quoted strings and code
    identifiers case-sensitively before any hit is served.
    """
    t = unicodedata.normalize("NFKC", text)
    t = _SPACE.sub(" ", t).strip()
    t = _TRAILING.sub("", t)
    return t.casefold()
