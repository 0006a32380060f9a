"""Predicted Outputs: the client's guess at the answer (the file an edit mostly returns) as the draft.

A `Prediction` holds one request's predicted text, tokenized, and a cursor: the byte offset in that
text the output has reached. While the output's bytes follow the prediction's, the cursor moves with
them, and whenever it sits on one of the prediction's token boundaries the next tokens are the draft.

The cursor is kept in bytes, not tokens, because the output may spell the same text with other
tokens than the prediction's tokenization did (BPE merges depend on what surrounds a word): "foobar"
predicted as one token and written as "foo" + "bar" keeps the cursor aligned, and drafting resumes
at the next boundary both share. After a divergence (the edit itself) the output's recent bytes are
searched for in the prediction, and the cursor continues after the longest match, so an edit that
changes a few lines copies again from the line after them. A short match counts only near where the
output left the prediction; elsewhere (code moved, or a phrase that recurs) it must be longer.

An edit that moves code in or out of a block (functions made methods of a class, a body wrapped in
`try:`) writes the prediction's lines with more or fewer leading spaces. When the output's current
line is a prediction line's text with another indentation, a `View` of the whole prediction with
every line shifted by that difference is tokenized and joins the search: the cursor follows the
shifted lines across their line ends instead of failing at every next line's indentation.

An edit often repeats itself: functions made methods write `self.path` wherever the prediction has
`path`, a rename changes every call. So each prediction token counts how often the output left the
prediction there and how often it followed it, and `follow_odds` gives `auto` the chance that the
output follows each of the next tokens. A draft that stops before a likely edit loses nothing when
the edit recurs (the verify's correction token is the same, for a shorter pass): on a CPU, where a
failed 15-token draft costs ~9 single steps, auto stops there; on a GPU, where rows are nearly free,
it drafts through.

The draft is a point mass (q = None): `verify` accepts token d with probability p(d) and on
rejection samples from p with d removed, which keeps the output exactly the target's distribution
at any temperature; greedy requests accept while the target's argmax equals the prediction.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import Counter
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
# ... and of them, the fewest that are not whitespace: a line end and the next line's indentation
# ("):\n        ") occur after every statement, and drafted from the first such place after the
# cursor, propose whichever line happens to follow it.
MIN_MATCH_TEXT = 4
# An edit resumes the prediction near where it left it: on the line the output was last aligned on or
# a few lines after (lines it deleted). A match before that line or further on needs FAR_MATCH_BYTES:
# short phrases recur across a file ("to-do items" of a module docstring, "path=PATH" of six
# signatures), and on the bench's large change each such realignment drafted 13-15 tokens and kept
# 0-1. Code that really moved is found a few tokens later, on a longer match.
NEAR_LINES = 4
FAR_MATCH_BYTES = 24
# Shifted views a request may build: a refactor moves code by one or two block levels, and each view
# is one more search per realignment.
MAX_SHIFTED_VIEWS = 4
# Larger predictions keep the view as sent: a view is tokenized inside a decoding step, and each one
# multiplies the realignment's search.
MAX_SHIFTED_BYTES = 64 * 1024

WHITESPACE = b" \t\r\n"

Piece = Callable[[int], bytes]
Tokenize = Callable[[str], list[int]]


class Tokenizer(Protocol):
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]: ...

    def piece(self, token: int) -> bytes: ...


def prepare(text: str, tokenizer: Tokenizer, *, n_ctx: int) -> Prediction:
    """A request's prediction, tokenized as plain text (special-token spellings stay text). One
    longer than the context is refused: no answer could follow it to its end."""

    def tokenize(s: str) -> list[int]:
        return tokenizer.tokenize(s, add_special=False, parse_special=False)

    tokens = tokenize(text)
    if len(tokens) > n_ctx:
        raise PredictionTooLongError(len(tokens), n_ctx)
    return Prediction.build(tokens, piece=tokenizer.piece, tokenize=tokenize, source=text)


@dataclass(frozen=True)
class View:
    """The prediction with every non-blank line's leading spaces shifted by `shift` (0: as sent)."""

    shift: int
    tokens: tuple[int, ...]
    text: bytes  # the tokens' pieces joined: the view as the target's tokenizer spells it
    boundaries: dict[int, int]  # byte offset -> index of the token that starts there
    line_starts: tuple[int, ...]  # byte offset of each line's first byte
    origin: tuple[int, ...]  # each line's index in the prediction as sent (blank lines may be dropped)

    @classmethod
    def of(cls, tokens: Sequence[int], *, piece: Piece, shift: int = 0,
           origin: Sequence[int] | None = None) -> View:
        offsets: dict[int, int] = {}
        text = bytearray()
        for i, t in enumerate(tokens):
            offsets.setdefault(len(text), i)
            text += piece(t)
        starts = [0] + [m.end() for m in re.finditer(b"\n", text)]
        return cls(shift=shift, tokens=tuple(tokens), text=bytes(text), boundaries=offsets,
                   line_starts=tuple(starts), origin=tuple(range(len(starts)) if origin is None else origin))

    def line_of(self, offset: int) -> int:
        return bisect_right(self.line_starts, offset) - 1

    def original_line(self, offset: int) -> int:
        """The line of the prediction as sent that holds `offset` of this view."""
        line = self.line_of(offset)
        return self.origin[line] if line < len(self.origin) else line

    def start_of_original(self, line: int) -> int:
        """Byte offset of this view's first line at or after the prediction's line `line`."""
        i = bisect_left(self.origin, line)
        return self.line_starts[i] if i < len(self.line_starts) else len(self.text)

    def longest_suffix(self, tail: bytes) -> int:
        """Length of the longest suffix of `tail` found in this view, if it has at least MIN_MATCH_BYTES and
        MIN_MATCH_TEXT of them are not whitespace; else 0."""
        if len(tail) < MIN_MATCH_BYTES or tail[-MIN_MATCH_BYTES:] not in self.text:
            return 0
        # A suffix that occurs has every shorter suffix occurring too: binary search the longest.
        lo, hi = MIN_MATCH_BYTES, len(tail)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if tail[-mid:] in self.text:
                lo = mid
            else:
                hi = mid - 1
        return lo if len(tail[-lo:].translate(None, WHITESPACE)) >= MIN_MATCH_TEXT else 0


def shifted(text: str, shift: int) -> tuple[str, list[int]]:
    """`text` with `shift` spaces added to (or, below 0, at most that many removed from) the front
    of every non-blank line, and the index in `text` of each line kept. Indented, two blank lines
    become one: code moved into a block is spaced as a block's (PEP 8's two blank lines are for
    top-level definitions). Lines end at "\n" only, as `View.line_starts` counts them."""
    out, kept = [], []
    blank = 0
    for i, line in enumerate(text.split("\n")):
        if not line.strip():
            blank += 1
            if shift > 0 and blank > 1:
                continue
        else:
            blank = 0
            line = " " * shift + line if shift > 0 else line[min(-shift, len(line) - len(line.lstrip(" "))):]
        out.append(line)
        kept.append(i)
    return "\n".join(out), kept


def indent(line: bytes) -> int:
    return len(line) - len(line.lstrip(b" "))


@dataclass
class Prediction:
    """One request's prediction and where its output stands in it."""

    views: list[View]  # views[0] is the prediction as sent; the others shifted, built as needed
    piece: Piece
    tokenize: Tokenize | None = None  # builds shifted views; None: the prediction as sent only
    source: str | None = None  # the prediction's text as sent (None: its tokens' pieces, decoded)
    view: int = 0  # the view the cursor is in
    pos: int | None = 0  # byte offset the output has reached in that view; None: lost after a divergence
    anchor: int = 0  # where the output was last aligned: a realignment prefers matches after it
    seen: int = 0  # output tokens folded in so far
    streak: int = 0  # output tokens in a row that followed the prediction (a realignment starts again at 0)
    tail: bytearray = field(default_factory=bytearray)  # the output's last TAIL_BYTES bytes
    # Per prediction token: how often the output left the prediction there, and how often it followed it.
    left: Counter[int] = field(default_factory=Counter)
    followed: Counter[int] = field(default_factory=Counter)

    @classmethod
    def build(cls, tokens: Sequence[int], *, piece: Piece, tokenize: Tokenize | None = None,
              source: str | None = None) -> Prediction:
        return cls(views=[View.of(tokens, piece=piece)], piece=piece, tokenize=tokenize, source=source)

    @property
    def tokens(self) -> tuple[int, ...]:
        """The prediction's tokens as sent."""
        return self.views[0].tokens

    @property
    def text(self) -> bytes:
        return self.views[0].text

    @property
    def aligned(self) -> bool:
        return self.pos is not None

    def follow(self, history: Sequence[int], *, start: int = 0) -> None:
        """Fold in the output tokens generated since the last call: history[start:] is the output so
        far (the engine passes prompt + output and the prompt's length, so no step copies the output)."""
        new = history[start + self.seen :]
        self.seen = len(history) - start
        v = self.views[self.view]
        for token in new:
            b = self.piece(token)
            self.tail += b
            at = v.boundaries.get(self.pos) if self.pos is not None else None
            expected = v.tokens[at] if at is not None else None
            if self.pos is not None and v.text.startswith(b, self.pos):
                if expected is not None and b == self.piece(expected):
                    self.followed[expected] += 1
                self.pos += len(b)
                self.anchor = self.pos
                self.streak += 1
            else:
                if expected is not None:
                    self.left[expected] += 1
                self.pos, self.streak = None, 0
        del self.tail[:-TAIL_BYTES]
        if self.pos is None and new:
            self.pos = self._realign()

    def _realign(self) -> int | None:
        """Byte offset after the longest suffix of the output (as `View.longest_suffix` counts them)
        found in any view, the current view winning ties; in it, the first match ending at or after
        the anchor's line, else the first anywhere. Where the output's line is the matched line with
        other indentation, a view shifted by the difference is built and the search runs again. A
        match far from the anchor's line (before it, or more than NEAR_LINES after) realigns only
        when it is FAR_MATCH_BYTES long."""
        tail = bytes(self.tail)
        view, length = self._longest(tail)
        if not length:
            return None
        at = self._locate(view, tail[-length:])
        if length < FAR_MATCH_BYTES and not self._near(view, at + length):
            return None  # before a view is built for it: each is the whole prediction tokenized again
        shift = self._shift_seen(tail, view, at + length)
        if shift is not None and self._add_view(shift):
            view, length = self._longest(tail)
            at = self._locate(view, tail[-length:])
            if length < FAR_MATCH_BYTES and not self._near(view, at + length):
                return None
        self.view, self.anchor = view, at + length
        return self.anchor

    def _locate(self, view: int, suffix: bytes) -> int:
        """Where `suffix` starts in a view: the first match ending at or after the line the output was
        last aligned on (as the prediction numbers its lines), else the first anywhere."""
        line = self.views[self.view].original_line(self.anchor)
        v = self.views[view]
        at = v.text.find(suffix, max(v.start_of_original(line) - len(suffix), 0))
        return at if at >= 0 else v.text.find(suffix)

    def _near(self, view: int, end: int) -> bool:
        """Whether a match ending at `end` of a view ends on the line the output was last aligned on or
        at most NEAR_LINES after it (as the prediction numbers its lines). Its end, not its start: a
        short match after an inserted line starts with the end of the line before the anchor's."""
        jump = self.views[view].original_line(end - 1) - self.views[self.view].original_line(self.anchor)
        return 0 <= jump <= NEAR_LINES

    def _longest(self, tail: bytes) -> tuple[int, int]:
        """(view, match length) of the longest suffix match; the current view, then the earliest built,
        wins a tie."""
        order = [self.view] + [i for i in range(len(self.views)) if i != self.view]
        best, length = self.view, 0
        for i in order:
            n = self.views[i].longest_suffix(tail)
            if n > length:
                best, length = i, n
        return best, length

    def _shift_seen(self, tail: bytes, view: int, end: int) -> int | None:
        """The shift (against the prediction as sent) that would align the output's current line with
        the view's line ending at `end`: when that line's text up to `end`, past its leading spaces,
        is the output's line past its own and only the leading spaces differ; else None."""
        nl = tail.rfind(b"\n")
        if nl < 0:
            return None  # the line's start has left the tail: its indentation is unknown
        out_line = tail[nl + 1 :]
        v = self.views[view]
        pred_line = v.text[v.line_starts[v.line_of(end - 1)] : end]
        if indent(out_line) == indent(pred_line) or not out_line.strip(b" "):
            return None
        if out_line.lstrip(b" ") != pred_line.lstrip(b" "):
            return None
        # Against the line as sent: a view shifted back leaves lines already at the margin there.
        sent = self.views[0]
        line = v.original_line(end - 1)
        if line >= len(sent.line_starts):
            return None
        start = sent.line_starts[line]
        stop = sent.line_starts[line + 1] if line + 1 < len(sent.line_starts) else len(sent.text)
        return indent(out_line) - indent(sent.text[start:stop])

    def _add_view(self, shift: int) -> bool:
        """Build the view shifted by `shift` unless it exists or the views are at their cap; whether one was built."""
        if (self.tokenize is None or len(self.views) > MAX_SHIFTED_VIEWS or len(self.text) > MAX_SHIFTED_BYTES
                or any(v.shift == shift for v in self.views)):
            return False
        source = self.source if self.source is not None else self.text.decode("utf-8", errors="replace")
        text, kept = shifted(source, shift)
        self.views.append(View.of(self.tokenize(text), piece=self.piece, shift=shift, origin=kept))
        return True

    def propose(self, k: int) -> Draft:
        """Up to k of the view's tokens after the cursor; none while the cursor is lost or inside one of
        the view's tokens (the output spelled it differently: wait for a shared boundary)."""
        v = self.views[self.view]
        i = v.boundaries.get(self.pos) if self.pos is not None else None
        if k <= 0 or i is None:
            return Draft((), source="prediction")
        return Draft(v.tokens[i : i + k], source="prediction")

    def available(self) -> int:
        """How many tokens a proposal could hold now (auto weighs drafts only this long)."""
        v = self.views[self.view]
        i = v.boundaries.get(self.pos) if self.pos is not None else None
        return 0 if i is None else len(v.tokens) - i

    def follow_odds(self, n: int) -> list[float]:
        """For each of the next n tokens a proposal would hold, the chance that the output follows the
        prediction there, given that it reached it: 1 at a token it has never left, else a Laplace
        estimate from this request's counts, (followed + 1) / (followed + left + 2). Replayed over the
        bench's answers (scripts/replay_auto.py) on three learned curves, auto weighing these put the
        large change at 1.08-1.09x `off` (0.92-0.94x without) and kept the other tasks' median."""
        v = self.views[self.view]
        i = v.boundaries.get(self.pos) if self.pos is not None else None
        if i is None:
            return []
        return [(self.followed[t] + 1) / (self.followed[t] + self.left[t] + 2) if self.left[t] else 1.0
                for t in v.tokens[i : i + n]]
