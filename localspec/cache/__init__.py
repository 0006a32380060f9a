"""Local semantic cache: answers repeated and near-duplicate prompts without generating.

Scoped (model, system prompt, earlier turns, sampling, tools), guarded against false hits, and
stored as JSON only. The request pipeline uses:

    cache = SemanticCache(embedder=Embedder(path))     # embedder=None: exact-match mode
    scope = CacheScope.from_request(model_hash=..., system_prompt=..., earlier_turns=[...],
                                    sampling={...}, has_tools=False, has_response_format=False)
    if cacheable(sampling):
        hit = cache.lookup(scope, prompt)               # CacheHit | None, never raises
        ...
        cache.store(scope, prompt, answer, token_ids, stats)
"""

from localspec.cache.guard import compare as guard_compare
from localspec.cache.normalize import normalize_prompt
from localspec.cache.policy import cacheable
from localspec.cache.scope import CacheScope
from localspec.cache.semantic import DEFAULT_THRESHOLD, SCHEMA_VERSION, CacheHit, Probe, SemanticCache

__all__ = [
    "DEFAULT_THRESHOLD", "SCHEMA_VERSION", "CacheHit", "CacheScope", "Probe", "SemanticCache", "cacheable",
    "guard_compare", "normalize_prompt",
]
