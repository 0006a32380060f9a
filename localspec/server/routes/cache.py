"""The semantic cache's routes: its statistics, and a client's "that cached answer was wrong"."""

from __future__ import annotations

import asyncio
import hmac
import re
from typing import Any

from fastapi import APIRouter

from localspec.server.errors import ERROR_RESPONSES, APIError
from localspec.server.redact import redact_paths
from localspec.server.schemas import CacheVerdict, CacheVerdictRequest
from localspec.server.state import Principal, State

router = APIRouter()


@router.post("/v1/cache/{entry_id}/wrong", response_model=CacheVerdict, responses=ERROR_RESPONSES)
async def mark_cached_wrong(entry_id: str, body: CacheVerdictRequest, state: State, who: Principal) -> CacheVerdict:
    """The answer served from this cache entry was wrong: evict it and count a false hit. Only the
    client the answer was served to can: it sends the `verdict_token` from that response."""
    if not re.fullmatch(r"[0-9a-f]{32}", entry_id):
        raise APIError(400, "entry_id is the 32-hex-digit id from a response's localspec.cache.entry_id.",
                       "invalid_value", "entry_id")
    # The cache lives with the profile's models: after an unload (keep-alive, stop) they load again,
    # as for any request, and stay held while the entry is evicted.
    async with state.holding() as (b, _):
        cache = b.pipeline.cache
        if cache is None or not hmac.compare_digest(cache.verdict_token(entry_id, who), body.token):
            raise APIError(403, "This token does not mark that entry: send the verdict_token from the response "
                           "that served it (localspec.cache.verdict_token), with the same API key.",
                           "invalid_token", "token")
        if not await asyncio.to_thread(b.pipeline.mark_wrong, entry_id):
            raise APIError(404, f"No cache entry {entry_id} (already evicted or expired).", "not_found", "entry_id")
    return CacheVerdict(entry_id=entry_id, evicted=True)


@router.get("/v1/cache/stats", response_model=dict, responses=ERROR_RESPONSES)
async def cache_stats(state: State) -> dict[str, Any]:
    async with state.holding() as (b, _):  # loaded again after an unload, as for mark-wrong
        cache = b.pipeline.cache
        if cache is None:
            return {"mode": "off", "detail": "started with --no-cache"}
        stats = {k: v for k, v in (await asyncio.to_thread(cache.stats)).items() if k != "directory"}
    return {"mode": cache.mode, "detail": redact_paths(cache.describe()), "judge": b.pipeline.semantic_judge,
            **stats, "description": redact_paths(str(stats.get("description", "")))}
