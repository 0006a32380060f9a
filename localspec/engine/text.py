"""Turning token bytes into text that is safe to stream.

A token may end in the middle of a multi-byte UTF-8 character (emoji, CJK), and a stop string may
span several tokens. Both are solved by holding text back until it is certain.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class Utf8Stream:
    """Bytes in, complete characters out; incomplete sequences wait for the next token."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class StopMatcher:
    """Finds stop strings across chunk boundaries.

    Text that could still be the start of a stop string is held back; `feed` returns only text
    that is certainly part of the answer, and whether a stop string was hit.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""
        self.matched: str | None = None  # the stop string that ended the answer (Anthropic's stop_sequence)

    def feed(self, text: str) -> tuple[str, bool]:
        buf = self._held + text
        if not self.stops:
            self._held = ""
            return buf, False
        found = [(at, -len(s), s) for s in self.stops if (at := buf.find(s)) >= 0]
        if found:
            first, _, self.matched = min(found)  # the earliest; of two starting there, the longer
            self._held = ""
            return buf[:first], True
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), 0, -1):
                if buf.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        self._held = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held
