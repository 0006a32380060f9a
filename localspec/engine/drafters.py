"""Drafters: whatever proposes the tokens the target then verifies in one batch.

* `DraftModelDrafter`: a small model with the target's tokenizer. Greedy mode proposes its top-1
  token and stops early when that token's probability falls below `p_min`; sampling mode samples
  from its distribution q and keeps q for verification.
* `PromptLookupDrafter`: copies what followed the latest earlier occurrence of the last n tokens
  (prompt plus output). Strong when the answer quotes its input (editing, refactoring). With a
  `LookupHistory` it also copies from the same client's finished requests, so a request asked
  again (a retry, a regenerate, an agent's loop) drafts its earlier answer.
* No drafter at all is mode `off`: the target decodes one token per pass.

The draft model keeps its own KV cache per sequence. It is kept as a list of the tokens it
holds, so catching up after the target accepted or rejected tokens is a prefix comparison.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from localspec.engine.runtime import ModelRuntime, Row
from localspec.engine.sampling import SamplingParams, distribution, penalize
from localspec.engine.verify import GREEDY, TIE_MARGIN, Draft, PickRule, PositionRng


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    # Runs every decode step over the whole history: settle the usual case (one side extends the
    # other) with one C-level comparison before walking token by token.
    if list(a[:n]) == list(b[:n]):
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class DraftJob:
    """One sequence's request for a draft of up to k tokens after `history`."""

    seq: int
    history: list[int]
    k: int
    params: SamplingParams
    rng: PositionRng
    tokens: list[int] = field(default_factory=list)
    q: list[np.ndarray] = field(default_factory=list)


# How far a row's logits move with the batch it is read in (scripts/batch_invariance.py), as the spread of
# a top-two gap: an answer asked again parted only at tokens whose gap was under 0.17, flipping ~50% of
# the time under 0.03 and ~3% at 0.12-0.2 (docs/auto-mode.md, "After the answers part").
GAP_SPREAD = 0.08


def agreement_odds(gap: float) -> float:
    """The chance the target picks a greedy answer's token again when the same text is read in other
    batch shapes, from the top-two logit gap it was picked with: P(gap + noise > 0), noise ~ N(0, spread)."""
    if not gap < math.inf:
        return 1.0
    return 0.5 * (1.0 + math.erf(max(gap, 0.0) / (GAP_SPREAD * math.sqrt(2.0))))


class LookupHistory:
    """Finished sequences (prompt + output) a lookup may continue from, kept per scope (an API
    key's owner: what one client asked must not draft, and so time, another's answer).

    Like llama-server's ngram-mod pool, but a proposal from here needs the full n_max-token match:
    every chat shares its template's turn markers, and a short match across two different
    requests says little, while 16 tokens that end a prompt word for word mean the same request.
    Bounded: the oldest sequences go once a scope holds more than `max_tokens`.
    """

    SEPARATOR = -1  # between sequences; never a token id, so no match runs across two of them
    _END = np.array([SEPARATOR], dtype=np.int64)
    _NO_GAP = np.array([math.inf])

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._sequences: dict[str, list[np.ndarray]] = {}
        self._gaps: dict[str, list[np.ndarray]] = {}
        # Per sequence, how its greedy picks were made (`pick_rule`); None where its start was cut to the bound.
        self._rules: dict[str, list[PickRule | None]] = {}
        # Per scope, its sequences joined by separators, each token's top-two gap (inf: not a greedy
        # pick of the target, such as the prompt) and where each sequence begins.
        self._joined: dict[str, np.ndarray] = {}
        self._joined_gaps: dict[str, np.ndarray] = {}
        self._starts: dict[str, np.ndarray] = {}

    def add(self, scope: str, tokens: Sequence[int], *, end: int | None = None, gaps: Sequence[float] = (),
            rule: PickRule | None = GREEDY) -> None:
        """A finished sequence; `end`: the end-of-generation token that ended it, kept so that the
        answer asked again drafts its end too. `gaps`: the top-two logit gaps the target picked the
        last len(gaps) tokens with (its greedy answer, end included); the rest (the prompt) is given.
        `rule`: how those picks were made (`pick_rule`; None: not by a rule a later request can share)."""
        if end is not None:
            tokens = [*tokens, end]
        if self.max_tokens <= 0 or len(tokens) < 2:
            return
        gaps = list(gaps)[-len(tokens):]
        seq_gaps = np.full(len(tokens), math.inf)
        if gaps:
            seq_gaps[len(tokens) - len(gaps):] = gaps
        seq = np.asarray(tokens[-self.max_tokens:], dtype=np.int64)
        seq_gaps = seq_gaps[-self.max_tokens:]
        kept, kept_gaps = self._sequences.setdefault(scope, []), self._gaps.setdefault(scope, [])
        kept.append(seq)
        kept_gaps.append(seq_gaps)
        rules = self._rules.setdefault(scope, [])
        rules.append(rule if len(seq) == len(tokens) else None)
        total = sum(len(a) for a in kept)
        if total > self.max_tokens or scope not in self._joined:
            while total > self.max_tokens:
                total -= len(kept.pop(0))
                kept_gaps.pop(0)
                rules.pop(0)
            # Oldest first, so the latest match of a suffix is the most recent request's.
            self._joined[scope] = np.concatenate([x for a in kept for x in (a, self._END)])
            self._joined_gaps[scope] = np.concatenate([x for g in kept_gaps for x in (g, self._NO_GAP)])
            self._starts[scope] = np.cumsum([0] + [len(a) + 1 for a in kept[:-1]])
        else:  # one more sequence at the end: no need to join the others again
            before = len(self._joined[scope])
            self._joined[scope] = np.concatenate((self._joined[scope], seq, self._END))
            self._joined_gaps[scope] = np.concatenate((self._joined_gaps[scope], seq_gaps, self._NO_GAP))
            self._starts[scope] = np.append(self._starts[scope], before)

    def tokens(self, scope: str) -> np.ndarray | None:
        """The scope's sequences joined by separators (None if it has none)."""
        return self._joined.get(scope)

    def odds(self, scope: str, start: int, n: int, *, margin: float = 0.0) -> tuple[float, ...]:
        """`agreement_odds` of the scope's joined tokens start..start+n, where a near-tie within `margin`
        is settled in the earlier pick's favour (verify.TIE_MARGIN)."""
        return tuple(agreement_odds(float(g) + margin) for g in self._joined_gaps[scope][start : start + n])

    def own_picks(self, scope: str, start: int, n: int) -> tuple[int, ...]:
        """The joined tokens start..start+n, up to the first that is not a greedy pick of the target."""
        not_picked = np.flatnonzero(~np.isfinite(self._joined_gaps[scope][start : start + n]))
        picks = self._joined[scope][start : start + (int(not_picked[0]) if not_picked.size else n)]
        return tuple(int(t) for t in picks)

    def _sequence(self, scope: str, at: int) -> int:
        return int(np.searchsorted(self._starts[scope], at, side="right") - 1)

    def begins_with(self, scope: str, at: int, prefix: np.ndarray) -> bool:
        """Whether the sequence holding index `at` of the scope's joined tokens begins with `prefix`."""
        first = int(self._starts[scope][self._sequence(scope, at)])
        return bool(np.array_equal(self._joined[scope][first : first + len(prefix)], prefix))

    def continues(self, scope: str, at: int, prefix: np.ndarray, rule: PickRule | None) -> bool:
        """Whether index `at` of the scope's joined tokens follows exactly `prefix` from its sequence's start
        (a sequence cut to the bound has lost its start), picked by `rule`: what comes next there is what
        this request's own rule picked at this very context."""
        i = self._sequence(scope, at)
        return (rule is not None and self._rules[scope][i] == rule and int(self._starts[scope][i]) + len(prefix) == at
                and self.begins_with(scope, at, prefix))

    def clear(self) -> None:
        for store in (self._sequences, self._gaps, self._rules, self._joined, self._joined_gaps, self._starts):
            store.clear()


def _suffix_matches(source: np.ndarray, suffix: np.ndarray, n_max: int) -> tuple[int, np.ndarray]:
    """(length, index after each occurrence) of the longest suffix of `suffix` (at most n_max
    tokens) that occurs in `source` followed by a token; (0, empty) if none.

    Grows the match one token backwards at a time over the surviving candidates, so a call costs
    one pass over `source` plus the candidates, not one pass per n-gram length.
    """
    # Candidate match ends, each followed by a token (not by the separator that ends a request).
    ends = np.flatnonzero((source[:-1] == suffix[-1]) & (source[1:] >= 0))
    length = 1
    while ends.size and length < min(n_max, len(suffix)):
        back = ends - length
        ok = back >= 0
        grown = ends[ok][source[back[ok]] == suffix[-1 - length]]
        if not grown.size:
            break
        ends, length = grown, length + 1
    return (length, ends + 1) if ends.size else (0, ends)


def longest_suffix_match(source: np.ndarray, suffix: np.ndarray, n_max: int) -> tuple[int, int]:
    """(length, index after the match) of the latest occurrence in `source` of the longest suffix of
    `suffix` (at most n_max tokens) that is followed by a token; (0, -1) if none."""
    length, after = _suffix_matches(source, suffix, n_max)
    return (length, int(after[-1])) if after.size else (0, -1)


def shared_context(source: np.ndarray, end: int, suffix: np.ndarray, limit: int) -> int:
    """How many tokens before `end` in `source` equal the last tokens of `suffix` (at most `limit`)."""
    n = min(end, len(suffix), limit)
    differ = np.flatnonzero(source[end - n : end][::-1] != suffix[len(suffix) - n :][::-1])
    return int(differ[0]) if differ.size else n


# How far back an earlier request's context is compared with this sequence's, and over how many of its
# latest full matches: enough for a whole edit prompt (file and question), cheap per step.
HISTORY_CONTEXT = 4096
HISTORY_CANDIDATES = 64


class PromptLookupDrafter:
    """n-gram lookup over the sequence's own tokens; no model, no cost worth counting.

    The proposal continues the most recent earlier occurrence of the longest suffix that has one
    (between n_min and n_max tokens). That length is also the controller's evidence: a suffix of
    16 tokens found in the prompt means the answer is copying, and copies go on (measured on the
    bench's editing prompts: 95% per-position acceptance after 16+ matched tokens, 55% after 2).
    Given a history, an earlier request of the same scope with a full n_max match is copied instead
    where its tokens before the match agree with this sequence's for longer than the own match's do.
    """

    name = "lookup"

    def __init__(self, n_min: int = 2, n_max: int = 16, history: LookupHistory | None = None) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError("need 1 <= n_min <= n_max")
        self.n_min, self.n_max = n_min, n_max
        self.history = history if history is not None else LookupHistory(0)

    def _longest_match(self, arr: np.ndarray) -> tuple[int, int]:
        """(length, index after the match) of the longest earlier suffix match; (0, -1) if none."""
        if len(arr) < 2:
            return 0, -1
        length, start = longest_suffix_match(arr, arr, self.n_max)
        return (0, -1) if length < self.n_min else (length, start)

    def _from_history(self, arr: np.ndarray, history: np.ndarray | None) -> tuple[int, int]:
        """(shared context, index after it) of the earlier request whose tokens before a full n_max
        match agree longest with this sequence's; (0, -1) without a full match.

        Not simply the latest full match: requests about one file end their prompts alike (the
        file, the turn markers), so the latest other question's answer was copied where this one's
        own earlier answer was wanted (the bench's editing prompts ask two edits of each file: the
        second ask of one kept 2 of a 35-token copy of its sibling's answer).
        """
        if history is None or len(arr) < self.n_max:
            return 0, -1
        length, after = _suffix_matches(history, arr, self.n_max)
        if length < self.n_max:
            return 0, -1
        after = after[-HISTORY_CANDIDATES:]
        contexts = [shared_context(history, int(a), arr, HISTORY_CONTEXT) for a in after]
        best = max(range(len(after)), key=lambda i: (contexts[i], i))  # ties: the latest
        return contexts[best], int(after[best])

    def propose(self, history: Sequence[int], k: int, scope: str | None = None, *, prompt: int | None = None,
                rule: PickRule | None = GREEDY) -> Draft:
        """Up to k tokens after the most recent earlier match of the longest suffix n-gram (`scope`:
        whose finished requests may be copied too, see `LookupHistory`; None: none). `prompt`: how
        many of history's tokens are the prompt (None: all of them), which an earlier request must
        share to be this one asked again, and where a match in the answer so far is named "repeat".
        `rule`: how this request picks its tokens (`pick_rule`), which an earlier answer's picks must share
        to settle this one's near-ties (`Draft.own_picks`).

        Sources: "lookup" (the prompt, or another question's answer), "repeat" (the answer's own earlier
        text: it runs on far less than a copy of the input), "history" (this question's earlier answer)."""
        arr = np.asarray(history, dtype=np.int64)
        earlier = None if scope is None else self.history.tokens(scope)
        n, start = self._longest_match(arr)
        source, name = arr, "repeat" if prompt is not None and start >= prompt else "lookup"
        # An earlier request wins where its context agrees longer than the sequence's own match:
        # always when that is short, and over a full one when it is the same question asked again
        # (a copy of the prompt stops at the edit; the earlier answer made the same edit).
        m, start_earlier = self._from_history(arr, earlier)
        if m and scope is not None and earlier is not None:
            own = shared_context(arr, start, arr, HISTORY_CONTEXT) if n >= self.n_max else n
            # An earlier request with this prompt is the same question asked again, with its own prior
            # in auto's book, also past a near-tie where the answers parted; it takes ties too, since
            # after the answers meet again it knows the edits ahead and the prompt does not. Another
            # question about the same text gives a copy like the prompt's (an edit's sibling answer
            # kept 2 of 48 tokens on the asked-again prior).
            again = self.history.begins_with(scope, start_earlier, arr[: len(arr) if prompt is None else prompt])
            if m > own or (again and m == own):
                n, start, source, name = self.n_max, start_earlier, earlier, "history" if again else "lookup"
        if k <= 0 or n == 0:
            return Draft(tokens=(), q=None, source=name, match_length=n)
        proposal = source[start : start + k]
        odds: tuple[float, ...] = ()
        own_picks: tuple[int, ...] = ()
        if source is earlier and scope is not None:  # a copy from an earlier request ends with that request
            ends = np.flatnonzero(proposal == LookupHistory.SEPARATOR)
            proposal = proposal[: ends[0]] if ends.size else proposal
            # The same question, its answer so far word for word, picked by the same rule: the earlier answer's
            # next tokens are the target's own picks at exactly this context, which a verify keeps at near-ties
            # (TIE_MARGIN). One past the proposal too, for the row after a copy kept whole.
            if name == "history" and self.history.continues(scope, start, arr, rule):
                own_picks = self.history.own_picks(scope, start, len(proposal) + 1)
            sure = min(len(own_picks), len(proposal))
            odds = self.history.odds(scope, start, sure, margin=TIE_MARGIN) + self.history.odds(
                scope, start + sure, len(proposal) - sure)
        return Draft(tokens=tuple(int(t) for t in proposal), q=None, source=name, match_length=n, odds=odds,
                     own_picks=own_picks)

    def match_length(self, history: Sequence[int], scope: str | None = None) -> int:
        """Length of the n-gram a proposal would continue (0 = none); the controller's input."""
        return self.propose(history, 0, scope).match_length


class DraftModelDrafter:
    """A small model that drafts for many sequences at once, one batched decode per draft step."""

    name = "draft"

    def __init__(self, runtime: ModelRuntime, target_n_vocab: int, p_min: float = 0.0) -> None:
        self.runtime = runtime
        self.target_n_vocab = target_n_vocab
        self.p_min = p_min
        self.kv: dict[int, list[int]] = {}  # seq -> tokens held in the draft's KV cache
        self.decode_calls = 0

    # -------------------------------------------------------------- KV bookkeeping

    def _truncate(self, seq: int, n: int) -> None:
        kv = self.kv.setdefault(seq, [])
        if n < len(kv):
            self.runtime.seq_rm(seq, n, -1)
            del kv[n:]

    def forget(self, seq: int) -> None:
        self._truncate(seq, 0)

    def sync(self, seq: int, history: Sequence[int], budget: int) -> int:
        """Feed up to `budget` tokens of history the draft has not seen (used during prefill).

        Keeps the final history token back: `propose` decodes it to get the first draft logits.
        Returns the number of tokens fed.
        """
        kv = self.kv.setdefault(seq, [])
        keep = common_prefix(kv, history)
        self._truncate(seq, keep)
        todo = list(history[keep : len(history) - 1])[:budget]
        if todo:
            base = len(kv)
            self.runtime.decode([Row(t, base + i, seq) for i, t in enumerate(todo)])
            self.decode_calls += 1
            kv.extend(todo)
        return len(todo)

    # -------------------------------------------------------------- drafting

    def _logits(self, row: np.ndarray) -> np.ndarray:
        # A draft vocabulary larger than the target's must never propose the extra ids.
        return row[: self.target_n_vocab] if row.shape[0] > self.target_n_vocab else row

    def propose_many(self, jobs: list[DraftJob]) -> list[Draft]:
        """Draft for several sequences; every draft step is one batch across them."""
        rows: list[Row] = []
        active: list[DraftJob] = []
        for job in jobs:
            if job.k <= 0:
                continue
            kv = self.kv.setdefault(job.seq, [])
            # Catch up: everything after the common prefix, re-decoding at least the last token.
            keep = self._reusable(job.seq, job.history)
            self._truncate(job.seq, keep)
            for i, t in enumerate(job.history[keep:]):
                rows.append(Row(t, keep + i, job.seq, logits=(keep + i == len(job.history) - 1)))
            kv.extend(job.history[keep:])
            active.append(job)
        while active:
            logits = self.runtime.decode(rows)
            self.decode_calls += 1
            rows, still = [], []
            for job, row in zip(active, logits, strict=True):  # one logits row per active job
                ctx = job.history + job.tokens
                pos = len(ctx)
                row = self._logits(row)
                if job.params.greedy:
                    z = penalize(row, job.params, ctx).astype(np.float64)
                    top = int(np.argmax(z))
                    if self.p_min > 0.0:
                        p_top = 1.0 / np.exp(z - z[top]).sum()
                        if p_top < self.p_min:
                            continue  # not confident: stop drafting this sequence here
                    job.tokens.append(top)
                else:
                    q = distribution(row, job.params, ctx, n_vocab=self.target_n_vocab)
                    job.tokens.append(job.rng.choice(q, pos, PositionRng.DRAFT))
                    job.q.append(q)
                if len(job.tokens) < job.k:
                    rows.append(Row(job.tokens[-1], pos, job.seq, logits=True))
                    self.kv[job.seq].append(job.tokens[-1])
                    still.append(job)
            active = still
        return [
            Draft(tokens=tuple(j.tokens), q=tuple(j.q) if j.q else None, source="draft") for j in jobs
        ]

    def lag(self, seq: int, history: Sequence[int]) -> int:
        """Tokens the draft must read before it can propose after `history`: all after the prefix
        its KV shares with it (1 when caught up). Not len(history) - len(kv): a slot's draft KV may
        hold an earlier request that parts from this one after the chat template's first tokens."""
        return len(history) - self._reusable(seq, history)

    def _reusable(self, seq: int, history: Sequence[int]) -> int:
        """Draft KV entries a proposal after `history` keeps: the shared prefix, less the last token,
        which is always decoded again for the first draft logits."""
        return min(common_prefix(self.kv.get(seq, []), history), len(history) - 1)

    def rollback(self, seq: int, history: Sequence[int]) -> None:
        """After verification: keep only the draft KV that agrees with the accepted history."""
        kv = self.kv.setdefault(seq, [])
        self._truncate(seq, min(common_prefix(kv, history), max(len(history) - 1, 0)))
