"""Two commits' `localspec bench` alternately, A B A B, and their ratio per suite and mode.

Issue #28 asks that the typed request path make nothing on the token path slower: `bench --quick`
on the old and the new commit alternately, every suite ratio new / old >= 0.97. Each side runs from
its own checkout (`python -m localspec` with the checkout as the working directory, so its own
code) with its own calibration directory, kept across its rounds; the box should run nothing else.

    git worktree add /tmp/old c1b284a            # the commit before the typed request path
    python scripts/ab_bench.py --old /tmp/old --new . --rounds 2 --out ab-quick

A round is one run of each side, in alternating order (A B, then B A), so drift on a shared box
falls on both. Per suite and mode the ratio is the geometric mean over rounds of new / old median
tokens/s; a suite's ratio is the geometric mean over the modes both commits ran. Writes ab.json and
ab.md to --out, with each run's bench output beside them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BAR = 0.97


def run_side(checkout: Path, out: Path, calibration: Path, bench_args: list[str]) -> dict:
    env = {**os.environ, "LOCALSPEC_CALIBRATION_DIR": str(calibration)}
    cmd = [sys.executable, "-m", "localspec", "bench", *bench_args, "--out", str(out)]
    t0 = time.monotonic()
    with open(out.with_suffix(".log"), "w", encoding="utf-8") as log:
        subprocess.run(cmd, cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    print(f"  {checkout} -> {out} in {time.monotonic() - t0:.0f} s", flush=True)
    return json.loads((out / "bench.json").read_text(encoding="utf-8"))["summary"]


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def ratios(old: list[dict], new: list[dict]) -> dict[str, dict[str, float]]:
    """suite -> mode -> geometric mean over rounds of new / old median tokens/s."""
    out: dict[str, dict[str, float]] = {}
    for suite in sorted(set(old[0]) & set(new[0])):
        modes = sorted(set(old[0][suite]) & set(new[0][suite]))
        per_mode = {}
        for mode in modes:
            pairs = [(o[suite][mode].get("median_tps"), n[suite][mode].get("median_tps"))
                     for o, n in zip(old, new, strict=True)]
            pairs = [(a, b) for a, b in pairs if a and b]
            if pairs and not mode.startswith("llama"):
                per_mode[mode] = geomean([b / a for a, b in pairs])
        if per_mode:
            out[suite] = per_mode
    return out


def report(table: dict[str, dict[str, float]], old: list[dict], new: list[dict], args: argparse.Namespace) -> str:
    modes = sorted({m for per in table.values() for m in per})
    lines = [f"A/B: new {args.new} / old {args.old}, {args.rounds} rounds, `bench {' '.join(args.bench_args)}`",
             "", "| suite | " + " | ".join(modes) + " | suite (geomean) |", "|---" * (len(modes) + 2) + "|"]
    for suite, per in table.items():
        cells = [f"{per[m]:.3f}" if m in per else "-" for m in modes]
        lines.append(f"| {suite} | " + " | ".join(cells) + f" | {geomean(list(per.values())):.3f} |")
    lines += ["", "Median tokens/s by round (old -> new):", ""]
    for suite, per in table.items():
        for mode in per:
            o = ", ".join(f"{r[suite][mode]['median_tps']:.1f}" for r in old)
            n = ", ".join(f"{r[suite][mode]['median_tps']:.1f}" for r in new)
            lines.append(f"- {suite} {mode}: {o} -> {n}")
    worst = min(geomean(list(per.values())) for per in table.values())
    lines += ["", f"Lowest suite ratio {worst:.3f}: {'met' if worst >= BAR else 'not met'} (bar {BAR})."]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", type=Path, required=True, help="checkout of the old commit")
    p.add_argument("--new", type=Path, required=True, help="checkout of the new commit")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("ab-out"))
    p.add_argument("bench_args", nargs="*", default=["--quick", "--no-anchors", "--no-memory", "--threads", "2"],
                   help="arguments for `localspec bench` (after --)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    calibration = {side: Path(tempfile.mkdtemp(prefix=f"ab-cal-{side}-")) for side in ("old", "new")}
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for r in range(args.rounds):
        order = ("old", "new") if r % 2 == 0 else ("new", "old")
        print(f"round {r + 1} of {args.rounds}: {' then '.join(order)}", flush=True)
        for side in order:
            checkout = args.old if side == "old" else args.new
            runs[side].append(run_side(checkout.resolve(), args.out / f"{side}-{r + 1}", calibration[side],
                                       args.bench_args))
    table = ratios(runs["old"], runs["new"])
    (args.out / "ab.json").write_text(json.dumps({"ratios": table, "old": runs["old"], "new": runs["new"]}, indent=1))
    md = report(table, runs["old"], runs["new"], args)
    (args.out / "ab.md").write_text(md, encoding="utf-8")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
