"""What a target verify batch of r rows costs, relative to one row, and the speed-up it allows.

Speculative decoding pays only if a batch of k + 1 rows costs much less than k + 1 single steps.
This times batches of 1..9 rows with logits (the verify shape), interleaved in shuffled order so
machine noise hits every size alike, at a short and a longer history. It then prints the ceiling
any drafter could reach here: a draft that is free and always accepted gives k + 1 tokens per
verify(k + 1), so the best speed-up is max over k of (k + 1) * verify(1) / verify(k + 1).

    python scripts/verify_cost_shape.py [--rounds 8] [--contexts 48,512] [--rows 1-9] [--last-row] [--out shape.json]

`--last-row` also times each batch with logits for its last row only, the shape llama.cpp's
`llama-bench -p N -n 0 -d CONTEXT` times: the difference is the output layer a verify pays per row.
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


def measure(rt: ModelRuntime, context: int, rounds: int, rng: random.Random, rows: list[int], *,
            every_row: bool = True) -> dict[int, float]:
    rt.seq_rm(0, 0, -1)
    for start in range(0, context, 256):
        rt.decode([Row((i * 7919) % rt.n_vocab, i, 0) for i in range(start, min(context, start + 256))])
    times: dict[int, list[float]] = {r: [] for r in rows}
    for _ in range(rounds + 1):  # the first round warms every batch shape and is dropped
        order = list(times)
        rng.shuffle(order)
        for r in order:
            batch = [Row((13 * i + 1) % rt.n_vocab, context + i, 0, logits=every_row or i == r - 1) for i in range(r)]
            t0 = time.perf_counter()
            rt.decode(batch)
            times[r].append(time.perf_counter() - t0)
            rt.seq_rm(0, context, -1)
    return {r: statistics.median(v[1:]) for r, v in times.items()}


def parse_rows(text: str) -> list[int]:
    """"1-9" or "1,2,4,8,16,17": batch sizes to time (1 is always among them, the unit)."""
    if "-" in text:
        lo, hi = (int(x) for x in text.split("-"))
        rows = list(range(lo, hi + 1))
    else:
        rows = [int(x) for x in text.split(",")]
    return sorted({1, *rows})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--contexts", default="48,512", help="history lengths to measure at")
    ap.add_argument("--rows", default=f"1-{MAX_ROWS}", help='batch sizes: "1-9" or "1,2,4,5,8,9,16,17"')
    ap.add_argument("--last-row", action="store_true", help="also time batches with the last row's logits only")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    mm = ModelManager()
    rt = ModelRuntime(mm.require_path(mm.profile(args.profile).target), RuntimeConfig(n_ctx=4096, n_outputs_max=64))
    rng = random.Random(0)
    rows = parse_rows(args.rows)
    report: dict = {"rounds": args.rounds, "threads": rt.n_threads, "rows": rows, "contexts": {}}
    try:
        for context in (int(c) for c in args.contexts.split(",")):
            med = measure(rt, context, args.rounds, rng, rows)
            rel = {r: med[r] / med[1] for r in med}
            ceiling = max(r / rel[r] for r in rows if r > 1) if len(rows) > 1 else 1.0
            entry = {"seconds": med, "relative": rel, "ceiling": ceiling}
            print(f"history {context}: " + "  ".join(f"{r}:{med[r] * 1000:.0f} ms ({rel[r]:.2f})" for r in med))
            print(f"  ceiling with a free, always-accepted draft: {ceiling:.2f}x")
            if args.last_row:
                last = measure(rt, context, args.rounds, rng, rows, every_row=False)
                entry["last_row_seconds"] = last
                print("  last row's logits only: " + "  ".join(f"{r}:{last[r] * 1000:.0f} ms ({last[r] / med[1]:.2f})"
                                                              for r in last))
            report["contexts"][context] = entry
    finally:
        rt.close()
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
