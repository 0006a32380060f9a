"""How the reuse judge is asked: zero-shot, with worked examples, and with the requests both ways (issue #6).

The cache's judge (`localspec.cache.judge`) is the 1.5B target asked whether a saved request's
answer serves a new one. This script scores the dev pairs' judge candidates (not an exact match,
passed by the facts-only guard, similarity at least 0.60) with three ways of asking:

- zero-shot: the question alone, after the two requests (the judge before this script);
- examples, one reading: the instructions and 16 worked examples as earlier turns, then the pair
  (`judge.margin(saved, new)`);
- examples, both readings: the smaller margin of (saved, new) and (new, saved) (`judge.score`).

For each it prints the judge-threshold curve at the similarity floor the cache uses, and the
threshold `evaluate.choose_threshold` picks (most hits at a false-hit rate of at most half the goal).
Every trap candidate is judged, and a random sample of the paraphrase candidates (--paraphrases;
the hit rate scales the sample back to all of them). Scores are kept in --work, so a rerun only
analyses. About 13 + 7 + 7 minutes on a 2-core CPU with 300 paraphrases.

    python scripts/cache_judge_prompts.py [--split dev] [--paraphrases 300] [--out docs/cache/judge-prompts-dev.json]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import localspec.cache.judge as judge_module
from localspec.cache.evaluate import (
    JUDGE_THRESHOLDS,
    Point,
    _scope,
    choose_threshold,
    load_pairs,
    pair_files,
)
from localspec.cache.judge import JUDGED_THRESHOLD
from localspec.cache.semantic import SemanticCache
from localspec.cli.cache_cmd import open_embedder
from localspec.engine.config import GenerationRequest
from localspec.service import open_judge

CANDIDATE_FLOOR = 0.60
EXAMPLES_REQUEST = judge_module.judge_request

# The zero-shot prompt the judge used before the worked examples (commit 614f98a).
ZERO_SHOT_SYSTEM = "You check whether a saved answer can be reused for a new request."
ZERO_SHOT_QUESTION = (
    "Do both requests ask for exactly the same thing, so that a correct answer to the saved request is also a "
    "fully correct answer to the new one (same numbers, same language, same tools, same direction, nothing added "
    "or excluded)? Reply Yes or No."
)


def zero_shot_request(saved: str, new: str) -> GenerationRequest:
    return GenerationRequest(
        messages=[{"role": "system", "content": ZERO_SHOT_SYSTEM},
                  {"role": "user", "content": f"Saved request: {saved}\nNew request: {new}\n{ZERO_SHOT_QUESTION}"}],
        max_tokens=1, logprobs=judge_module.TOP_LOGPROBS, mode="off",
    )


def candidates(split: str) -> list[dict]:
    """Every pair of the split with its similarity and the facts-only guard's verdict."""
    pairs = [p for f in pair_files(split) for p in load_pairs(f)]
    embedder = open_embedder()
    if embedder is None:
        raise SystemExit("the embedding model is not installed: localspec models pull all-minilm-l6-v2-f16")
    with tempfile.TemporaryDirectory() as tmp:
        cache = SemanticCache(Path(tmp), embedder=embedder, ttl_s=None)
        for n, p in enumerate(pairs):
            cache.store(_scope(p, n), p["a"], "answer", [])
        rows = []
        for n, p in enumerate(pairs):
            probe = cache.probe(_scope(p, n), p["b"])
            rows.append({**p, "exact": probe.exact, "conflict": probe.conflict,
                         "sim": -1.0 if probe.similarity is None else probe.similarity})
        cache.close()
    embedder.close()
    return rows


def score_all(rows: list[int], pairs: list[dict], reading: str, work: Path) -> dict[int, float]:
    """Judge margins for the given pair indices, kept in work/<reading>.json between runs."""
    path = work / f"{reading}.json"
    scores = {int(k): v for k, v in json.loads(path.read_text()).items()} if path.exists() else {}
    todo = [i for i in rows if i not in scores]
    if todo:
        judge, close = open_judge()
        judge.timeout_s = 600.0  # nothing else runs on this engine
        if reading == "zero-shot":
            judge_module.judge_request = zero_shot_request
        t0 = time.perf_counter()
        try:
            for n, i in enumerate(todo, 1):
                a, b = pairs[i]["a"], pairs[i]["b"]
                scores[i] = judge.margin(b, a) if reading == "examples-reversed" else judge.margin(a, b)
                if n % 50 == 0 or n == len(todo):
                    print(f"{reading}: {n}/{len(todo)} ({time.perf_counter() - t0:.0f} s)", flush=True)
                    path.write_text(json.dumps(scores))
        finally:
            close()
            judge_module.judge_request = EXAMPLES_REQUEST
    return scores


def curve(pairs: list[dict], judged: list[int], scores: dict[int, float], scale: float) -> list[Point]:
    n_hit = sum(p["label"] == "hit" for p in pairs)
    n_miss = len(pairs) - n_hit
    points = []
    for j in JUDGE_THRESHOLDS:
        served = [i for i in judged if pairs[i]["sim"] >= JUDGED_THRESHOLD and scores[i] >= j]
        tp = sum(pairs[i]["label"] == "hit" for i in served) * scale
        fp = sum(pairs[i]["label"] == "miss" for i in served)
        points.append(Point(j, tp / n_hit, fp / n_miss, tp / (tp + fp) if tp + fp else 1.0, tp / n_hit, round(tp + fp)))
    return points


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="dev", choices=["dev", "test", "all"])
    ap.add_argument("--paraphrases", type=int, default=300, help="paraphrase candidates judged (all traps are)")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "localspec-judge-prompts")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    work = args.work / args.split
    work.mkdir(parents=True, exist_ok=True)
    pairs_path = work / "pairs.json"
    if not pairs_path.exists():
        pairs_path.write_text(json.dumps(candidates(args.split)))
    pairs = json.loads(pairs_path.read_text())
    cand = [i for i, p in enumerate(pairs) if not p["exact"] and p["conflict"] is None and p["sim"] >= CANDIDATE_FLOOR]
    traps = [i for i in cand if pairs[i]["label"] == "miss"]
    paraphrases = [i for i in cand if pairs[i]["label"] == "hit"]
    random.Random(0).shuffle(paraphrases)
    judged = traps + paraphrases[: args.paraphrases]
    scale = len(paraphrases) / max(1, min(args.paraphrases, len(paraphrases)))
    zero = score_all(judged, pairs, "zero-shot", work)
    ahead = score_all(judged, pairs, "examples", work)
    back = score_all(judged, pairs, "examples-reversed", work)
    ways = {"zero-shot": zero, "examples, one reading": ahead,
            "examples, both readings (smaller margin)": {i: min(ahead[i], back[i]) for i in judged}}
    report = {"split": args.split, "pairs": len(pairs), "candidates": len(cand), "trap_candidates": len(traps),
              "paraphrase_candidates": len(paraphrases), "paraphrases_judged": min(args.paraphrases, len(paraphrases)),
              "similarity_floor": JUDGED_THRESHOLD, "ways": {}}
    for name, scores in ways.items():
        points = curve(pairs, judged, scores, scale)
        pick = choose_threshold(points)
        at = next(p for p in points if p.threshold == pick)
        report["ways"][name] = {"chosen_threshold": pick, "at_chosen": at.__dict__, "curve": [p.__dict__ for p in points]}
        print(f"\n{name}: chosen judge threshold {pick:+.2f}: {at.hit_rate:.1%} hits, {at.false_hit_rate:.2%} false hits")
        for p in points:
            print(f"  {p.threshold:+5.2f}  {p.hit_rate:6.1%}  {p.false_hit_rate:6.2%}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
