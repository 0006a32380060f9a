"""Aggregates over logged requests: the summary table, grouping, spend and time series."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from localspec.errors import RequestError
from localspec.metrics.settings import MetricsSettings

Row = dict[str, Any]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_period(text: str, now: float | None = None) -> float:
    """`7d`, `12h`, `30m`, `2w` (ago) or an ISO date/time -> unix seconds."""
    now = time.time() if now is None else now
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if m:
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    from datetime import datetime

    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError as exc:
        raise RequestError(f"Cannot read the period {text!r}.", "Use e.g. 7d, 24h, 30m, 2w or 2025-01-31.") from exc


def is_error(r: Row) -> bool:
    return r.get("finish_reason") == "error" or bool(r.get("error_class"))


def acceptance(rows: Iterable[Row]) -> tuple[float | None, int]:
    spec = [r for r in rows if (r.get("drafted") or 0) > 0]
    drafted = sum(r["drafted"] for r in spec)
    return (sum(r["accepted"] for r in spec) / drafted if drafted else None), len(spec)


def hit_rate(rows: Iterable[Row]) -> tuple[float | None, int]:
    looked = [r for r in rows if r.get("cache") in ("hit", "miss")]
    return (sum(r["cache"] == "hit" for r in looked) / len(looked) if looked else None), len(looked)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def tokens_per_second(rows: Iterable[Row]) -> tuple[float | None, int]:
    v = [r["decode_tps"] for r in rows if (r.get("decode_tps") or 0) > 0 and not is_error(r)]
    return _median(v), len(v)


def ttft_ms(rows: Iterable[Row]) -> tuple[float | None, int]:
    # A cache hit's "first token" is a lookup, not generation; it would hide a slower engine.
    v = [r["ttft_ms"] for r in rows if (r.get("ttft_ms") or 0) > 0 and r.get("cache") != "hit"]
    return _median(v), len(v)


@dataclass(frozen=True)
class Spend:
    compute_s: float
    local_cost: float | None  # None: no cost_per_hour set
    api_cost: float | None  # None: no reference price set
    savings: float | None


def spend(rows: Iterable[Row], settings: MetricsSettings) -> Spend:
    rows = list(rows)
    compute_s = sum(r.get("compute_s") or 0.0 for r in rows)
    local = compute_s / 3600 * settings.cost_per_hour if settings.cost_per_hour is not None else None
    api = None
    if settings.reference_price_per_mtok is not None:
        out_price = settings.reference_output_price_per_mtok
        if out_price is None:
            out_price = settings.reference_price_per_mtok
        prompt = sum(r.get("prompt_tokens") or 0 for r in rows)
        completion = sum(r.get("completion_tokens") or 0 for r in rows)
        api = (prompt * settings.reference_price_per_mtok + completion * out_price) / 1e6
    savings = api - (local or 0.0) if api is not None else None
    return Spend(compute_s, local, api, savings)


@dataclass(frozen=True)
class Summary:
    group: str
    requests: int
    errors: int
    prompt_tokens: int
    reused_tokens: int
    completion_tokens: int
    tokens_per_second: float | None  # median decode speed
    ttft_ms: float | None  # median
    e2e_ms: float | None  # median
    acceptance_rate: float | None
    mean_accepted_length: float | None  # tokens per target pass over speculative requests
    cache_hit_rate: float | None
    feedback_score: float | None
    compute_s: float
    local_cost: float | None
    api_cost: float | None
    savings: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(rows: list[Row], settings: MetricsSettings, group: str = "all") -> Summary:
    spec = [r for r in rows if (r.get("drafted") or 0) > 0 and (r.get("target_passes") or 0) > 0]
    passes = sum(r["target_passes"] for r in spec)
    mal = sum(max(r["completion_tokens"] - 1, 0) for r in spec) / passes if passes else None
    fb = [r["feedback_score"] for r in rows if r.get("feedback_score") is not None]
    sp = spend(rows, settings)
    return Summary(
        group=group,
        requests=len(rows),
        errors=sum(is_error(r) for r in rows),
        prompt_tokens=sum(r.get("prompt_tokens") or 0 for r in rows),
        reused_tokens=sum(r.get("reused_tokens") or 0 for r in rows),
        completion_tokens=sum(r.get("completion_tokens") or 0 for r in rows),
        tokens_per_second=tokens_per_second(rows)[0],
        ttft_ms=ttft_ms(rows)[0],
        e2e_ms=_median([r["e2e_ms"] for r in rows if r.get("e2e_ms") is not None]),
        acceptance_rate=acceptance(rows)[0],
        mean_accepted_length=mal,
        cache_hit_rate=hit_rate(rows)[0],
        feedback_score=statistics.fmean(fb) if fb else None,
        compute_s=sp.compute_s,
        local_cost=sp.local_cost,
        api_cost=sp.api_cost,
        savings=sp.savings,
    )


def _model_key(r: Row) -> str:
    target = r.get("target_model") or "-"
    if r.get("target_hash"):
        target += f"@{r['target_hash'][:8]}"
    return f"{target} + {r['draft_model']}" if r.get("draft_model") else target


GROUPINGS: dict[str, Callable[[Row], str]] = {
    "model": _model_key,
    "mode": lambda r: r.get("spec_mode") or "off",
    "route": lambda r: r.get("route") or "-",
    "face": lambda r: r.get("face") or "-",
    "day": lambda r: time.strftime("%Y-%m-%d", time.localtime(r["ts"])),
}


def group_rows(rows: list[Row], by: str) -> dict[str, list[Row]]:
    key = GROUPINGS[by]
    out: dict[str, list[Row]] = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class Point:
    start: float  # bucket start, unix seconds
    requests: int
    tokens_per_second: float | None
    acceptance_rate: float | None
    cache_hit_rate: float | None


def time_series(rows: list[Row], bucket_s: float) -> list[Point]:
    buckets: dict[int, list[Row]] = {}
    for r in rows:
        buckets.setdefault(int(r["ts"] // bucket_s), []).append(r)
    return [
        Point(k * bucket_s, len(b), tokens_per_second(b)[0], acceptance(b)[0], hit_rate(b)[0])
        for k, b in sorted(buckets.items())
    ]
