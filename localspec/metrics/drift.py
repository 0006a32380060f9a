"""Drift: the recent window against the baseline just before it, metric by metric.

Each metric needs `min_samples` in both windows before it gets a verdict, so a quiet day does
not raise alarms. Speeds and latencies compare relatively (a model twice as big is slower, but
its drift is still a percentage); rates compare in absolute points.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from localspec.metrics import report, store
from localspec.metrics.report import Row
from localspec.metrics.settings import DriftLimits


@dataclass(frozen=True)
class Comparison:
    metric: str
    baseline: float | None
    recent: float | None
    n_baseline: int
    n_recent: int
    limit: float
    relative: bool  # limit is a fraction of the baseline, not absolute points
    min_samples: int

    @property
    def change(self) -> float | None:
        if self.baseline is None or self.recent is None:
            return None
        diff = self.recent - self.baseline
        if not self.relative:
            return diff
        return diff / self.baseline if self.baseline else None

    @property
    def enough_data(self) -> bool:
        return self.n_baseline >= self.min_samples and self.n_recent >= self.min_samples

    @property
    def flagged(self) -> bool:
        c = self.change
        return self.enough_data and c is not None and abs(c) > self.limit

    def describe(self) -> str:
        if self.change is None or not self.enough_data:
            return f"{self.metric}: not enough data ({self.n_baseline} baseline, {self.n_recent} recent samples)"
        c = self.change
        verb = "rose" if c > 0 else "fell" if c < 0 else "held"
        amount = f"{c:+.1%}" if self.relative else f"{c:+.3f}"
        limit = f"±{self.limit:.0%}" if self.relative else f"±{self.limit:.3f}"
        return f"{self.metric} {verb} {self.baseline:.3g} → {self.recent:.3g} ({amount}; limit {limit})"


DriftFlag = Comparison  # a comparison whose `flagged` is true


def _error_rate(rows: list[Row]) -> tuple[float | None, int]:
    return (sum(report.is_error(r) for r in rows) / len(rows) if rows else None), len(rows)


def _false_hit_rate(rows: list[Row]) -> tuple[float | None, int]:
    hits = [r for r in rows if r.get("cache") == "hit"]
    return (sum(bool(r.get("cache_wrong")) for r in hits) / len(hits) if hits else None), len(hits)


def _feedback(rows: list[Row]) -> tuple[float | None, int]:
    v = [r["feedback_score"] for r in rows if r.get("feedback_score") is not None]
    return (statistics.fmean(v) if v else None), len(v)


_METRICS: tuple[tuple[str, Callable[[list[Row]], tuple[float | None, int]], str, bool], ...] = (
    ("acceptance_rate", report.acceptance, "acceptance_rate", False),
    ("tokens_per_second", report.tokens_per_second, "tokens_per_second", True),
    ("ttft_ms", report.ttft_ms, "ttft", True),
    ("cache_hit_rate", report.hit_rate, "cache_hit_rate", False),
    ("cache_false_hit_rate", _false_hit_rate, "cache_false_hit_rate", False),
    ("error_rate", _error_rate, "error_rate", False),
    ("feedback_score", _feedback, "feedback_score", False),
)


def compare(baseline: list[Row], recent: list[Row], limits: DriftLimits) -> list[Comparison]:
    """Every metric's comparison, flagged or not."""
    out = []
    for name, fn, limit_key, relative in _METRICS:
        (b, nb), (r, nr) = fn(baseline), fn(recent)
        out.append(Comparison(name, b, r, nb, nr, getattr(limits, limit_key), relative, limits.min_samples))
    routed_b = [x for x in baseline if x.get("route")]
    routed_r = [x for x in recent if x.get("route")]
    for route in sorted({x["route"] for x in routed_b + routed_r}):
        def share(rows: list[Row], route: str = route) -> float | None:
            return sum(x["route"] == route for x in rows) / len(rows) if rows else None

        out.append(Comparison(f"route_share[{route}]", share(routed_b), share(routed_r), len(routed_b),
                              len(routed_r), limits.route_share, False, limits.min_samples))
    return out


def windows(limits: DriftLimits, now: float | None = None) -> tuple[tuple[float, float], tuple[float, float]]:
    """(baseline, recent) as [start, end) unix-second ranges."""
    now = time.time() if now is None else now
    split = now - limits.recent_days * 86400
    return (split - limits.baseline_days * 86400, split), (split, now)


def drift_report(db_path: Path | None, limits: DriftLimits, now: float | None = None) -> list[Comparison]:
    (b0, b1), (r0, r1) = windows(limits, now)
    conn = store.open_reader(db_path or store.default_db_path())
    try:
        baseline = store.fetch_rows(conn, b0, b1)
        recent = store.fetch_rows(conn, r0, r1)
    finally:
        conn.close()
    return compare(baseline, recent, limits)


def detect_drift(db_path: Path | None = None, limits: DriftLimits | None = None,
                 now: float | None = None) -> list[DriftFlag]:
    """Only the comparisons beyond their limit: what the TUI shows as active flags."""
    return [c for c in drift_report(db_path, limits or DriftLimits(), now) if c.flagged]


def active_drift_flags(db_path: Path | None = None, now: float | None = None) -> list[DriftFlag]:
    """Flags under the user's settings.toml limits; none when nothing has been logged yet."""
    from localspec.metrics.settings import load_metrics_settings

    path = db_path or store.default_db_path()
    if not path.exists():
        return []
    return detect_drift(path, load_metrics_settings().drift, now)
