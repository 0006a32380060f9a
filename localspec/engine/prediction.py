"""Predicted Outputs: the client's guess at the answer (the file an edit mostly returns) as the draft.

A `Prediction` holds one request's predicted text, tokenized, and a cursor: the byte offset in that
text the output has reached. While the output's bytes follow the prediction's, the cursor moves with
them, and whenever it sits on one of the prediction's token boundaries the next tokens are the draft.

The cursor is kept in bytes, not tokens, because the output may spell the same text with other
tokens than the prediction's tokenization did (BPE merges depend on what surrounds a word): "foobar"
predicted as one token and written as "foo" + "bar" keeps the cursor aligned, and drafting resumes
at the next boundary both share. After a divergence (the edit itself) the output's recent bytes are
searched for in the prediction, and the cursor continues after the longest match, so an edit that
changes a few lines copies again from the line after them.

The draft is a point mass (q = None): `verify` accepts token d with probability p(d) and on
rejection samples from p with d removed, which keeps the output exactly the target's distribution
at any temperature; greedy requests accept while the target's argmax equals the prediction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from localspec.engine.verify import Draft
from localspec.errors import PredictionTooLongError

# The output's recent bytes searched for after a divergence: long enough to tell two similar lines
# apart, short enough that the search (a few bytes.find over the prediction) stays cheap per step.
TAIL_BYTES = 64
# The shortest match that realigns: shorter ones (an indent, "return ") recur all over a file and
# would draft from the wrong place.
MIN_MATCH_BYTES = 8

Piece = Callable[[int], bytes]


class Tokenizer(Protocol):
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]: ...

    def piece(self, token: int) -> bytes: ...


def prepare(text: str, tokenizer: Tokenizer, *, n_ctx: int) -> Prediction:
    """A request's prediction, tokenized as plain text (special-token spellings stay text). One
    longer than the context is refused: no answer could follow it to its end."""
    tokens = tokenizer.tokenize(text, add_special=False, parse_special=False)
    if len(tokens) > n_ctx:
        raise PredictionTooLongError(len(tokens), n_ctx)
    return Prediction.build(tokens, piece=tokenizer.piece)


@dataclass
class Prediction:
    """One request's prediction and where its output stands in it."""

    tokens: tuple[int, ...]
    text: bytes  # the tokens' pieces joined: the prediction as the target's tokenizer spells it
    boundaries: dict[int, int]  # byte offset -> index of the token that starts there
    piece: Piece
    pos: int | None = 0  # byte offset the output has reached; None: lost after a divergence
    anchor: int = 0  # where the output was last aligned: a realignment prefers matches after it
    seen: int = 0  # output tokens folded in so far
    tail: bytearray = field(default_factory=bytearray)  # the output's last TAIL_BYTES bytes

    @classmethod
    def build(cls, tokens: Sequence[int], *, piece: Piece) -> Prediction:
        offsets: dict[int, int] = {}
        text = bytearray()
        for i, t in enumerate(tokens):
            offsets.setdefault(len(text), i)
            text += piece(t)
        return cls(tokens=tuple(tokens), text=bytes(text), boundaries=offsets, piece=piece)

    @property
    def aligned(self) -> bool:
        return self.pos is not None

    def follow(self, history: Sequence[int], *, start: int = 0) -> None:
        """Fold in the output tokens generated since the last call: history[start:] is the output so
        far (the engine passes prompt + output and the prompt's length, so no step copies the output)."""
        new = history[start + self.seen :]
        self.seen = len(history) - start
        for token in new:
            b = self.piece(token)
            self.tail += b
            if self.pos is not None and self.text.startswith(b, self.pos):
                self.pos += len(b)
                self.anchor = self.pos
            else:
                self.pos = None
        del self.tail[:-TAIL_BYTES]
        if self.pos is None and new:
            self.pos = self._realign()

    def _realign(self) -> int | None:
        """Byte offset after the longest suffix of the output (at least MIN_MATCH_BYTES) found in the
        prediction; the first such match ending at or after the anchor, else the first anywhere."""
        tail = bytes(self.tail)
        if len(tail) < MIN_MATCH_BYTES or tail[-MIN_MATCH_BYTES:] not in self.text:
            return None
        # A suffix that occurs has every shorter suffix occurring too: binary search the longest.
        lo, hi = MIN_MATCH_BYTES, len(tail)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if tail[-mid:] in self.text:
                lo = mid
            else:
                hi = mid - 1
        suffix = tail[-lo:]
        at = self.text.find(suffix, max(self.anchor - lo, 0))
        if at < 0:
            at = self.text.find(suffix)
        self.anchor = at + lo
        return self.anchor

    def propose(self, k: int) -> Draft:
        """Up to k of the prediction's tokens after the cursor; none while the cursor is lost or inside
        one of the prediction's tokens (the output spelled it differently: wait for a shared boundary)."""
        i = self.boundaries.get(self.pos) if self.pos is not None else None
        if k <= 0 or i is None:
            return Draft((), source="prediction")
        return Draft(self.tokens[i : i + k], source="prediction")

    def available(self) -> int:
        """How many tokens a proposal could hold now (auto weighs drafts only this long)."""
        i = self.boundaries.get(self.pos) if self.pos is not None else None
        return 0 if i is None else len(self.tokens) - i
