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
