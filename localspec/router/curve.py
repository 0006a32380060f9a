"""RouteLLM's routing metrics over per-task outcomes, with bootstrap confidence intervals.

For n tasks, a router's scores order them; sending the top k to the large tier (k = 0..n, so the
large share sweeps 0..100% in steps of 1/n) gives the routed quality Q(k), the mean over tasks of
the large tier's outcome for the k sent up and the small tier's for the rest. Then

- PGR(k)  = (Q(k) - Q_small) / (Q_large - Q_small): the part of the quality gap recovered;
- APGR    = the mean of PGR(k) over k = 0..n (a random router's expected curve is the diagonal,
            APGR 0.5; a perfect one recovers the whole gap almost at once, APGR near 1);
- CPT(x)  = the smallest large share k/n with PGR(k) >= x.

Tied scores are ordered by a fixed seeded permutation. Bootstrap: tasks are resampled with
replacement (the router's scores stay fixed: it was trained on other tasks); a resample whose
gap Q_large - Q_small is zero or negative leaves PGR undefined or inverted and is skipped; the
count of skipped resamples is reported with the intervals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

REPORT_SHARES = tuple(i / 10 for i in range(11))


@dataclass(frozen=True)
class Curve:
    shares: np.ndarray  # k / n for k = 0..n
    quality: np.ndarray  # Q(k)
    pgr: np.ndarray  # PGR(k); NaN when the gap is not positive
    gap: float

    @property
    def apgr(self) -> float:
        return float(np.mean(self.pgr))

    def cpt(self, level: float = 0.5) -> float:
        hit = np.nonzero(self.pgr >= level - 1e-12)[0]
        return float(self.shares[hit[0]]) if len(hit) else float("nan")

    def at_share(self, share: float) -> tuple[float, float]:
        """(quality, PGR) with round(share * n) tasks sent to the large tier."""
        k = int(round(share * (len(self.shares) - 1)))
        return float(self.quality[k]), float(self.pgr[k])


def _order(scores: np.ndarray, tiebreak: np.ndarray) -> np.ndarray:
    """Indices by descending score; ties by the tiebreak permutation."""
    return np.lexsort((tiebreak, -scores))


def routing_curve(scores, small, large, tiebreak=None) -> Curve:
    scores = np.asarray(scores, dtype=np.float64)
    small = np.asarray(small, dtype=np.float64)
    large = np.asarray(large, dtype=np.float64)
    n = len(scores)
    if tiebreak is None:
        tiebreak = np.random.default_rng(0).permutation(n)
    order = _order(scores, np.asarray(tiebreak))
    gain = (large - small)[order]
    base = small.mean()
    quality = base + np.concatenate([[0.0], np.cumsum(gain)]) / n
    gap = float(large.mean() - base)
    pgr = (quality - base) / gap if gap > 0 else np.full(n + 1, np.nan)
    return Curve(np.arange(n + 1) / n, quality, pgr, gap)


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float

    def as_dict(self) -> dict:
        return {"value": _r(self.value), "ci95": [_r(self.low), _r(self.high)]}


def _r(v: float) -> float | None:
    return None if v != v else round(float(v), 4)  # NaN -> null in JSON


@dataclass(frozen=True)
class RouterReport:
    name: str
    apgr: Estimate
    cpt50: Estimate
    pgr_at: dict[float, Estimate]
    quality_at: dict[float, float]
    curve: Curve
    skipped_resamples: int
    resamples: int

    def as_dict(self) -> dict:
        return {
            "apgr": self.apgr.as_dict(),
            "cpt50": self.cpt50.as_dict(),
            "pgr_at_share": {f"{s:.0%}": e.as_dict() for s, e in self.pgr_at.items()},
            "quality_at_share": {f"{s:.0%}": _r(q) for s, q in self.quality_at.items()},
            "curve": {"share": [_r(v) for v in self.curve.shares], "quality": [_r(v) for v in self.curve.quality],
                      "pgr": [_r(v) for v in self.curve.pgr]},
            "bootstrap": {"resamples": self.resamples, "skipped_gap_not_positive": self.skipped_resamples},
        }


def _ci(values: list[float], point: float) -> Estimate:
    arr = np.asarray([v for v in values if v == v])
    if len(arr) == 0:
        return Estimate(point, float("nan"), float("nan"))
    lo, hi = np.percentile(arr, [2.5, 97.5])
    return Estimate(point, float(lo), float(hi))


def evaluate_router(name: str, scores, small, large, resamples: int = 1000, seed: int = 0,
                    random_scores: bool = False) -> RouterReport:
    """The router's curve on these tasks and bootstrap CIs. `random_scores`: a fresh random
    ordering per resample (the random router, whose point estimate is its expected APGR)."""
    scores = np.asarray(scores, dtype=np.float64)
    small = np.asarray(small, dtype=np.float64)
    large = np.asarray(large, dtype=np.float64)
    n = len(scores)
    rng = np.random.default_rng(seed)
    tiebreak = np.random.default_rng(seed + 1).permutation(n)
    point = routing_curve(scores, small, large, tiebreak)
    apgrs: list[float] = []
    cpts: list[float] = []
    pgrs: dict[float, list[float]] = {s: [] for s in REPORT_SHARES}
    skipped = 0
    for _ in range(resamples):
        idx = rng.integers(0, n, n)
        s = rng.random(n) if random_scores else scores[idx]
        c = routing_curve(s, small[idx], large[idx], rng.permutation(n))
        if not c.gap > 0:
            skipped += 1
            continue
        apgrs.append(c.apgr)
        cpts.append(c.cpt(0.5))
        for share in REPORT_SHARES:
            pgrs[share].append(c.at_share(share)[1])
    if random_scores:
        # The random router's expected curve is the diagonal: PGR(share) = share.
        apgr_point, cpt_point = 0.5, 0.5
        pgr_point = {share: share for share in REPORT_SHARES}
        quality_at = {share: float(small.mean() + share * (large.mean() - small.mean())) for share in REPORT_SHARES}
    else:
        apgr_point, cpt_point = point.apgr, point.cpt(0.5)
        pgr_point = {share: point.at_share(share)[1] for share in REPORT_SHARES}
        quality_at = {share: point.at_share(share)[0] for share in REPORT_SHARES}
    return RouterReport(
        name=name, apgr=_ci(apgrs, apgr_point), cpt50=_ci(cpts, cpt_point),
        pgr_at={share: _ci(pgrs[share], pgr_point[share]) for share in REPORT_SHARES},
        quality_at=quality_at, curve=point, skipped_resamples=skipped, resamples=resamples,
    )
