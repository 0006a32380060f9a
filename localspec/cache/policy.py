"""Which requests may be cached at all.

Only deterministic requests are cached: temperature 0 (greedy) or a fixed seed. A sampled answer
is one draw among many; serving it again would hide that.

`cacheable` looks at the *effective* sampling parameters, after the face applied its defaults.
The endpoint follows OpenAI: a request that omits `temperature` samples at 1, so without a `seed`
it is not cached. Send `temperature: 0` (greedy) or a `seed` to be cached, or opt in to caching
sampled answers (`opt_in=True`: `localspec serve --cache-sampled`). The CLI and the chat app set
their own temperatures (0 for `generate`, the chat's setting in the TUI).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def cacheable(sampling: Mapping[str, Any] | Any | None, opt_in: bool = False) -> bool:
    if opt_in:
        return True
    if sampling is None:
        return True  # all defaults: greedy
    if isinstance(sampling, Mapping):
        temperature, seed = sampling.get("temperature", 0.0), sampling.get("seed")
    else:
        temperature, seed = getattr(sampling, "temperature", 0.0), getattr(sampling, "seed", None)
    return (temperature or 0.0) == 0.0 or seed is not None


# How a semantic candidate is confirmed before it is served (docs/semantic-cache.md):
#   model:  the answering model reads both requests (cache.judge): the most accurate, a prefill or two;
#   scorer: the learned pair scorer over the embeddings (cache.scorer): milliseconds;
#   rules:  the guard's full rules and a similarity threshold alone.
CACHE_JUDGES = ("model", "scorer", "rules")


def cache_judge_kind(value: bool | str) -> str:
    """One of CACHE_JUDGES; True and False are the older on/off switch (the model, or rules alone)."""
    if isinstance(value, bool):
        return "model" if value else "rules"
    if value not in CACHE_JUDGES:
        raise ValueError(f"cache judge {value!r} is not one of {', '.join(CACHE_JUDGES)}")
    return value
