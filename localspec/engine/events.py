"""What the engine emits while it generates. Faces render these; metrics read `Stats`."""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Literal

# Where a token came from: "draft", a drafter's (draft model or prompt lookup) proposal the target
# accepted; "prediction", a token of the request's prediction (Predicted Outputs) the target accepted;
# "target", the target's own choice; "cache", replayed by the pipeline, not generated.
Origin = Literal["draft", "prediction", "target", "cache"]
ORIGINS: tuple[Origin, ...] = ("draft", "prediction", "target", "cache")
FinishReason = Literal["stop", "length", "cancelled", "error"]


@dataclass
class Stats:
    """Per-request figures; times in milliseconds."""

    mode: str = "off"
    prompt_tokens: int = 0
    reused_prefix_tokens: int = 0  # prompt tokens found already in the KV cache
    prefill_ms: float = 0.0
    ttft_ms: float = 0.0  # submit to first token
    completion_tokens: int = 0
    decode_ms: float = 0.0  # first token to last
    target_passes: int = 0  # target forward passes after the first token
    drafted: int = 0
    accepted: int = 0
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    # Mode auto: the steps each choice took ("off", "lookup", "draft"), how many of them explored,
    # and why the last plain step did not draft.
    # Predicted Outputs: the prediction's length in tokens, how many of them were drafted (sent to
    # verification) and how many of those the output kept. Part of `drafted` / `accepted` too.
    prediction_tokens: int = 0
    prediction_drafted: int = 0
    prediction_accepted: int = 0
    # Greedy tokens the output took from the same question's earlier answer at a near-tie (verify.TIE_MARGIN).
    near_ties_settled: int = 0
    auto_steps: dict[str, int] = field(default_factory=dict)
    explored: int = 0
    auto_why_not: str = ""

    @property
    def tokens_per_second(self) -> float:
        # The first token belongs to prefill; decode speed counts the tokens after it.
        n = self.completion_tokens - 1
        return n / (self.decode_ms / 1000.0) if n > 0 and self.decode_ms > 0 else 0.0

    @property
    def prediction_rejected(self) -> int:
        """Prediction tokens verified and not kept: the work a wrong prediction cost. Tokens the
        cursor skipped (a part the edit deleted) were never drafted and count in neither figure."""
        return self.prediction_drafted - self.prediction_accepted

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per target forward pass during decoding, the bonus/correction token included."""
        n = self.completion_tokens - 1
        return n / self.target_passes if self.target_passes else 0.0

    def record_choice(self, drafter: str, *, explored: bool, why_not: str) -> None:
        self.auto_steps[drafter] = self.auto_steps.get(drafter, 0) + 1
        self.explored += explored
        if drafter == "off":
            self.auto_why_not = why_not

    def auto_summary(self) -> str:
        """What `auto` chose, for `generate`'s summary: "auto chose lookup 40, off 12 steps (3 to
        explore); not drafting because lookup k=4: verify(5) = 3.1 steps for 2.2 tokens expected, 0.71x"."""
        if not self.auto_steps:
            return ""
        chose = ", ".join(f"{d} {n}" for d, n in sorted(self.auto_steps.items(), key=lambda kv: -kv[1]))
        out = f"auto chose {chose} steps" + (f" ({self.explored} to explore)" if self.explored else "")
        return out + (f"; not drafting because {self.auto_why_not}" if self.auto_why_not else "")

    def record_position(self, drafted: int, accepted: int) -> None:
        while len(self.drafted_by_position) < drafted:
            self.drafted_by_position.append(0)
            self.accepted_by_position.append(0)
        for i in range(drafted):
            self.drafted_by_position[i] += 1
            if i < accepted:
                self.accepted_by_position[i] += 1

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            tokens_per_second=round(self.tokens_per_second, 3),
            acceptance_rate=round(self.acceptance_rate, 4),
            mean_accepted_length=round(self.mean_accepted_length, 3),
            prediction_rejected=self.prediction_rejected,
        )
        return d


@dataclass(frozen=True)
class TokenLogprob:
    """The target model's log-probability of an emitted token, and its most likely alternatives.

    From the raw logits (log-softmax before penalties, temperature and truncation), like OpenAI's.
    """

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Token:
    """One generated token. `text` is what became certain with it (may be empty while held)."""

    text: str
    ids: tuple[int, ...]
    origin: Origin
    logprob: TokenLogprob | None = None  # only when the request asked for logprobs


@dataclass(frozen=True)
class Done:
    finish_reason: FinishReason
    stats: Stats
    text: str  # the whole answer
    error: str | None = None
    stop_sequence: str | None = None  # the client's stop string that ended it ("stop"; None: an end token)


Event = Token | Done


@dataclass(frozen=True)
class Generated:
    """One request's stream, folded: its Done and the answer's tokens as streamed."""

    done: Done
    ids: tuple[int, ...]


def collect(events: Iterable[Event]) -> Generated:
    done: Done | None = None
    ids: list[int] = []
    for ev in events:
        if isinstance(ev, Done):
            done = ev
        else:
            ids.extend(ev.ids)
    if done is None:
        raise RuntimeError("the engine's stream ended without a Done event")
    return Generated(done, tuple(ids))


# ---------------------------------------------------------------------- loading


class LoadStage(enum.Enum):
    """The set-up work before the first reply."""

    LOAD_MODEL = "load model"  # llama.cpp reading one model's weights
    CALIBRATE = "calibrate"  # the one-time measurement of verify and draft costs (mode auto)


@dataclass(frozen=True)
class LoadProgress:
    """How far one stage has come: `fraction` 0..1, `elapsed_s` since the stage began."""

    stage: LoadStage
    model: str  # the model file's name without .gguf (the store names files by model id)
    fraction: float
    elapsed_s: float

    @property
    def finished(self) -> bool:
        return self.fraction >= 1.0


ProgressFn = Callable[[LoadProgress], None]

_MIN_STEP = 0.01  # a fraction moves at least this much between reports (llama.cpp reports per tensor)


class StageReporter:
    """Reports one stage to a face's callback: timed from the stage's start, throttled, never raising.

    llama.cpp calls its progress callback from inside the model load; an exception there would
    abort the load, so a failing face callback is logged once and ignored.
    """

    def __init__(self, on_progress: ProgressFn | None, stage: LoadStage, model: str,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._on_progress = on_progress
        self.stage = stage
        self.model = model
        self._clock = clock
        self._started = clock()
        self._last = -1.0
        self._failed = False

    def report(self, fraction: float) -> None:
        if self._on_progress is None or self._failed:
            return
        fraction = min(max(float(fraction), 0.0), 1.0)
        if fraction < 1.0 and fraction - self._last < _MIN_STEP:
            return
        if fraction >= 1.0 and self._last >= 1.0:
            return  # the end is reported once
        self._last = fraction
        try:
            self._on_progress(LoadProgress(self.stage, self.model, fraction, self._clock() - self._started))
        except Exception:
            self._failed = True
            logging.getLogger(__name__).exception("a load-progress callback failed; no more progress is shown")
