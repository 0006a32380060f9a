"""How long the models stay loaded after a request: Ollama's `keep_alive`, as a server default and per request.

Forms: a duration ("5m", "30s", "1h", "1h30m", "250ms"), a number of seconds (300, "300"); 0 unloads
once this request is done; a negative value keeps the models loaded for good. The last request's
value holds until the next one, as in Ollama.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_MAX_S = 10 * 365 * 86400.0  # beyond ten years is "forever" anyway; keeps the arithmetic finite

Seconds = float | None  # None: never unload


def parse_keep_alive(value: str | float | int) -> Seconds:
    """Seconds to keep the models after a request (None: forever). Raises ValueError naming the forms."""
    if isinstance(value, bool):
        raise ValueError("keep_alive is a duration, not a boolean")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = value.strip().lower()
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        try:
            seconds = sign * float(body)
        except ValueError:
            parts = _PART.findall(body)
            if not body or "".join(n + u for n, u in parts) != body:
                raise ValueError(f"keep_alive {value!r} is not a duration: use 5m, 30s, 1h, seconds, 0 (unload "
                                 "after this request) or -1 (never unload)") from None
            seconds = sign * sum(float(n) * _UNIT_S[u] for n, u in parts)
    if math.isnan(seconds):
        raise ValueError("keep_alive is not a number")
    return None if seconds < 0 else min(seconds, _MAX_S)


@dataclass
class KeepAlive:
    """When the loaded models expire: `last_used` plus the duration the last request asked for."""

    default: Seconds = 300.0
    clock: Callable[[], float] = time.time
    current: Seconds = field(init=False)
    last_used: float = field(init=False)

    def __post_init__(self) -> None:
        self.current = self.default
        self.last_used = self.clock()

    def ask(self, requested: str | float | int | None) -> None:
        """A request arrived with its keep_alive (None: it set none, the server default applies)."""
        self.current = self.default if requested is None else parse_keep_alive(requested)
        self.touch()

    def touch(self) -> None:
        self.last_used = self.clock()

    def expires_at(self) -> float | None:
        return None if self.current is None else self.last_used + self.current

    def expired(self) -> bool:
        at = self.expires_at()
        return at is not None and self.clock() >= at
