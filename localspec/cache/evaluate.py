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

import dataclasses
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localspec.cache.scope import CacheScope
from localspec.cache.semantic import SemanticCache

if TYPE_CHECKING:
    from localspec.cache.judge import ModelJudge
    from localspec.engine.embedder import Embedder

THRESHOLDS = [round(0.60 + 0.02 * i, 2) for i in range(20)]  # 0.60 .. 0.98
JUDGE_THRESHOLDS = [round(-1.0 + 0.25 * i, 2) for i in range(17)]  # -1 .. 3 (logit margin)
GOAL_HIT_RATE = 0.80
GOAL_FALSE_HIT_RATE = 0.01


# dev: what the guard's rules and the thresholds were tuned on: the generated dev pairs and the
# first blind set (dev_blind), whose figures were read while the judge was tuned. test: the second
# blind set, reported and never tuned on.
SPLITS = {"dev": ("dev", "dev_blind"), "test": ("test",), "all": ("dev", "dev_blind", "test")}


def pair_files(split: str) -> list[Path]:
    """The committed pair files of a split (see SPLITS), from the evals folder (localspec.evals);
    raises EvalDataMissing when they are not on this machine."""
    from localspec.evals import eval_file

    return [eval_file("cache", f"pairs_{name}.jsonl") for name in SPLITS[split]]


def load_pairs(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    """The labelled pairs of a JSON-lines file; a file or line that is not one is a ConfigError naming it."""
    from localspec.errors import ConfigError
    from localspec.router.tasks import jsonl_rows

    fix = "Each line is a JSON object with texts 'a' and 'b' and the label 'hit' or 'miss'."
    rows = []
    for n, row in jsonl_rows(path, "labelled pair", fix):
        if row.get("label") not in ("hit", "miss") or not isinstance(row.get("a"), str) or not row["a"] \
                or not isinstance(row.get("b"), str) or not row["b"]:
            raise ConfigError(f"{path}:{n}: not a valid labelled pair (it needs 'a', 'b' and the label).", fix)
        rows.append(row)
    return rows[:limit] if limit else rows


@dataclass(frozen=True)
class Outcome:
    pair: dict[str, Any]
    exact: bool
    similarity: float  # -1 when nothing comparable (too long, no embedder)
    guard: str | None  # the full rules' verdict (no judge)
    conflict: str | None = None  # the facts-only verdict (with a judge)
    judge: float | None = None  # the reuse judge's score; None when it was not asked

    def served(self, threshold: float, guard: bool = True, judge_threshold: float | None = None) -> bool:
        """Whether a lookup serves it: with a judge threshold, as the judged path does (facts-only
        guard, then the judge); without, as the rules-only path does."""
        if guard and (self.guard if judge_threshold is None else self.conflict) is not None:
            return False
        if self.exact:
            return True
        if self.similarity < threshold:
            return False
        return judge_threshold is None or (self.judge is not None and self.judge >= judge_threshold)


@dataclass(frozen=True)
class Point:
    threshold: float
    hit_rate: float
    false_hit_rate: float
    precision: float
    recall: float
    served: int


def curve(outcomes: list[Outcome], guard: bool = True, thresholds: list[float] = THRESHOLDS,
          judge_threshold: float | None = None) -> list[Point]:
    """One point per similarity threshold (the judge, if any, at `judge_threshold`)."""
    return [_point(outcomes, t, lambda o, t=t: o.served(t, guard, judge_threshold)) for t in thresholds]


def judge_curve(outcomes: list[Outcome], threshold: float,
                judge_thresholds: list[float] = JUDGE_THRESHOLDS) -> list[Point]:
    """One point per judge threshold, at similarity `threshold` with the guard on. Point.threshold
    holds the judge threshold."""
    return [_point(outcomes, j, lambda o, j=j: o.served(threshold, True, j)) for j in judge_thresholds]


def _point(outcomes: list[Outcome], threshold: float, served) -> Point:
    pos = [o for o in outcomes if o.pair["label"] == "hit"]
    neg = [o for o in outcomes if o.pair["label"] == "miss"]
    tp = sum(served(o) for o in pos)
    fp = sum(served(o) for o in neg)
    hit_rate = tp / len(pos) if pos else 0.0
    return Point(threshold, hit_rate, fp / len(neg) if neg else 0.0, tp / (tp + fp) if tp + fp else 1.0,
                 hit_rate, tp + fp)


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


def run_eval(pairs: list[dict[str, Any]], embedder: Embedder | None, threshold: float | None = None,
             judge: ModelJudge | None = None, latency_sample: int = 100,
             progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Measure the cache on labelled pairs. With a `judge`, every pair the guard passes at the lowest
    swept threshold is judged once (for the curves); real lookups, which judge again, are timed on
    the first `latency_sample` pairs only, since a judgement costs a prefill."""
    with tempfile.TemporaryDirectory(prefix="localspec-cache-eval-") as tmp:
        cache = SemanticCache(Path(tmp), embedder=embedder, threshold=threshold, ttl_s=None)
        try:
            for n, pair in enumerate(pairs):
                cache.store(_scope(pair, n), pair["a"], f"answer to: {pair['a']}", [])
            outcomes = []
            for n, pair in enumerate(pairs):
                probe = cache.probe(_scope(pair, n), pair["b"])
                sim = probe.similarity if probe.similarity is not None else -1.0
                outcomes.append(Outcome(pair, probe.exact, sim, probe.guard, probe.conflict))
            used = cache.threshold if judge is None else cache.judged_threshold
            if judge is not None:
                outcomes = _judge_all(outcomes, judge, min(THRESHOLDS[0], used), progress)
            judge_threshold = judge.threshold if judge is not None else None
            timed = pairs if judge is None else pairs[:latency_sample]
            cache.lookup(_scope(pairs[0], 0), pairs[0]["b"])  # warm-up: first call compiles the guard's patterns
            hit_ms, all_ms, disagree = [], [], 0
            for n, pair in enumerate(timed):
                t0 = time.perf_counter()
                hit = cache.lookup(_scope(pair, n), pair["b"], judge=judge)
                ms = (time.perf_counter() - t0) * 1000
                all_ms.append(ms)
                if hit is not None:
                    hit_ms.append(ms)
                disagree += (hit is not None) != outcomes[n].served(used, True, judge_threshold)
        finally:
            cache.close()
    served = [o.served(used, True, judge_threshold) for o in outcomes]
    pos = [o for o in outcomes if o.pair["label"] == "hit"]
    neg = [o for o in outcomes if o.pair["label"] == "miss"]
    by_cat: dict[str, list[int]] = {}
    for o, s in zip(outcomes, served, strict=True):
        c = by_cat.setdefault(o.pair.get("category", "?"), [0, 0])
        c[0] += int(s)
        c[1] += 1
    tp = sum(s for o, s in zip(outcomes, served, strict=True) if o.pair["label"] == "hit")
    fp = sum(s for o, s in zip(outcomes, served, strict=True) if o.pair["label"] == "miss")
    verdict = (lambda o: o.guard) if judge is None else (lambda o: o.conflict)
    guard_saves = [o for o in neg if verdict(o) is not None and (o.exact or o.similarity >= used)]
    judge_saves = [o for o in neg if verdict(o) is None and not o.exact and o.similarity >= used
                   and judge_threshold is not None and not o.served(used, True, judge_threshold)]
    hit_rate, false_hit_rate = (tp / len(pos) if pos else 0.0), (fp / len(neg) if neg else 0.0)
    guarded = curve(outcomes, guard=True, judge_threshold=judge_threshold)
    report = {
        "pairs": len(pairs), "paraphrases": len(pos), "traps": len(neg),
        "mode": "semantic" if embedder is not None else "exact",
        "threshold": used,
        "judge": None if judge is None else {"model": judge.name, "threshold": judge.threshold,
                                             "judged_pairs": sum(o.judge is not None for o in outcomes)},
        "at_threshold": {
            "hit_rate": hit_rate, "false_hit_rate": false_hit_rate,
            "precision": tp / (tp + fp) if tp + fp else 1.0, "hits": tp, "false_hits": fp,
            "traps_stopped_by_guard": len(guard_saves), "traps_stopped_by_judge": len(judge_saves),
            "false_hit_examples": [
                {"a": o.pair["a"], "b": o.pair["b"], "category": o.pair.get("category"),
                 "similarity": round(o.similarity, 3), "judge": _round(o.judge)}
                for o, s in zip(outcomes, served, strict=True) if s and o.pair["label"] == "miss"
            ],
            "missed_paraphrases": [
                {"a": o.pair["a"], "b": o.pair["b"], "similarity": round(o.similarity, 3), "guard": verdict(o),
                 "judge": _round(o.judge), "id": o.pair.get("id")}
                for o, s in zip(outcomes, served, strict=True) if not s and o.pair["label"] == "hit"
            ],
        },
        "served_by_category": {k: {"served": v[0], "pairs": v[1]} for k, v in sorted(by_cat.items())},
        "curve": [p.__dict__ for p in guarded],
        "curve_without_guard": [p.__dict__ for p in curve(outcomes, guard=False)],
        "suggested_threshold": choose_threshold(guarded),
        "goals": {
            "hit_rate": GOAL_HIT_RATE, "false_hit_rate": GOAL_FALSE_HIT_RATE,
            "met": bool(pos and neg) and hit_rate >= GOAL_HIT_RATE and false_hit_rate <= GOAL_FALSE_HIT_RATE,
        },
        "latency_ms": {
            "timed_lookups": len(all_ms), "disagreements_with_probe": disagree,
            "lookup_p50": _pct(all_ms, 50), "lookup_p95": _pct(all_ms, 95), "lookup_max": max(all_ms, default=0.0),
            "hit_p50": _pct(hit_ms, 50), "hit_p95": _pct(hit_ms, 95), "hit_max": max(hit_ms, default=0.0),
            "hit_mean": statistics.fmean(hit_ms) if hit_ms else 0.0,
        },
    }
    if judge is not None:
        jc = judge_curve(outcomes, used, getattr(judge, "curve_thresholds", JUDGE_THRESHOLDS))
        report["judge_curve"] = [p.__dict__ for p in jc]
        report["suggested_judge_threshold"] = choose_threshold(jc)
    return report


def _judge_all(outcomes: list[Outcome], judge: ModelJudge, floor: float,
               progress: Callable[[int, int], None] | None) -> list[Outcome]:
    """Judge each pair the facts-only guard passes at similarity `floor` or above (an exact match is
    never judged)."""
    todo = [i for i, o in enumerate(outcomes) if not o.exact and o.conflict is None and o.similarity >= floor]
    out = list(outcomes)
    for done, i in enumerate(todo, 1):
        o = outcomes[i]
        out[i] = dataclasses.replace(o, judge=judge.score(o.pair["a"], o.pair["b"]))
        if progress is not None:
            progress(done, len(todo))
    return out


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]
