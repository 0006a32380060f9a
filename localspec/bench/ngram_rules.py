"""llama.cpp's n-gram drafters as rules over a recorded answer, priced on a verify curve.

`localspec bench` compares `auto` with llama-server's `ngram-simple`, `ngram-map-k` and `ngram-mod`,
but a timed run mixes each drafter's choices with its engine's per-pass costs and the box's noise.
Replayed on a recorded greedy answer and priced on one curve (a pass of n rows costs verify(n) single
steps), two policies differ only by what they draft. The rules, after llama.cpp's common/ngram-map.cpp
and common/ngram-mod.cpp (the sdist's vendored llama.cpp, defaults as llama-server sets them):

* `ngram-simple`: the latest earlier occurrence of the last `n` tokens (12), and the up to `m` (48)
  tokens after it; nothing unless at least `n` follow it.
* `ngram-map-k`: the same key of `n` tokens, found only where `m` tokens follow it; it drafts
  min(`m`, what its last draft from that key kept): a key whose copy failed at once drafts nothing again.
* `ngram-mod`: every `n`-token context (24) seen so far maps to the token after it (the latest wins);
  from the current context the chain of next tokens is followed up to `m_max` (64) and drafted only if
  it reaches `m_min` (48). Its pool is shared by the server's requests; here, as a first ask, it holds
  the prompt and the answer so far (the answer's contexts are added once 32 new tokens are waiting).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Priced:
    """An answer replayed under one rule: its speed-up over plain decoding on the curve."""

    speedup: float
    drafted: int
    kept: int
    passes: int


def _latest(tokens: Sequence[int], key: Sequence[int], last_start: int) -> int:
    """The latest start j <= last_start where tokens[j:j+len(key)] == key; -1 if none."""
    n = len(key)
    for j in range(last_start, -1, -1):
        if tokens[j] == key[0] and list(tokens[j : j + n]) == list(key):
            return j
    return -1


def ngram_simple(tokens: Sequence[int], n: int = 12, m: int = 48) -> list[int]:
    """ngram-simple's draft after `tokens` (prompt, answer so far, the last token just sampled)."""
    cur = len(tokens)
    if cur <= n + m + 1:
        return []
    at = _latest(tokens, tokens[cur - n :], cur - n - 1)
    if at < 0:
        return []
    copy = min(m, cur - (at + n))
    return list(tokens[at + n : at + n + copy]) if copy >= n else []


@dataclass
class NgramMapK:
    """ngram-map-k for one request: keys remember how much of their last draft was kept."""

    n: int = 12
    m: int = 48
    kept_by_key: dict[tuple[int, ...], int] = field(default_factory=dict)
    last_key: tuple[int, ...] | None = None

    def draft(self, tokens: Sequence[int]) -> list[int]:
        cur, n, m = len(tokens), self.n, self.m
        self.last_key = None
        if cur < 2 * n + m:
            return []
        key = tuple(tokens[cur - n :])
        at = _latest(tokens, key, cur - n - m - 2)
        if at < 0:
            return []
        self.last_key = key
        return list(tokens[at + n : at + n + min(m, self.kept_by_key.get(key, m))])

    def observe(self, kept: int) -> None:
        if self.last_key is not None:
            self.kept_by_key[self.last_key] = kept


@dataclass
class NgramMod:
    """ngram-mod for one request: a pool of n-token contexts to their next token."""

    n: int = 24
    m_min: int = 48
    m_max: int = 64
    pool: dict[tuple[int, ...], int] = field(default_factory=dict)
    added: int = 0  # contexts starting before this index are in the pool

    def _add(self, tokens: Sequence[int], upto: int) -> None:
        for i in range(self.added, upto):
            self.pool[tuple(tokens[i : i + self.n])] = tokens[i + self.n]
        self.added = max(self.added, upto)

    def begin(self, prompt: Sequence[int]) -> None:
        if len(prompt) > self.n:
            self._add(prompt, len(prompt) - self.n)

    def draft(self, tokens: Sequence[int]) -> list[int]:
        cur, n = len(tokens), self.n
        if cur < n:
            return []
        if self.added + 32 < cur:
            self._add(tokens, cur - n)
        context, out = list(tokens[cur - n :]), []
        for i in range(self.m_max):
            nxt = self.pool.get(tuple(context[i : i + n]))
            if nxt is None:
                if i < self.m_min:
                    return []
                break
            out.append(nxt)
            context.append(nxt)
        return out


def price(prompt: Sequence[int], answer: Sequence[int], steps: Callable[[int], float],
          rule: Callable[[Sequence[int]], list[int]], observe: Callable[[int], None] | None = None) -> Priced:
    """Plain decoding's single steps over the rule's, for an answer after its first token (the bench's
    decode speed leaves the prompt's pass out): each pass drafts what the rule proposes after the
    history, keeps the prefix the answer agrees with, and costs verify(drafted + 1)."""
    i, spent, drafted, kept_all, passes = 1, 0.0, 0, 0, 0
    while i < len(answer):
        draft = rule([*prompt, *answer[:i]])[: len(answer) - i - 1] if i < len(answer) - 1 else []
        kept = next((j for j, t in enumerate(draft) if answer[i + j] != t), len(draft))
        if observe is not None:
            observe(kept)
        spent += steps(len(draft) + 1)
        drafted, kept_all, passes, i = drafted + len(draft), kept_all + kept, passes + 1, i + kept + 1
    return Priced((len(answer) - 1) * steps(1) / spent if spent else 1.0, drafted, kept_all, passes)


def price_rules(prompt: Sequence[int], answer: Sequence[int], steps: Callable[[int], float]) -> dict[str, Priced]:
    """Each llama.cpp rule's replay of one answer asked for the first time."""
    mapk, mod = NgramMapK(), NgramMod()
    mod.begin(prompt)
    return {
        "ngram-simple": price(prompt, answer, steps, ngram_simple),
        "ngram-map-k": price(prompt, answer, steps, mapk.draft, mapk.observe),
        "ngram-mod": price(prompt, answer, steps, mod.draft),
    }
