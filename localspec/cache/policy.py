"""Which requests may be cached at all.

Only deterministic requests are cached: temperature 0 (greedy) or a fixed seed. A sampled answer
is one draw among many; serving it again would hide that.

`cacheable` looks at the *effective* sampling parameters, after the face applied its defaults.
localspec's default temperature is 0 (`SamplingParams`), so a request to the endpoint that omits
the temperature is greedy and cacheable, unlike OpenAI's API, whose default is 1. A client that
sends temperature 1 without a seed is not cached unless the user opts in (`opt_in=True`, e.g.
the endpoint's cache setting `cache_sampled = true`).
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
