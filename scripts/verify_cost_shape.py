"""What a target verify batch of r rows costs, relative to one row, and the speed-up it allows.

Speculative decoding pays only if a batch of k + 1 rows costs much less than k + 1 single steps.
This times batches of 1..9 rows with logits (the verify shape), interleaved in shuffled order so
machine noise hits every size alike, at a short and a longer history. It then prints the ceiling
any drafter could reach here: a draft that is free and always accepted gives k + 1 tokens per
verify(k + 1), so the best speed-up is max over k of (k + 1) * verify(1) / verify(k + 1).

    python scripts/verify_cost_shape.py [--rounds 8] [--contexts 48,512] [--out shape.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from localspec.engine.runtime import ModelRuntime, Row, RuntimeConfig
from localspec.models import ModelManager

MAX_ROWS = 9


def measure(rt: ModelRuntime, context: int, rounds: int, rng: random.Random) -> dict[int, float]:
    rt.seq_rm(0, 0, -1)
    for start in range(0, context, 256):
        rt.decode([Row((i * 7919) % rt.n_vocab, i, 0) for i in range(start, min(context, start + 256))])
    times: dict[int, list[float]] = {r: [] for r in range(1, MAX_ROWS + 1)}
    for _ in range(rounds + 1):  # the first round warms every batch shape and is dropped
        order = list(times)
        rng.shuffle(order)
        for r in order:
            t0 = time.perf_counter()
            rt.decode([Row((13 * i + 1) % rt.n_vocab, context + i, 0, logits=True) for i in range(r)])
            times[r].append(time.perf_counter() - t0)
            rt.seq_rm(0, context, -1)
    return {r: statistics.median(v[1:]) for r, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--contexts", default="48,512", help="history lengths to measure at")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    mm = ModelManager()
    rt = ModelRuntime(mm.require_path(mm.profile(args.profile).target), RuntimeConfig(n_ctx=4096, n_outputs_max=64))
    rng = random.Random(0)
    report = {"rounds": args.rounds, "threads": rt.n_threads, "contexts": {}}
    try:
        for context in (int(c) for c in args.contexts.split(",")):
            med = measure(rt, context, args.rounds, rng)
            rel = {r: med[r] / med[1] for r in med}
            ceiling = max((k + 1) / rel[k + 1] for k in range(1, MAX_ROWS))
            report["contexts"][context] = {"seconds": med, "relative": rel, "ceiling": ceiling}
            print(f"history {context}: " + "  ".join(f"{r}:{med[r] * 1000:.0f} ms ({rel[r]:.2f})" for r in med))
            print(f"  ceiling with a free, always-accepted draft: {ceiling:.2f}x")
    finally:
        rt.close()
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
