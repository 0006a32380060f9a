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

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from localspec.engine.costs import Costs

# Beta(1, 1)-style prior per position so a drafter is tried before it is judged; the prior is
# weak (a couple of observations) so real evidence takes over within a few steps.
PRIOR_ACCEPT = 1.4
PRIOR_TRIALS = 2.0
# A prediction is the client saying what the answer will mostly be: its first steps are planned as
# if most of it holds, and a wrong one is found out within a few passes. Per request (see Controller).
PREDICTION_PRIOR = 0.9
EXPLORATION = 0.5  # standard errors of optimism added to an estimate while choosing
# ... and while exploring, at every position a draft could reach: what a draft might be worth if the
# belief about its acceptance is wrong. One standard error lifts an untried position's prior (0.7 on
# two pseudo-trials) to 1, and a thousand rejections leave it near their rate.
HOPE = 1.0
# What the other requests taught of a position, as the prior of one request's own evidence, is worth
# one of the request's passes: its own evidence takes over at once (a weight of 2 still drafted 16-48
# tokens six times on a rewrite whose copies kept 0-16).
REQUEST_WEIGHT = 1.0
# A request stops drafting its prediction once the prediction's drafts have cost this many single
# steps more than they gave (kept tokens + 1 against verify(k + 1) on the learned curve): more than
# one 16-token draft kept at 0 on a CPU (17 rows: 9.7 steps), since an edit's first draft often fails
# at the edit itself (a rename's first line) and the copy goes on after it; at 5 a 55-token rename
# stopped after its first draft and drafted nothing more. A mostly wrong prediction (the bench's large
# change, code rewritten as a class) kept drafting 15-16 tokens at its many short copies and kept 2-5
# of each, 0.80x `off`.
PREDICTION_STOP_LOSS = 10.0
# What the drafts saved counts up to this much: a prediction that copied well and then goes wrong
# (the file's first half kept, its second rewritten) stops within about three failed long drafts.
PREDICTION_CREDIT = PREDICTION_STOP_LOSS
# ... and drafts it again, from its first belief, once the output has followed it this many tokens in
# a row since it stopped (two whole drafts' worth): the edit is over and the answer copies again.
PREDICTION_RESUME = 32
_STOPPING = -1  # prediction_stopped_at until the next choice reads the streak
# Only a plain step measures the level (a single-row pass, the unit of every belief) alone: a drafting pass
# times the level and the shape together, and where every pass drafts, one takes the other's error. From a
# calibration that put a single step at 5x its time, 2-row passes taught the shape 1.1 steps (the truth
# 1.55) and the level 1.4x its truth, and `auto` drafted 1 token every pass at 30% acceptance, 0.85x `off`.
# So a plain step is taken once LEVEL_CHECK passes ran without one, and after LEVEL_RECHECK while the last
# one disagreed with the level by more than LEVEL_TOLERANCE (log): one plain step moves it a few percent.
LEVEL_CHECK = 64
LEVEL_RECHECK = 8
LEVEL_TOLERANCE = 0.2
EXPLORE_BUDGET = 0.01  # the most of its time `auto` spends on choices it believes do not pay
EXPLORE_CREDIT_S = 30.0  # credit saved up covers at most this many seconds of steps


@dataclass
class Acceptance:
    """Per-position conditional acceptance counts for one drafter (optionally one context key).

    Old evidence fades (each observation scales the counts by `decay`), so the estimate follows
    the workload when it changes, from copying code to writing prose.
    """

    accepted: list[float] = field(default_factory=list)
    trials: list[float] = field(default_factory=list)
    decay: float = 1.0
    prior: float = PRIOR_ACCEPT / PRIOR_TRIALS  # P(accepted) at position 1 before any evidence
    # The prior says the answer copies a known text (a client's prediction, the same owner's earlier
    # answer): long runs are the belief itself, so positions no draft has reached plan optimistically too.
    copy_prior: bool = False

    def counts(self, i: int) -> tuple[float, float]:
        """(accepted, trials) at position i + 1."""
        return (self.accepted[i], self.trials[i]) if i < len(self.trials) else (0.0, 0.0)

    def rates(self, n: int, own: Acceptance | None = None) -> list[float]:
        """Estimated P(position i+1 accepted | positions 1..i were), for i = 0..n-1.

        Position 1 starts from the fixed prior; each later position starts from the estimate of
        the one before it. Acceptance changes slowly with position, and a fixed prior there would
        keep a drafter at k = 1 forever: k = 2 is never tried if position 2 looks like a coin flip.

        `own`: one request's own evidence, not counted in this one (see `less`). It revises each
        position's estimate, which is its prior: worth PRIOR_TRIALS of its passes where the pooled
        evidence is thin, down to REQUEST_WEIGHT where it is ample. The pooled
        evidence learns slowly (it halves over ~70 observations), while one request copies well or
        badly as a whole. After a rename's copies had taught the book that 4-token matches run on
        for 47 tokens, a rewrite drafted 15-47 tokens from such matches 20 times and kept 0-18 of
        them (0.70x plain decoding).
        """
        out, prior = [], self.prior
        for i in range(n):
            a, t = self.counts(i)
            prior = (a + prior * PRIOR_TRIALS) / (t + PRIOR_TRIALS)
            if own is not None:
                # The pooled estimate's weight: the fixed prior's where other requests saw nothing,
                # down to REQUEST_WEIGHT where they saw much.
                weight = REQUEST_WEIGHT + (PRIOR_TRIALS - REQUEST_WEIGHT) * PRIOR_TRIALS / (t + PRIOR_TRIALS)
                a, t = own.counts(i)
                prior = (a + prior * weight) / (t + weight)
            out.append(prior)
        return out

    def rate(self, i: int) -> float:
        return self.rates(i + 1)[i] if i >= 0 else 1.0

    def planning_rates(self, n: int, own: Acceptance | None = None) -> list[float]:
        """rates(n, own), each plus half a standard error: what the controller plans with.

        A little optimism while evidence is thin keeps one unlucky rejection from retiring a
        drafter for good (the rule is greedy and would never try it again); with evidence the
        bonus shrinks and the plain estimate decides. Past position 1 the bonus is paid only where
        drafts have reached (in proportion up to one trial), unless the prior is a copy's: on
        positions never tried it compounded to certainty, so one accepted 3-token lookup planned a
        47-token draft (42 tokens expected, 19 steps on this CPU) that kept 1.
        """
        return self._optimistic(n, own, EXPLORATION, everywhere=self.copy_prior)

    def hopeful_rates(self, n: int, own: Acceptance | None = None) -> list[float]:
        """rates(n, own), each plus HOPE standard errors, reached or not: the explorer's upper bound.
        Planning pays no optimism where drafts have not reached, so on a steep verify curve a lookup
        that was never tried long stays untried: a rename copying its prompt drafted nothing at all
        (k = 1: 1.9 tokens for verify(2) = 1.94 steps, and k > 1 planned on a 0.7 prior)."""
        return self._optimistic(n, own, HOPE, everywhere=True)

    def _optimistic(self, n: int, own: Acceptance | None, errors: float, *, everywhere: bool) -> list[float]:
        """rates(n, own), each plus `errors` standard errors: at position 1 always, past it where drafts
        have reached (in proportion up to one trial) or, `everywhere`, at every position."""
        out = []
        for i, r in enumerate(self.rates(n, own)):
            t = self.counts(i)[1] + (own.counts(i)[1] if own is not None else 0.0)
            reach = 1.0 if i == 0 or everywhere else min(1.0, t)
            out.append(min(1.0, r + reach * errors * math.sqrt(r * (1.0 - r) / (t + PRIOR_TRIALS))))
        return out

    def less(self, own: Acceptance) -> Acceptance:
        """This evidence without one request's own share of it, which `rates(n, own)` weighs apart
        (approximately where other requests observed in between: each decayed the share too)."""
        trials = [max(0.0, t - own.counts(i)[1]) for i, t in enumerate(self.trials)]
        accepted = [min(max(0.0, a - own.counts(i)[0]), trials[i]) for i, a in enumerate(self.accepted)]
        return Acceptance(accepted=accepted, trials=trials, decay=self.decay, prior=self.prior,
                          copy_prior=self.copy_prior)

    def planned(self, n: int, own: Acceptance | None, *, hopeful: bool = False) -> list[float]:
        """The planning rates of this pooled evidence for one request with `own` evidence (None: none
        yet); `hopeful`: the explorer's upper bound instead (see `hopeful_rates`). Per book entry, not
        pooled over a request's lookup match lengths: pooled, the first rejection of a rename stopped
        its copies at every length (1 token drafted in 321)."""
        evidence = self if own is None else self.less(own)
        return (evidence.hopeful_rates if hopeful else evidence.planning_rates)(n, own)

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


EARLIER_BUCKET = -1  # a full match in an earlier request (LookupHistory): its own evidence, since a
# regenerated answer at temperature > 0 parts from the earlier one sooner than a copy of the prompt
# The same owner's earlier answer, matched on 16 tokens, is the answer asked again: like a client's
# prediction, it starts from the prediction's prior. From the copy prior (0.7) a long copy never paid
# on a CPU's verify curve, so the first request asked again copied nothing (bench, code prompt #1:
# 2 tokens drafted in 256, identical output, then 248 of 248 on the third ask). Sampled answers that
# part sooner book their rejections here and the evidence takes over within a few passes.
EARLIER_PRIOR = PREDICTION_PRIOR
REALIGNED_BUCKET = -2  # the earlier answer again, after this one parted from it at a copy's verify
# and met it again on 16 tokens: another bet than the answer asked again. Where the answers parted in
# prose they meet at the code between docstrings and part at the next one: a second ask whose first
# copy of its first answer parted at token 9 drafted two more 15-token copies there and kept 0 of each
# (0.89x `off`), and their rejections taught the asked-again entry that the third ask would not copy
# (it drafted nothing for 112 tokens of an answer it then copied). From the same prior, planned without
# a copy's optimism at positions not reached, so it drafts short until the request's own copies run on.


# Added to a match-length bucket where the match is in the answer so far, not in the prompt: an answer
# repeating itself runs on far less than one copying its input. Offline, over the bench's greedy answers,
# 8-15-token matches continued for 8 more tokens 71% of the time in an edit's prompt and 0% in a code
# answer's own text (4-7 tokens: 54% and 1%); sharing one entry, every code first ask drafted a 13-15-token
# copy of its own text from what the editing suite had taught and kept 0-1 (3-4% of the answer).
REPEAT_BUCKETS = 100


def match_bucket(match_length: int, *, earlier: bool = False, parted: bool = False, repeat: bool = False) -> int:
    if earlier:
        return REALIGNED_BUCKET if parted else EARLIER_BUCKET
    return next((b for b in _MATCH_BUCKETS if match_length >= b), 0) + (REPEAT_BUCKETS if repeat else 0)


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

    def for_lookup(self, match_length: int, *, earlier: bool = False, parted: bool = False,
                   repeat: bool = False) -> Acceptance:
        return self.entry(match_bucket(match_length, earlier=earlier, parted=parted, repeat=repeat))

    def entry(self, key: int) -> Acceptance:
        """The lookup evidence of one match_bucket key, started from its prior."""
        if key not in self.lookup:
            prior = EARLIER_PRIOR if key in (EARLIER_BUCKET, REALIGNED_BUCKET) else PRIOR_ACCEPT / PRIOR_TRIALS
            self.lookup[key] = Acceptance(decay=self.decay, prior=prior, copy_prior=key == EARLIER_BUCKET)
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
    drafter: str  # "draft" | "lookup" | "prediction" | "off"
    k: int
    expected_rate: float  # tokens per second this choice expects
    explored: bool = False  # taken to learn, against the belief that it pays less than the best


@dataclass
class Explorer:
    """Exploration on a budget, so that a wrong belief heals: a cost curve taken on a busy box
    says drafting never pays, and `auto`, never drafting, would never learn otherwise.

    Each step earns `budget` × its believed cost in credit; a step may explore only by spending
    its believed loss, cost(k') − E[tokens | k'] / best_rate (the time the best choice would have
    needed for the same tokens). Spending never exceeds what was earned, so the time lost to
    exploring is at most `budget` of the time spent, by the controller's own beliefs; when those
    beliefs are wrong the other way (drafting looks cheap), `auto` drafts and learns without it.
    Deterministic: the same run makes the same choices.
    """

    budget: float = EXPLORE_BUDGET
    credit: float = 0.0
    explored: int = 0

    def earn(self, seconds: float) -> None:
        self.credit = min(self.credit + self.budget * seconds, self.budget * EXPLORE_CREDIT_S)

    def spend(self, loss: float) -> bool:
        if self.budget <= 0 or loss > self.credit:
            return False
        self.credit -= loss
        self.explored += 1
        return True

    def settle(self, believed: float, actual: float) -> None:
        """An explored step's outcome: it is charged what it lost, not what was believed. The belief
        is the hopeful one that made it worth a try, so failures cost more than it says: a first ask
        explored 23 of its 41 drafts, 12-15-token copies at short matches that kept 1-6 (0.87x `off`).
        Debt is paid back from later earnings before anything else is explored."""
        self.credit += believed - actual


@dataclass(frozen=True)
class _Option:
    choice: Choice
    expected: float  # tokens this choice yields per step, in expectation
    cost: float  # believed seconds of the step
    verify: float  # the verify pass's part of `cost`


class Controller:
    """Per-sequence face of `auto`: the choice rule over the engine's shared acceptance book."""

    def __init__(
        self, costs: Costs, k_max: int = 8, has_draft_model: bool = True, book: AcceptanceBook | None = None,
        explorer: Explorer | None = None, copy_k_max: int | None = None, lookup_min: int = 0,
    ) -> None:
        self.costs = costs
        self.k_max = k_max
        # Lookup's own cap: a copy accepted whole pays more the longer it is, since a batch of 33-64
        # rows costs less per row than one of 17 (CPU matmuls switch to their batched kernels).
        self.copy_k_max = k_max if copy_k_max is None else copy_k_max
        self.has_draft_model = has_draft_model
        # The shortest prompt-lookup match this request drafts from. With a prediction the scheduler sets
        # it to lookup's longest (a full match): the prompt holds the file the prediction is, so a shorter
        # match is mostly that file again where the prediction's realignment refused it (a short phrase far
        # from where the output stands); on the bench's large change such copies kept 0-4 of 15 tokens. A
        # full match is the surer copy (an instruction quoted, code the prediction lacks). Replayed over
        # the bench's answers (scripts/replay_auto.py) on three learned curves, auto+prediction's median
        # rose on both suites (1-5%) and its worst task rose or held.
        self.lookup_min = lookup_min
        self.book = book if book is not None else AcceptanceBook(decay=1.0)
        self.explorer = explorer if explorer is not None else Explorer(budget=0.0)
        self.why_not: str = ""  # why the last plain step did not draft, in the cost model's terms
        # The prediction's acceptance is this request's alone: one client's prediction of one
        # answer says nothing about the next request's.
        self.prediction = Acceptance(prior=PREDICTION_PRIOR, decay=self.book.decay, copy_prior=True)
        self.prediction_net = 0.0  # single steps the prediction's drafts saved so far (below 0: lost)
        # Lost PREDICTION_STOP_LOSS: not drafted until the output follows it. The streak when it stopped
        # (None: not stopped), so that only tokens followed since then count towards resuming.
        self.prediction_stopped_at: int | None = None
        # This request's own evidence per book entry ("draft", or a lookup bucket), revising the book's.
        self.own: dict[str | int, Acceptance] = {}
        # How long a copy this request may draft now, per lookup book entry (see `copy_cap`).
        self.copy_caps: dict[int, int] = {}
        self.parted = False  # the answer left its earlier one at a copy's verify (see REALIGNED_BUCKET)
        # The explored step awaiting its outcome: (its believed cost, the best option's rate, the
        # believed loss it spent).
        self._exploring: tuple[float, float, float] | None = None
        self._level_checked = costs.passes  # the learned passes when this request last took a plain step for the level

    @property
    def draft(self) -> Acceptance:
        return self.book.draft

    @draft.setter
    def draft(self, value: Acceptance) -> None:
        self.book.draft = value

    @property
    def lookup(self) -> dict[int, Acceptance]:
        return self.book.lookup

    def options(self, draft_lag: int, lookup_match: int, lookup_available: int, k_cap: int,
                context: int | None = None, *, prediction_available: int = 0, prediction_odds: Sequence[float] = (),
                lookup_earlier: bool = False, lookup_repeat: bool = False, lookup_odds: Sequence[float] = (),
                hopeful: bool = False) -> list[_Option]:
        """Every (drafter, k) worth weighing, plain decoding first. Runs every step: kept to plain
        arithmetic over the cost curve's level and shape (~0.3% of a 30 ms step on this CPU).
        `hopeful`: each drafter's acceptance at its upper bound, for the explorer (see `hopeful_rates`)."""
        c = self.costs
        level = c.level_at(c.calibration_context if context is None else context)
        out = [_Option(Choice("off", 0, 1.0 / level), 1.0, level, level)]
        k_top = min(self.k_max, k_cap)
        drafters: list[tuple[str, list[float], float, float]] = []  # name, rates, fixed cost, per-k cost
        if self.has_draft_model:
            rates = self.draft.planned(k_top, self.own.get("draft"), hopeful=hopeful)
            drafters.append(("draft", rates, c.catch_up(draft_lag), c.draft_step))
        if prediction_available > 0:  # like lookup, free to propose: the verify is the whole cost
            # Its own cap (prediction_k_max, applied by the caller): copies pay past auto's k_max.
            # Weighed before lookup, so that on a tie (both copying the same file) the client's
            # prediction drafts and its usage counts what it was worth.
            # Each position's rate times the chance the output follows that token (an edit that recurs):
            # on a steep verify curve the draft then stops before it, on a flat one it drafts through.
            rates = self.prediction.planned(prediction_available, None, hopeful=hopeful)
            rates = [r * (prediction_odds[i] if i < len(prediction_odds) else 1.0) for i, r in enumerate(rates)]
            drafters.append(("prediction", rates, 0.0, 0.0))
        if lookup_match > 0:
            bucket = self._bucket(lookup_match, lookup_earlier, lookup_repeat)
            book = self.book.entry(bucket)
            n = self.before_near_tie(min(self.copy_cap(bucket), k_cap, lookup_available), lookup_odds)
            rates = book.planned(n, self.own.get(bucket), hopeful=hopeful)
            # A copy of an earlier answer through its near-ties, as the prediction's odds: the draft stops
            # before one where the tokens past it would cost more than they are likely to give.
            rates = [r * (lookup_odds[i] if i < len(lookup_odds) else 1.0) for i, r in enumerate(rates)]
            drafters.append(("lookup", rates, 0.0, 0.0))
        for name, rates, fixed, per_k in drafters:
            expected, survive = 1.0, 1.0  # E[tokens | k] built up one position at a time
            for k, a in enumerate(rates, start=1):
                survive *= a
                expected += survive
                verify = level * c.shape_at(k + 1)
                cost = fixed + k * per_k + verify
                out.append(_Option(Choice(name, k, expected / cost), expected, cost, verify))
        return out

    def choose(self, draft_lag: int, lookup_match: int, lookup_available: int, k_cap: int, *,
               context: int | None = None, explore: bool = True, prediction_available: int = 0,
               prediction_cap: int | None = None, prediction_odds: Sequence[float] = (), lookup_earlier: bool = False,
               lookup_repeat: bool = False, lookup_odds: Sequence[float] = (),
               prediction_streak: int = 0) -> Choice:
        """Pick the best (drafter, k); now and then, within the explorer's budget, a hopeful other.

        draft_lag: tokens the draft model must catch up before it can draft;
        lookup_match: n-gram length of the prompt-lookup match (0 = none);
        lookup_available: how many tokens the lookup match could propose;
        lookup_earlier: the match is in an earlier request of the same owner, not in this sequence;
        lookup_repeat: the match is in the answer so far, not in the prompt (see REPEAT_BUCKETS);
        k_cap: the most tokens worth drafting (max_tokens and context left);
        context: the sequence's KV length, which the verify cost grows with;
        explore: False for a look that takes no step (it must not spend the budget);
        prediction_available: how many of the prediction's tokens could be proposed (0 = none),
        at most prediction_cap of them (default k_cap): a prediction drafts past auto's k_max;
        prediction_odds: per proposed token, the chance the output follows it (`Prediction.follow_odds`;
        missing: 1);
        prediction_streak: output tokens in a row that followed the prediction (see PREDICTION_RESUME);
        lookup_odds: per proposed lookup token, the chance the target picks it again (`Draft.odds`; missing: 1).
        """
        cap = k_cap if prediction_cap is None else prediction_cap
        ignored = 0 < lookup_match < self.lookup_min and not lookup_earlier
        if ignored:
            lookup_match = lookup_available = 0
        if self.prediction_stopped_at is not None and not (explore and self._resume(prediction_streak)):
            prediction_available = 0
        options = self.options(draft_lag, lookup_match, lookup_available, k_cap, context,
                               prediction_available=min(prediction_available, cap), prediction_odds=prediction_odds,
                               lookup_earlier=lookup_earlier, lookup_repeat=lookup_repeat, lookup_odds=lookup_odds)
        best = max(options, key=lambda o: o.choice.expected_rate)
        if not explore:
            return best.choice
        if best.choice.drafter != "off" and self._level_check_due():
            self._level_checked = self.costs.passes
            self.why_not = f"a plain step measures the single-step cost (no pass was plain for {self.costs.plain_ago})"
            return options[0].choice
        self.explorer.earn(best.cost)
        # Plain decoding is never explored: every plain step measures it, so there is nothing to learn,
        # and "exploring" it where a draft is best only stopped the draft (trace of a 347-token edit:
        # lookup proposed at matches of 2-16 tokens 120 times and drafted none of them).
        # Nor are copies past k_max: a long copy is taken on belief alone, since a wrong one costs
        # ~20 single steps on a CPU (explored 39- and 46-token copies kept 8 and 16 on a rewrite).
        others = [o for o in options if 0 < o.choice.k <= self.k_max and o is not best]
        if best.choice.drafter == "off":
            self.why_not = _why_not(options, self.costs, context)
            if self.prediction_stopped_at is not None:
                self.why_not += "; the prediction stopped after its drafts lost more than they gave"
            if ignored:
                self.why_not += f"; lookup copies only {self.lookup_min}-token matches beside a prediction"
        losses = {(o.choice.drafter, o.choice.k): max(o.cost - o.expected / best.choice.expected_rate, 0.0)
                  for o in others}
        affordable = [o for o in others if losses[o.choice.drafter, o.choice.k] <= self.explorer.credit]
        if not affordable:
            return best.choice  # nothing affordable (plain steps where no draft is near paying): no optimism computed
        # The most hopeful affordable option: its acceptance at the upper bound, its verify read
        # optimistically where few passes were seen. Among the affordable ones, so that a long draft
        # that may pay (a copy never tried) is approached through shorter ones while credit is low.
        c = self.costs
        upper = {(o.choice.drafter, o.choice.k): o.expected
                 for o in self.options(draft_lag, lookup_match, lookup_available, k_cap, context,
                                       prediction_available=min(prediction_available, cap),
                                       prediction_odds=prediction_odds, lookup_earlier=lookup_earlier,
                                       lookup_repeat=lookup_repeat, lookup_odds=lookup_odds, hopeful=True)}
        hopes = [upper[o.choice.drafter, o.choice.k] / (o.cost - o.verify * (1.0 - c.hope(o.choice.k + 1)))
                 for o in affordable]
        i = max(range(len(affordable)), key=hopes.__getitem__)
        hopeful = affordable[i]
        loss = losses[hopeful.choice.drafter, hopeful.choice.k]
        # Only a hope that beats the best's rate can be a wrong belief worth paying to correct.
        if hopes[i] > best.choice.expected_rate and self.explorer.spend(loss):
            self._exploring = (hopeful.cost, best.choice.expected_rate, loss)
            return Choice(hopeful.choice.drafter, hopeful.choice.k, hopeful.choice.expected_rate, explored=True)
        return best.choice

    def _level_check_due(self) -> bool:
        """Whether this step is plain to measure the level (see LEVEL_CHECK). Once per so many passes per
        request: beside other requests' rows a plain step is no single-row pass, and must not stop drafting."""
        c = self.costs
        every = LEVEL_RECHECK if abs(c.plain_error) > LEVEL_TOLERANCE else LEVEL_CHECK
        return not c.pinned and c.plain_ago >= every and c.passes - self._level_checked >= every

    def _resume(self, streak: int) -> bool:
        """Whether a stopped prediction drafts again: the output has followed it PREDICTION_RESUME tokens
        in a row since it stopped (a streak shorter than the one it stopped at was broken, and counts
        from 0). It starts over as the client's claim, its own evidence and net cleared."""
        at = self.prediction_stopped_at
        if at is None or at == _STOPPING:  # the first look since it stopped: count from here
            self.prediction_stopped_at = streak
            return False
        if streak < at:
            self.prediction_stopped_at = at = 0
        if streak - at < PREDICTION_RESUME:
            return False
        self.prediction = Acceptance(prior=PREDICTION_PRIOR, decay=self.book.decay, copy_prior=True)
        self.prediction_net, self.prediction_stopped_at = 0.0, None
        return True

    def before_near_tie(self, n: int, odds: Sequence[float]) -> int:
        """How many of a copy's n tokens to weigh, given each one's odds of being picked again (`Draft.odds`):
        up to the first near-tie where stopping before it is expected to cost less than drafting through.

        Weighed one pass at a time, a long copy runs on through a coin flip (on a CPU's curve its later rows
        cost less than a plain step each, even at 50%), but if the answers agree there the next pass copies
        the rest as cheaply, and if they part every row past it is lost: a second ask's 48-token copy kept
        2 (~20 single steps, 0.81x `off`). So the copy stops before token j when verify(j + 1) and the rest
        copied next time (at the whole copy's cost per row, if the answers agree) cost less than the whole
        copy (the next pass copies on, so the rest costs what a long copy's row does, while the answer goes
        on). For a 48-token copy on the curves the twelfth goals runs learned: from a 3% chance of parting at
        the first token, 6% at the third and 19-34% at the eleventh."""
        whole = self.costs.steps(n + 1)
        for j, agree in enumerate(odds[:n]):
            if agree < 1.0 and self.costs.steps(j + 1) + agree * (n - j) * whole / (n + 1) < whole:
                return j
        return n

    def copy_cap(self, bucket: int) -> int:
        """The longest copy this request may draft from a lookup book entry now. Past k_max a copy
        starts slowly: one wrong from its first token costs its whole verify, ~20 single steps for 48
        rows on a CPU, 8% of a 256-token answer, and bench first asks drafted 1-9 such copies from
        related text and kept 0-5 of each. So a request copies k_max tokens first, twice as many after
        each copy kept whole, and k_max again after a miss. The same question asked again starts at
        copy_k_max, since its first answer is the belief; after the answers part it restarts too (a
        second ask drafted four 48-token copies of its first answer after they parted, and kept 2)."""
        start = self.copy_k_max if bucket == EARLIER_BUCKET else min(self.k_max, self.copy_k_max)
        return self.copy_caps.get(bucket, start)

    def observe(self, choice: Choice, drafted: int, accepted: int, lookup_match: int = 0, *,
                lookup_earlier: bool = False, lookup_repeat: bool = False, ahead: bool | None = None) -> None:
        """A verify's outcome. `ahead`, for a copy or a prediction kept whole: whether the target's bonus token
        is its next token, which is what drafting one more would have shown (None: unknown, or not whole).
        Without it a request's one rejection at a position stays its evidence there for good: the k that
        stops before it is never passed again (a first ask copying its prompt drafted 2 tokens at 16-token
        matches 50 times in a row, each kept whole, after one 14-token copy kept 2)."""
        if choice.explored and self._exploring is not None:
            cost, best_rate, believed = self._exploring
            self.explorer.settle(believed, max(cost - (accepted + 1) / best_rate, 0.0))
            self._exploring = None
        if choice.drafter == "draft" and drafted:
            self.draft.observe(drafted, accepted)
            self._own("draft", drafted, accepted)
        elif choice.drafter == "lookup" and drafted:
            bucket = self._bucket(lookup_match, lookup_earlier, lookup_repeat)
            whole = accepted >= drafted
            seen, kept = _past_whole(drafted, accepted, ahead)
            self.book.entry(bucket).observe(seen, kept)
            self._own(bucket, seen, kept)
            cap = self.copy_cap(bucket)
            self.copy_caps[bucket] = min(self.copy_k_max, max(cap, 2 * drafted)) if whole else min(cap, self.k_max)
            # Parted: a copy of the earlier answer rejected, or kept whole with the target's next token not its.
            self.parted = self.parted or (lookup_earlier and (not whole or ahead is False))
        elif not drafted and lookup_earlier and ahead is False:  # a plain step where the copy would have gone on
            self.parted = True
        elif choice.drafter == "prediction" and drafted:
            # As a copy's: a rename's first draft fails at the edit (position 4, say); without the bonus
            # token every later draft stopped at 3 tokens and no draft reached position 4 to learn otherwise.
            self.prediction.observe(*_past_whole(drafted, accepted, ahead))
            net = self.prediction_net + accepted + 1 - self.costs.steps(drafted + 1)
            self.prediction_net = min(net, PREDICTION_CREDIT)
            if net < -PREDICTION_STOP_LOSS:
                self.prediction_stopped_at = _STOPPING

    def _bucket(self, lookup_match: int, earlier: bool, repeat: bool) -> int:
        """The book entry a lookup match plans with and teaches (after a part, see REALIGNED_BUCKET)."""
        return match_bucket(lookup_match, earlier=earlier, parted=self.parted, repeat=repeat)

    def _own(self, entry: str | int, drafted: int, accepted: int) -> None:
        self.own.setdefault(entry, Acceptance(decay=self.book.decay)).observe(drafted, accepted)


def _past_whole(drafted: int, accepted: int, ahead: bool | None) -> tuple[int, int]:
    """(positions seen, positions kept) of a verify: a draft kept whole whose next token is known (`ahead`)
    saw one position more, kept if the target's bonus token is that token."""
    if accepted >= drafted and ahead is not None:
        return drafted + 1, accepted + int(ahead)
    return drafted, accepted


def _why_not(options: list[_Option], costs: Costs, context: int | None) -> str:
    """Why plain decoding won, as the best drafting option's numbers: "lookup k=4: verify(5) =
    3.1 steps for 2.2 tokens expected, 0.71x"."""
    drafting = [o for o in options if o.choice.k > 0]
    if not drafting:
        return "nothing to draft from (no draft model, no lookup match, no prediction to follow)"
    o = max(drafting, key=lambda o: o.choice.expected_rate)
    ratio = o.choice.expected_rate / options[0].choice.expected_rate
    # The draft model's own steps (catching up, then k draft decodes) count in the ratio: say so.
    drafting_steps = (o.cost - o.verify) / options[0].cost
    extra = f" + drafting {drafting_steps:.1f}" if drafting_steps >= 0.05 else ""
    return (f"{o.choice.drafter} k={o.choice.k}: verify({o.choice.k + 1}) = {costs.steps(o.choice.k + 1, context):.1f}"
            f" steps{extra} for {o.expected:.1f} tokens expected, {ratio:.2f}x")
