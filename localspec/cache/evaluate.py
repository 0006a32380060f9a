"""`localspec cache eval`: run a labelled pair file through the real cache and report the curve.

Each pair gets its own scope holding only its cached prompt `a`, so a lookup of `b` can hit only
`a`; all pairs share one store and one vector index, so the search cost is that of a cache with
as many entries as the file has pairs. For every threshold the report gives the hit rate on
paraphrases (= recall), the false-hit rate on traps, and precision, with the guard on (what is
served) and off (what similarity alone would serve). Latency is timed on real `lookup` calls at
the chosen threshold, embedding included.

The issue's goals, checked at the threshold the lookups ran with: at least GOAL_HIT_RATE of the
paraphrases served and at most GOAL_FALSE_HIT_RATE of the traps.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localspec.cache.scope import CacheScope
from localspec.cache.semantic import SemanticCache

if TYPE_CHECKING:
    from localspec.engine.embedder import Embedder

THRESHOLDS = [round(0.60 + 0.02 * i, 2) for i in range(20)]  # 0.60 .. 0.98
GOAL_HIT_RATE = 0.80
GOAL_FALSE_HIT_RATE = 0.01


def pair_file(split: str) -> Path:
    """The committed pair file for 'dev' or 'test'."""
    return Path(str(resources.files("localspec.cache.eval").joinpath(f"pairs_{split}.jsonl")))


def load_pairs(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                if row.get("label") not in ("hit", "miss") or not row.get("a") or not row.get("b"):
                    raise ValueError(f"{path}: each line needs 'a', 'b' and label 'hit' or 'miss'")
                rows.append(row)
    return rows[:limit] if limit else rows


@dataclass(frozen=True)
class Outcome:
    pair: dict[str, Any]
    exact: bool
    similarity: float  # -1 when nothing comparable (too long, no embedder)
    guard: str | None

    def served(self, threshold: float, guard: bool = True) -> bool:
        if guard and self.guard is not None:
            return False
        return self.exact or self.similarity >= threshold


@dataclass(frozen=True)
class Point:
    threshold: float
    hit_rate: float
    false_hit_rate: float
    precision: float
    recall: float
    served: int


def curve(outcomes: list[Outcome], guard: bool = True, thresholds: list[float] = THRESHOLDS) -> list[Point]:
    pos = [o for o in outcomes if o.pair["label"] == "hit"]
    neg = [o for o in outcomes if o.pair["label"] == "miss"]
    points = []
    for t in thresholds:
        tp = sum(o.served(t, guard) for o in pos)
        fp = sum(o.served(t, guard) for o in neg)
        hit_rate = tp / len(pos) if pos else 0.0
        points.append(Point(t, hit_rate, fp / len(neg) if neg else 0.0,
                            tp / (tp + fp) if tp + fp else 1.0, hit_rate, tp + fp))
    return points


def choose_threshold(points: list[Point], max_false_hit_rate: float = GOAL_FALSE_HIT_RATE / 2,
                     slack: float = 0.02) -> float:
    """The highest threshold whose hit rate is within `slack` of the best one at an allowed false-hit rate.

    Only thresholds with at most `max_false_hit_rate` (half the goal) count. Among them the highest
    that gives up at most `slack` of hit rate is chosen, not the one with the most hits: unseen
    prompts bring traps the guard has not seen, and a higher threshold serves fewer of them.
    """
    ok = [p for p in points if p.false_hit_rate <= max_false_hit_rate] or points[-1:]
    best = max(p.hit_rate for p in ok)
    return max(p.threshold for p in ok if p.hit_rate >= best - slack - 1e-9)


def _scope(pair: dict[str, Any], n: int) -> CacheScope:
    return CacheScope.from_request(model_hash="eval", system_prompt=f"pair {n}")


def run_eval(pairs: list[dict[str, Any]], embedder: Embedder | None, threshold: float | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="localspec-cache-eval-") as tmp:
        cache = SemanticCache(Path(tmp), embedder=embedder, threshold=threshold, ttl_s=None)
        try:
            for n, pair in enumerate(pairs):
                cache.store(_scope(pair, n), pair["a"], f"answer to: {pair['a']}", [])
            outcomes = []
            for n, pair in enumerate(pairs):
                probe = cache.probe(_scope(pair, n), pair["b"])
                sim = probe.similarity if probe.similarity is not None else -1.0
                outcomes.append(Outcome(pair, probe.exact, sim, probe.guard))
            cache.lookup(_scope(pairs[0], 0), pairs[0]["b"])  # warm-up: first call compiles the guard's patterns
            hit_ms, all_ms, served = [], [], []
            for n, pair in enumerate(pairs):
                t0 = time.perf_counter()
                hit = cache.lookup(_scope(pair, n), pair["b"])
                ms = (time.perf_counter() - t0) * 1000
                all_ms.append(ms)
                if hit is not None:
                    hit_ms.append(ms)
                served.append(hit is not None)
            used = cache.threshold
        finally:
            cache.close()
    pos = [o for o in outcomes if o.pair["label"] == "hit"]
    neg = [o for o in outcomes if o.pair["label"] == "miss"]
    by_cat: dict[str, list[int]] = {}
    for o, s in zip(outcomes, served, strict=True):
        c = by_cat.setdefault(o.pair.get("category", "?"), [0, 0])
        c[0] += int(s)
        c[1] += 1
    tp = sum(s for o, s in zip(outcomes, served, strict=True) if o.pair["label"] == "hit")
    fp = sum(s for o, s in zip(outcomes, served, strict=True) if o.pair["label"] == "miss")
    guard_saves = [o for o in neg if o.guard is not None and (o.exact or o.similarity >= used)]
    hit_rate, false_hit_rate = (tp / len(pos) if pos else 0.0), (fp / len(neg) if neg else 0.0)
    return {
        "pairs": len(pairs), "paraphrases": len(pos), "traps": len(neg),
        "mode": "semantic" if embedder is not None else "exact",
        "threshold": used,
        "at_threshold": {
            "hit_rate": hit_rate, "false_hit_rate": false_hit_rate,
            "precision": tp / (tp + fp) if tp + fp else 1.0, "hits": tp, "false_hits": fp,
            "traps_stopped_by_guard": len(guard_saves),
            "false_hit_examples": [
                {"a": o.pair["a"], "b": o.pair["b"], "category": o.pair.get("category"), "similarity": round(o.similarity, 3)}
                for o, s in zip(outcomes, served, strict=True) if s and o.pair["label"] == "miss"
            ],
            "missed_paraphrases": [
                {"a": o.pair["a"], "b": o.pair["b"], "similarity": round(o.similarity, 3), "guard": o.guard,
                 "id": o.pair.get("id")}
                for o, s in zip(outcomes, served, strict=True) if not s and o.pair["label"] == "hit"
            ],
        },
        "served_by_category": {k: {"served": v[0], "pairs": v[1]} for k, v in sorted(by_cat.items())},
        "curve": [p.__dict__ for p in curve(outcomes, guard=True)],
        "curve_without_guard": [p.__dict__ for p in curve(outcomes, guard=False)],
        "suggested_threshold": choose_threshold(curve(outcomes, guard=True)),
        "goals": {
            "hit_rate": GOAL_HIT_RATE, "false_hit_rate": GOAL_FALSE_HIT_RATE,
            "met": bool(pos and neg) and hit_rate >= GOAL_HIT_RATE and false_hit_rate <= GOAL_FALSE_HIT_RATE,
        },
        "latency_ms": {
            "lookup_p50": _pct(all_ms, 50), "lookup_p95": _pct(all_ms, 95), "lookup_max": max(all_ms, default=0.0),
            "hit_p50": _pct(hit_ms, 50), "hit_p95": _pct(hit_ms, 95), "hit_max": max(hit_ms, default=0.0),
            "hit_mean": statistics.fmean(hit_ms) if hit_ms else 0.0,
        },
    }


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]
