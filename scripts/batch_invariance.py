"""Does a row's logits depend on the batch it is read in? (issue #31: near-ties and asked-again copies)

Reads 500 tokens of this file as the KV, then the next 48 tokens' logits one row a pass, and again in
passes of 2, 5, 16 and 48 rows; prints the largest logit difference against the one-row passes and
how many of the 48 argmaxes differ, with llama.cpp's repacked weights and without, and each one's
time per pass of 1 and 49 rows. Then 64 rows in other plans of passes (8 x 8, 17 x 3 + 13, 63 + 1, ...):
how many rows' logits differ at all from 16-row passes', which shows the kernels a pass takes by size.

    python scripts/batch_invariance.py [--profile default] [--threads 2]

Needs the profile's target model. Measured figures: docs/auto-mode.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from localspec.engine.calibrate import logits_in_passes, logits_in_plan
from localspec.engine.runtime import ModelRuntime, Row, RuntimeConfig
from localspec.models import ModelManager

SIZES = (2, 5, 16, 48)
PLANS = {"1 x 64": [1] * 64, "4 x 16": [4] * 16, "8 x 8": [8] * 8, "9 x 7 + 1": [9] * 7 + [1],
         "17 x 3 + 13": [17] * 3 + [13], "48 + 16": [48, 16], "63 + 1": [63, 1], "64": [64]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    mm = ModelManager()
    path = mm.require_path(mm.profile(args.profile).target)
    text = Path(__file__).read_text() * 4
    for repack in (True, False):
        rt = ModelRuntime(path, RuntimeConfig(n_ctx=2048, n_seq_max=1, n_threads=args.threads, repack_weights=repack))
        try:
            tokens = rt.tokenize(text)
            context, rows = tokens[:500], tokens[500:548]
            rt.decode([Row(token=t, pos=i, seq=0, logits=(i == len(context) - 1)) for i, t in enumerate(context)])
            single = logits_in_passes(rt, context, rows, 1)
            again = logits_in_passes(rt, context, rows, 1)
            by_size = {}
            for size in SIZES:
                got = logits_in_passes(rt, context, rows, size)
                by_size[size] = (float(np.abs(got - single).max()), int((got.argmax(1) != single.argmax(1)).sum()))
            by_16 = logits_in_plan(rt, context, tokens[500:564], [16] * 4)
            plans = {name: np.abs(logits_in_plan(rt, context, tokens[500:564], plan) - by_16).max(axis=1)
                     for name, plan in PLANS.items()}
            times: dict[int, list[float]] = {1: [], 49: []}
            for _ in range(5):
                for n in times:
                    rt.seq_rm(0, len(context), -1)
                    batch = [Row(token=t, pos=len(context) + i, seq=0, logits=True) for i, t in enumerate((rows * 2)[:n])]
                    t0 = time.perf_counter()
                    rt.decode(batch)
                    times[n].append((time.perf_counter() - t0) * 1000)
        finally:
            rt.close()
        print(f"repacked weights: {repack}")
        print(f"  one row a pass, twice: largest logit difference {float(np.abs(again - single).max()):.3g}")
        for size, (diff, flips) in by_size.items():
            print(f"  {size:2d} rows a pass: largest logit difference {diff:.3g}, argmax differs at {flips} of {len(rows)}")
        print("  ms per pass: " + ", ".join(f"{n} rows {statistics.median(t):.1f}" for n, t in times.items()))
        for name, diff in plans.items():
            rows_off = np.flatnonzero(diff > 0)
            where = f", the first at row {rows_off[0]}" if rows_off.size else ""
            print(f"  64 rows in passes of {name}: {rows_off.size} rows differ from 16-row passes'{where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
