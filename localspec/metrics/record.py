"""One request as the metrics log stores it: a flat, typed row built from the engine's `Stats`."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from localspec.engine.events import Stats

FACES = ("tui", "api", "cli")


@dataclass
class RequestRecord:
    """Per-request figures; times in milliseconds unless the name says seconds."""

    face: str  # tui | api | cli
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    ts: float = field(default_factory=time.time)  # unix seconds when the request finished
    profile: str | None = None
    target_model: str | None = None
    draft_model: str | None = None
    target_hash: str | None = None  # sha256 of the model file, so a swapped file shows up in reports
    draft_hash: str | None = None
    route: str | None = None  # the router's decision (e.g. "target", "small", "cache")
    route_reason: str | None = None
    cache: str | None = None  # "hit" | "miss" | None when no cache ran
    cache_similarity: float | None = None
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens found already in the KV cache
    completion_tokens: int = 0
    prefill_ms: float = 0.0
    ttft_ms: float = 0.0
    decode_ms: float = 0.0
    decode_tps: float = 0.0
    e2e_ms: float | None = None
    compute_s: float = 0.0  # engine time spent on this request: the basis of local cost
    spec_mode: str = "off"
    drafted: int = 0
    accepted: int = 0
    target_passes: int = 0
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    mean_accepted_length: float = 0.0
    # Predicted Outputs: the prediction's length in tokens (0: the request had none), its tokens sent
    # to verification, and of those the kept and the rejected ones (also counted in drafted/accepted).
    prediction_tokens: int = 0
    prediction_drafted: int = 0
    prediction_accepted: int = 0
    prediction_rejected: int = 0
    finish_reason: str | None = None
    error_class: str | None = None
    prompt_text: str | None = None  # kept only when the store_prompts setting is on

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @classmethod
    def from_stats(
        cls,
        stats: Stats,
        *,
        face: str,
        profile: str | None = None,
        target_model: str | None = None,
        draft_model: str | None = None,
        finish_reason: str | None = None,
        e2e_ms: float | None = None,
        request_id: str | None = None,
        route: str | None = None,
        route_reason: str | None = None,
        cache: str | None = None,
        cache_similarity: float | None = None,
        error_class: str | None = None,
        prompt_text: str | None = None,
        model_hashes: dict[str, str] | None = None,
    ) -> RequestRecord:
        """`model_hashes` maps "target"/"draft" (or the model ids) to file sha256 digests."""
        if face not in FACES:
            raise ValueError(f"face must be one of {FACES}, not {face!r}")
        hashes = model_hashes or {}
        engine_s = (stats.prefill_ms + stats.decode_ms) / 1000.0
        # A cache hit never reaches the engine; its cost is the wall time of the lookup.
        compute_s = engine_s if engine_s > 0 else (e2e_ms or 0.0) / 1000.0
        rec = cls(
            face=face,
            profile=profile,
            target_model=target_model,
            draft_model=draft_model,
            target_hash=hashes.get("target") or (hashes.get(target_model) if target_model else None),
            draft_hash=hashes.get("draft") or (hashes.get(draft_model) if draft_model else None),
            route=route,
            route_reason=route_reason,
            cache=cache,
            cache_similarity=cache_similarity,
            prompt_tokens=stats.prompt_tokens,
            reused_tokens=stats.reused_prefix_tokens,
            completion_tokens=stats.completion_tokens,
            prefill_ms=stats.prefill_ms,
            ttft_ms=stats.ttft_ms,
            decode_ms=stats.decode_ms,
            decode_tps=stats.tokens_per_second,
            e2e_ms=e2e_ms,
            compute_s=compute_s,
            spec_mode=stats.mode,
            drafted=stats.drafted,
            accepted=stats.accepted,
            target_passes=stats.target_passes,
            drafted_by_position=list(stats.drafted_by_position),
            accepted_by_position=list(stats.accepted_by_position),
            mean_accepted_length=stats.mean_accepted_length,
            prediction_tokens=stats.prediction_tokens,
            prediction_drafted=stats.prediction_drafted,
            prediction_accepted=stats.prediction_accepted,
            prediction_rejected=stats.prediction_rejected,
            finish_reason=finish_reason,
            error_class=error_class,
            prompt_text=prompt_text,
        )
        if request_id:
            rec.request_id = request_id
        return rec

    def to_row(self) -> dict[str, Any]:
        """Column values for the `requests` table (position lists as JSON)."""
        row = asdict(self)
        row["drafted_by_position"] = json.dumps(self.drafted_by_position)
        row["accepted_by_position"] = json.dumps(self.accepted_by_position)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RequestRecord:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in row.items() if k in known}
        for key in ("drafted_by_position", "accepted_by_position"):
            raw = values.get(key)
            values[key] = json.loads(raw) if isinstance(raw, str) and raw else []
        for key, default in (("reused_tokens", 0), ("prefill_ms", 0.0), ("decode_ms", 0.0), ("compute_s", 0.0),
                             ("target_passes", 0), ("mean_accepted_length", 0.0), ("prediction_tokens", 0),
                             ("prediction_drafted", 0), ("prediction_accepted", 0), ("prediction_rejected", 0)):
            if values.get(key) is None:
                values[key] = default
        return cls(**values)


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(RequestRecord))
