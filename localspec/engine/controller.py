"""The `auto` mode: choose the drafter and draft length that maximise expected tokens per second.

Speculation pays only when drafting plus verification costs less than the tokens it saves. On a
2-core CPU a verify batch of 5 rows costs 3.5-4.2x a single-row step, so a draft model rarely pays;
on a GPU a batch of 8 costs about one step, so it nearly always does. We measure instead of guess.

For a drafter whose position-i draft survives with conditional probability a_i (given that all
earlier ones did), proposing k tokens yields in expectation

    E[tokens | k] = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_k

(the leading 1 is the correction or bonus token every verify pass produces). With a constant
a_i = alpha this is the familiar (1 - alpha^(k+1)) / (1 - alpha). The cost of that step is

    cost(k) = catch_up + k * draft_step + verify(k + 1)

where verify(n) is the target's cost for an n-row batch and catch_up is the draft model's cost of
re-reading tokens it missed while other drafters ran. The controller picks the (drafter, k) with
the largest E / cost; k = 0 is plain decoding at 1 / verify(1). See docs/auto-mode.md.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

# Beta(1, 1)-style prior per position so a drafter is tried before it is judged; the prior is
# weak (a couple of observations) so real evidence takes over within a few steps.
PRIOR_ACCEPT = 1.4
PRIOR_TRIALS = 2.0
EXPLORATION = 0.5  # standard errors of optimism added to an estimate while choosing


@dataclass
class Costs:
    """Seconds per operation on this machine; refreshed online from real timings."""

    verify: list[float]  # verify[n-1] = target batch of n rows with logits (n = 1..k_max+1)
    draft_step: float  # one single-row draft decode
    draft_row: float  # per extra row when the draft catches up in one batch
    smoothing: float = 0.1

    def verify_cost(self, rows: int) -> float:
        if rows <= len(self.verify):
            return self.verify[rows - 1]
        # Past the calibrated range: extrapolate the last slope.
        last, prev = self.verify[-1], self.verify[-2] if len(self.verify) > 1 else self.verify[-1] / 2
        return last + (rows - len(self.verify)) * (last - prev)

    def catch_up(self, tokens: int) -> float:
        return 0.0 if tokens <= 0 else self.draft_step + (tokens - 1) * self.draft_row

    def observe_verify(self, rows: int, seconds: float) -> None:
        """Move the whole verify curve towards an observed timing, keeping its calibrated shape.

        The level moves with context length (every row reads the whole KV cache) and with load.
        Refreshing only the observed point skewed the curve: plain decoding observes rows = 1
        alone, so at long context verify(1) rose while verify(3) kept its short-context value,
        drafting looked cheap, and `auto` ran the draft model at a loss (bench, long suite 0.90x).
        """
        if 1 <= rows <= len(self.verify) and self.verify[rows - 1] > 0:
            scale = 1.0 + self.smoothing * (seconds / self.verify[rows - 1] - 1.0)
            self.verify = [v * scale for v in self.verify]

    def observe_draft_step(self, seconds: float) -> None:
        self.draft_step += self.smoothing * (seconds - self.draft_step)

    def to_json(self) -> dict:
        return {"verify": self.verify, "draft_step": self.draft_step, "draft_row": self.draft_row}

    @classmethod
    def from_json(cls, data: dict) -> Costs:
        return cls(verify=list(data["verify"]), draft_step=float(data["draft_step"]),
                   draft_row=float(data["draft_row"]))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1))
        tmp.replace(path)


@dataclass
class Acceptance:
    """Per-position conditional acceptance counts for one drafter (optionally one context key).

    Old evidence fades (each observation scales the counts by `decay`), so the estimate follows
    the workload when it changes, from copying code to writing prose.
    """

    accepted: list[float] = field(default_factory=list)
    trials: list[float] = field(default_factory=list)
    decay: float = 1.0

    def rates(self, n: int) -> list[float]:
        """Estimated P(position i+1 accepted | positions 1..i were), for i = 0..n-1.

        Position 1 starts from the fixed prior; each later position starts from the estimate of
        the one before it. Acceptance changes slowly with position, and a fixed prior there would
        keep a drafter at k = 1 forever: k = 2 is never tried if position 2 looks like a coin flip.
        """
        out, prior = [], PRIOR_ACCEPT / PRIOR_TRIALS
        for i in range(n):
            a = self.accepted[i] if i < len(self.accepted) else 0.0
            t = self.trials[i] if i < len(self.trials) else 0.0
            prior = (a + prior * PRIOR_TRIALS) / (t + PRIOR_TRIALS)
            out.append(prior)
        return out

    def rate(self, i: int) -> float:
        return self.rates(i + 1)[i] if i >= 0 else 1.0

    def planning_rates(self, n: int) -> list[float]:
        """rates(n), each plus half a standard error: what the controller plans with.

        A little optimism while evidence is thin keeps one unlucky rejection from retiring a
        drafter for good (the rule is greedy and would never try it again); with evidence the
        bonus shrinks and the plain estimate decides.
        """
        out = []
        for i, r in enumerate(self.rates(n)):
            t = self.trials[i] if i < len(self.trials) else 0.0
            out.append(min(1.0, r + EXPLORATION * math.sqrt(r * (1.0 - r) / (t + PRIOR_TRIALS))))
        return out

    def observe(self, drafted: int, accepted: int) -> None:
        """Positions 1..accepted survived; position accepted+1 (if drafted) was rejected."""
        if self.decay < 1.0:
            self.trials = [t * self.decay for t in self.trials]
            self.accepted = [a * self.decay for a in self.accepted]
        reached = min(drafted, accepted + 1)
        while len(self.trials) < reached:
            self.trials.append(0.0)
            self.accepted.append(0.0)
        for i in range(reached):
            self.trials[i] += 1
            if i < accepted:
                self.accepted[i] += 1


# Lookup evidence is pooled by match length: 1, 2, 3, 4-7, 8-15, 16+ tokens. Short matches are
# weak bets; a long one means the answer is copying its input and will likely go on copying.
_MATCH_BUCKETS = (16, 8, 4, 3, 2, 1)


def match_bucket(match_length: int) -> int:
    return next((b for b in _MATCH_BUCKETS if match_length >= b), 0)


@dataclass
class AcceptanceBook:
    """What the engine has learned about its drafters, shared by every request it runs.

    Shared because one request is too short to learn from: each new request would otherwise pay
    to try every drafter again (measured: ~5% of a 64-token answer on code prompts).
    """

    decay: float = 0.99  # an observation's weight halves after ~70 newer ones
    draft: Acceptance = field(default_factory=Acceptance)
    lookup: dict[int, Acceptance] = field(default_factory=dict)  # keyed by match_bucket

    def __post_init__(self) -> None:
        self.draft.decay = self.decay

    def for_lookup(self, match_length: int) -> Acceptance:
        key = match_bucket(match_length)
        if key not in self.lookup:
            self.lookup[key] = Acceptance(decay=self.decay)
        return self.lookup[key]


def expected_tokens(rates: list[float]) -> float:
    """1 + a1 + a1 a2 + ... for the given conditional acceptance rates."""
    total, survive = 1.0, 1.0
    for a in rates:
        survive *= a
        total += survive
    return total


@dataclass(frozen=True)
class Choice:
    drafter: str  # "draft" | "lookup" | "off"
    k: int
    expected_rate: float  # tokens per second this choice expects


class Controller:
    """Per-sequence face of `auto`: the choice rule over the engine's shared acceptance book."""

    def __init__(
        self, costs: Costs, k_max: int = 8, has_draft_model: bool = True, book: AcceptanceBook | None = None
    ) -> None:
        self.costs = costs
        self.k_max = k_max
        self.has_draft_model = has_draft_model
        self.book = book if book is not None else AcceptanceBook(decay=1.0)

    @property
    def draft(self) -> Acceptance:
        return self.book.draft

    @draft.setter
    def draft(self, value: Acceptance) -> None:
        self.book.draft = value

    @property
    def lookup(self) -> dict[int, Acceptance]:
        return self.book.lookup

    def choose(self, draft_lag: int, lookup_match: int, lookup_available: int, k_cap: int) -> Choice:
        """Pick the best (drafter, k).

        draft_lag: tokens the draft model must catch up before it can draft;
        lookup_match: n-gram length of the prompt-lookup match (0 = none);
        lookup_available: how many tokens the lookup match could propose;
        k_cap: the most tokens worth drafting (max_tokens and context left).
        """
        c = self.costs
        best = Choice("off", 0, 1.0 / c.verify_cost(1))
        k_top = min(self.k_max, k_cap)
        if self.has_draft_model:
            expected, survive = 1.0, 1.0  # E[tokens | k] built up one position at a time
            for k, a in enumerate(self.draft.planning_rates(k_top), start=1):
                survive *= a
                expected += survive
                cost = c.catch_up(draft_lag) + k * c.draft_step + c.verify_cost(k + 1)
                if expected / cost > best.expected_rate:
                    best = Choice("draft", k, expected / cost)
        if lookup_match > 0:
            expected, survive = 1.0, 1.0
            rates = self.book.for_lookup(lookup_match).planning_rates(min(k_top, lookup_available))
            for k, a in enumerate(rates, start=1):
                survive *= a
                expected += survive
                if expected / c.verify_cost(k + 1) > best.expected_rate:
                    best = Choice("lookup", k, expected / c.verify_cost(k + 1))
        return best

    def observe(self, choice: Choice, drafted: int, accepted: int, lookup_match: int = 0) -> None:
        if choice.drafter == "draft" and drafted:
            self.draft.observe(drafted, accepted)
        elif choice.drafter == "lookup" and drafted:
            self.book.for_lookup(lookup_match).observe(drafted, accepted)
