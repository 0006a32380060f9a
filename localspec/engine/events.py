"""What the engine emits while it generates. Faces render these; metrics read `Stats`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

Origin = Literal["draft", "target", "cache"]  # cache: replayed by the pipeline, not generated
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

    @property
    def tokens_per_second(self) -> float:
        # The first token belongs to prefill; decode speed counts the tokens after it.
        n = self.completion_tokens - 1
        return n / (self.decode_ms / 1000.0) if n > 0 and self.decode_ms > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per target forward pass during decoding, the bonus/correction token included."""
        n = self.completion_tokens - 1
        return n / self.target_passes if self.target_passes else 0.0

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


Event = Token | Done
