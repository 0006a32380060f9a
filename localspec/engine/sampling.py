"""Sampling parameters, and the one function that turns logits into the distribution we sample.

Speculative sampling is exact only if the target's p and the draft's q are shaped by the same
rules, so both go through `distribution()`. Penalties depend on the history, so every row is
processed with the history up to that row.

Order of operations (the Hugging Face / OpenAI order, not llama.cpp's): penalties, temperature,
top-k, top-p, min-p. temperature == 0 means greedy: the argmax of the penalised logits.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

_SORT_WINDOW = 2048  # candidates sorted first for top-p; the full sort runs only if they fall short


class SamplingParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float = Field(0.0, ge=0.0, le=5.0, description="0 = greedy")
    top_k: int = Field(0, ge=0, description="0 = off")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repeat_penalty: float = Field(1.0, gt=0.0, le=10.0, description="llama.cpp style, 1 = off")
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    penalty_last_n: int = Field(64, ge=0, description="history window the penalties look at")
    seed: int | None = Field(None, ge=0, description="None = a fresh random seed per request")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0


def with_fallbacks(params: SamplingParams, **fallbacks: float | int | None) -> SamplingParams:
    """`params` with a face's own defaults (the API's temperature 1.0) for the fields it does not set.

    The fallbacks do not count as set (`model_fields_set`), so a model's settings still override
    them (RequestDefaults.apply): request > model settings > face fallback > built-in default."""
    unset = {k: v for k, v in fallbacks.items() if k not in params.model_fields_set}
    SamplingParams.model_validate(unset)  # a bad fallback is a bug: fail loudly here
    return SamplingParams.model_construct(set(params.model_fields_set), **{**params.model_dump(), **unset})


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def penalize(logits: np.ndarray, params: SamplingParams, history: Sequence[int]) -> np.ndarray:
    """Apply repetition, frequency and presence penalties over the last `penalty_last_n` tokens."""
    if not params.has_penalties or params.penalty_last_n == 0 or not history:
        return logits
    window = history[-params.penalty_last_n :]
    counts = Counter(t for t in window if 0 <= t < logits.shape[0])
    if not counts:
        return logits
    out = logits.astype(np.float32, copy=True)
    ids = np.fromiter(counts.keys(), dtype=np.int64)
    n = np.fromiter(counts.values(), dtype=np.float32)
    z: np.ndarray = out[ids].astype(np.float64)
    if params.repeat_penalty != 1.0:
        z = np.where(z > 0, z / params.repeat_penalty, z * params.repeat_penalty)
    z = z - n * params.frequency_penalty - params.presence_penalty
    # A tiny penalty (1e-300 is > 0) makes logits past float32's range: stored, they were ±inf, and
    # inf - inf is the NaN that poisoned the whole distribution. They are the largest finite ones.
    out[ids] = np.clip(z, -_FLOAT32_MAX, _FLOAT32_MAX)
    return out


def greedy_token(logits: np.ndarray, params: SamplingParams, history: Sequence[int]) -> int:
    return int(np.argmax(penalize(logits, params, history)))


def distribution(
    logits: np.ndarray, params: SamplingParams, history: Sequence[int], n_vocab: int | None = None
) -> np.ndarray:
    """The probability vector to sample from, float64, length `n_vocab` (zero-padded).

    A draft whose vocabulary is a little smaller than the target's (Qwen 0.5B vs 7B) is padded
    with zeros, so p and q live on the same token ids.
    """
    z = penalize(logits, params, history).astype(np.float64)
    if params.greedy:
        p = np.zeros(z.shape[0], dtype=np.float64)
        p[int(np.argmax(z))] = 1.0
    else:
        with np.errstate(over="ignore"):
            scaled = z / params.temperature
            if not np.isfinite(scaled.max()):  # a temperature so small (1e-308) that z / T overflows: inf - inf
                scaled = (z - z.max()) / params.temperature  # was NaN everywhere; from the top, 0 or -inf
        z = scaled
        if 0 < params.top_k < z.shape[0]:
            cut = np.argpartition(-z, params.top_k - 1)[: params.top_k]
            keep = np.full(z.shape[0], -np.inf)
            keep[cut] = z[cut]
            z = keep
        z = z - np.max(z)
        p = np.exp(z)
        p /= p.sum()
        if params.top_p < 1.0:
            p = _top_p(p, params.top_p)
        if params.min_p > 0.0:
            p = np.where(p >= params.min_p * p.max(), p, 0.0)
            p /= p.sum()
    if n_vocab is not None and n_vocab > p.shape[0]:
        p = np.concatenate([p, np.zeros(n_vocab - p.shape[0])])
    return p


def _top_p(p: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose mass reaches top_p.

    Sorting 150k probabilities per row is slow, so the largest few thousand are sorted first;
    when they already reach top_p the answer is the same as a full sort.
    """
    if p.shape[0] > _SORT_WINDOW:
        cand = np.argpartition(-p, _SORT_WINDOW - 1)[:_SORT_WINDOW]
        order = cand[np.argsort(-p[cand], kind="stable")]
        if p[order].sum() < top_p:
            order = np.argsort(-p, kind="stable")
    else:
        order = np.argsort(-p, kind="stable")
    cum = np.cumsum(p[order])
    n_keep = int(np.searchsorted(cum, top_p) + 1)
    out = np.zeros_like(p)
    kept = order[:n_keep]
    out[kept] = p[kept]
    return out / out.sum()
