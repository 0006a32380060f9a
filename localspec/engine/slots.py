"""What the engine keeps per request and per sequence slot, and the caller's handle on a request."""

from __future__ import annotations

import logging
import math
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from localspec.engine.config import EngineConfig, GenerationRequest
from localspec.engine.controller import Choice, Controller
from localspec.engine.events import Done, Event, Stats, TokenLogprob
from localspec.engine.grammar import Grammar
from localspec.engine.prediction import Prediction
from localspec.engine.sampling import penalize
from localspec.engine.text import StopMatcher, Utf8Stream
from localspec.engine.verify import GREEDY, Draft, PickRule, PositionRng, Verdict

logger = logging.getLogger(__name__)

# Where a request's events go, called on the engine's thread. It must be quick and must not
# block: a face hands the event to its own loop (call_soon_threadsafe) or keeps it.
EventSink = Callable[[Event], None]


class Lane(StrEnum):
    """Which queue a request waits in. The cache's reuse judge asks one short question while a
    user waits on the answer: its requests are admitted before any queued generation."""

    GENERATION = "generation"
    JUDGE = "judge"


def top_gap(row: np.ndarray, token: int) -> float:
    """How far `token`'s logit is above the best other one (negative: it is not the argmax)."""
    others = max(row[:token].max(initial=-np.inf), row[token + 1 :].max(initial=-np.inf))
    return float(row[token] - others)


def token_logprob(row: np.ndarray, token: int, n_top: int) -> TokenLogprob:
    """Log-softmax of the raw logits: the model's own probabilities, as OpenAI reports them."""
    z = row.astype(np.float64)
    z = z - z.max()
    logp = z - np.log(np.exp(z).sum())
    top: tuple[tuple[int, float], ...] = ()
    if n_top > 0:
        ids = np.argpartition(-logp, n_top - 1)[:n_top]
        ids = ids[np.argsort(-logp[ids], kind="stable")]
        top = tuple((int(t), float(logp[t])) for t in ids)
    return TokenLogprob(token=int(token), logprob=float(logp[token]), top=top)


class Handle:
    """The caller's side of a submitted request: its events and a cancel switch.

    Events go to `sink` when one was given (on the engine's thread, as they happen), else to the
    `events` queue for a caller that reads them itself."""

    def __init__(self, request_id: int, *, sink: EventSink | None = None, lane: Lane = Lane.GENERATION,
                 grammar: Grammar | None = None, pin_len: int = 0, prediction: Prediction | None = None,
                 dropped_messages: int = 0) -> None:
        self.id = request_id
        self.lane = lane
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._sink = sink
        self._cancel = threading.Event()
        self.done = threading.Event()
        self.result: Done | None = None
        self.grammar = grammar  # compiled by submit; the engine thread owns it after
        self.pin_len = pin_len  # leading prompt tokens to keep pinned (GenerationRequest.pin_prefix)
        self.prediction = prediction  # the request's prediction, tokenized by submit
        self.dropped_messages = dropped_messages  # old turns left out to fit the context

    def deliver(self, event: Event) -> None:
        """Hand one event to the caller. A faulty sink is the face's bug: it never stops the engine."""
        if self._sink is None:
            self.events.put(event)
            return
        try:
            self._sink(event)
        except Exception:
            logger.exception("request %d: its event sink raised; the event is dropped", self.id)

    def finish(self, done: Done) -> None:
        """Deliver the request's last event; the engine calls this exactly once per request."""
        self.result = done
        self.deliver(done)
        self.done.set()

    def cancel(self) -> None:
        """Safe from any thread; the engine stops the request at its next step."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()


@dataclass(frozen=True)
class Pending:
    """A submitted request waiting for a slot."""

    handle: Handle
    request: GenerationRequest
    tokens: list[int]
    t_submit: float


@dataclass
class Slot:
    seq: int
    kv: list[int] = field(default_factory=list)  # tokens held in the target KV cache, in order
    active: Active | None = None

    @property
    def current(self) -> Active:
        """The request this slot runs; the step asks only slots that run one."""
        if self.active is None:
            raise RuntimeError(f"slot {self.seq} runs no request")
        return self.active


@dataclass
class Active:
    handle: Handle
    request: GenerationRequest
    tokens: list[int]  # prompt + generated so far
    n_prompt: int
    mode: str
    k: int
    rng: PositionRng
    stats: Stats
    t_submit: float
    t_admit: float = 0.0
    t_first: float = 0.0
    t_last: float = 0.0
    decoding: bool = False
    utf8: Utf8Stream = field(default_factory=Utf8Stream)
    stop: StopMatcher = field(default_factory=lambda: StopMatcher(()))
    text: list[str] = field(default_factory=list)
    grammar: Grammar | None = None
    controller: Controller | None = None  # mode auto only
    choice: Choice | None = None  # what auto chose for the step in flight
    proposal: Draft = Draft(())  # auto: the whole lookup proposal it weighed for the step in flight
    prediction: Prediction | None = None  # Predicted Outputs: drafted from while the output follows it
    # Per emitted token (an end of generation too), the top-two logit gap it was picked with (inf where
    # not a plain greedy pick): where a copy of this answer, asked again, may part from it.
    gaps: list[float] = field(default_factory=list)

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.n_prompt

    @property
    def prediction_streak(self) -> int:
        return self.prediction.streak if self.prediction is not None else 0

    @property
    def lookup_match(self) -> int:
        return self.proposal.match_length

    @property
    def lookup_earlier(self) -> bool:
        """The lookup match is in an earlier request of this owner with this prompt (LookupHistory)."""
        return self.proposal.source == "history"

    @property
    def lookup_repeat(self) -> bool:
        """The lookup match is in the answer so far, not in the prompt."""
        return self.proposal.source == "repeat"

    def ahead(self, d: Draft, verdict: Verdict) -> bool | None:
        """For a lookup or prediction draft kept whole: whether the target's next token is the proposal's
        (the prediction's) next one (None: another draft, not whole, or the proposal ends with it). Also for
        a plain step beside a copy of an earlier answer that was not drafted (a near-tie first): whether the
        answers still agree."""
        if d.source == "prediction":
            # The prediction's cursor is where this draft started until the next step follows the output.
            after = self.prediction.propose(len(d) + 1).tokens if self.prediction is not None else ()
            if verdict.accepted < len(d) or len(after) <= len(d) or after[: len(d)] != d.tokens:
                return None
            return after[len(d)] == verdict.next_token
        proposed = self.proposal.tokens
        if not d.tokens and self.proposal.source == "history" and proposed:
            return proposed[0] == verdict.next_token
        if d.source not in ("lookup", "repeat", "history") or verdict.accepted < len(d) or len(proposed) <= len(d):
            return None
        return proposed[len(d)] == verdict.next_token

    @property
    def pick_rule(self) -> PickRule | None:
        """How this request picks its tokens, as far as another's greedy picks can stand for its own (the
        lookup history's `rule`); None: sampled or under a grammar, whose picks settle no near-tie."""
        params = self.request.sampling
        if not params.greedy or self.grammar is not None:
            return None
        if not params.has_penalties:
            return GREEDY
        return PickRule(repeat_penalty=params.repeat_penalty, frequency_penalty=params.frequency_penalty,
                        presence_penalty=params.presence_penalty, penalty_last_n=params.penalty_last_n)

    def note_gap(self, row: np.ndarray | None, token: int) -> None:
        """Record the top-two logit gap `token` was picked with from `row` (see `gaps`)."""
        params = self.request.sampling
        if row is None or not params.greedy or self.grammar is not None:
            self.gaps.append(math.inf)
            return
        # The gap the pick was made with: of the penalised logits where the request has penalties.
        self.gaps.append(top_gap(penalize(row, params, self.tokens) if params.has_penalties else row, token))

    def prediction_odds(self, n: int) -> list[float]:
        """Per next prediction token, the chance the output follows it (`Prediction.follow_odds`)."""
        return self.prediction.follow_odds(n) if self.prediction is not None else []


@dataclass(frozen=True)
class Speculation:
    """How a request admitted now speculates: its mode, its k and whether its prediction drafts."""

    mode: str
    k: int
    use_prediction: bool
    copy_k: int  # auto: how far lookup may copy


def speculation(request: GenerationRequest, config: EngineConfig, *, calibrated: bool, sampled_grammar: bool,
                has_prediction: bool) -> Speculation:
    mode = request.mode or config.mode
    # A prediction drafts in every mode but an explicit off (and sampled grammars, which never speculate).
    use_prediction = mode != "off" and not sampled_grammar
    if mode == "auto" and not calibrated:
        mode = "off"  # not calibrated yet (engine was busy): plain decoding is never wrong
    k = request.k if request.k is not None else (
        config.draft_k if mode == "draft" else config.lookup_k if mode == "lookup"
        else config.auto_k_max if mode == "auto" else 0
    )
    if sampled_grammar:
        mode = "off"  # sampled grammar requests do not speculate yet (greedy ones do)
    # An explicit k caps every drafter. With a prediction, lookup copies no further than the
    # prediction may, so that on a tie (both copying the same file) the prediction drafts.
    copy_k = k if request.k is not None else config.prediction_k_max if has_prediction else config.copy_k_max
    return Speculation(mode, k if mode != "off" else 0, use_prediction, copy_k)
