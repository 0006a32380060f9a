"""Does `auto` recover from a calibration taken on a busy box? (issue #31's recovery goal)

Each pair runs two processes, alternately: one starts from the busy-box curve quoted in #31
(planted, 2 rows "costing" 2.4 single steps), the other from a clean calibration measured in
that process on this box as it is. Each answers the same rename edit twice (256 tokens, greedy).
The goal: the planted process's second answer runs at >= 0.9x the clean one's (median of pairs).

    python scripts/auto_recovery.py [--pairs 3] [--max-tokens 256] [--noisy] [--out recovery.json]

`--noisy`: the bench's CPU hog runs beside every pair (one core at 100% for the first 60 s, then 50%),
so the clean processes calibrate, and both answer, on a busy box.

Needs the default profile's models. Prints one JSON line per process, then the summary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BUSY_BOX = [0.080, 0.195, 0.265, 0.426, 0.586, 0.556, 0.527, 0.497, 0.467]

MODULE = '''"""Invoices: line items, totals and a printable summary."""

from dataclasses import dataclass, field


@dataclass
class LineItem:
    name: str
    quantity: int
    unit_price: float

    def cost(self) -> float:
        return self.quantity * self.unit_price


@dataclass
class Invoice:
    number: str
    customer: str
    items: list[LineItem] = field(default_factory=list)
    tax_rate: float = 0.2

    def add(self, name: str, quantity: int, unit_price: float) -> None:
        self.items.append(LineItem(name, quantity, unit_price))


def compute_total(invoice: Invoice) -> float:
    """The invoice's total before tax: compute_total sums every line item."""
    return sum(item.cost() for item in invoice.items)


def tax(invoice: Invoice) -> float:
    return compute_total(invoice) * invoice.tax_rate


def grand_total(invoice: Invoice) -> float:
    return compute_total(invoice) + tax(invoice)


def summary(invoice: Invoice) -> str:
    lines = [f"Invoice {invoice.number} for {invoice.customer}"]
    for item in invoice.items:
        lines.append(f"  {item.name}: {item.quantity} x {item.unit_price:.2f} = {item.cost():.2f}")
    lines.append(f"  subtotal (compute_total): {compute_total(invoice):.2f}")
    lines.append(f"  tax: {tax(invoice):.2f}")
    lines.append(f"  total: {grand_total(invoice):.2f}")
    return "\\n".join(lines)
'''

PROMPT = ("Rename the function `compute_total` to `subtotal` everywhere in this module: its definition, "
          "every call and every mention in docstrings and strings. Return the whole module and nothing else.\n\n"
          f"```python\n{MODULE}```")


def child(start: str, max_tokens: int, threads: int | None) -> None:
    from localspec.engine.config import GenerationRequest
    from localspec.engine.costs import Costs
    from localspec.engine.events import Done
    from localspec.service import open_engine

    engine = open_engine(mode="auto", n_threads=threads)
    try:
        if start == "busy-box":
            engine.costs = Costs(verify=BUSY_BOX, draft_step=0.142, draft_row=0.02)
        request = GenerationRequest(messages=[{"role": "user", "content": PROMPT}], max_tokens=max_tokens)
        answers = []
        for _ in range(2):
            done = next(e for e in engine.generate(request) if isinstance(e, Done))
            st = done.stats
            answers.append({"tokens_per_second": round(st.tokens_per_second, 2), "tokens": st.completion_tokens,
                            "auto_steps": st.auto_steps, "explored": st.explored, "drafted": st.drafted,
                            "accepted": st.accepted, "why_not": st.auto_why_not, "text_hash": hash(done.text)})
        curve = [round(engine.costs.steps(n), 2) for n in (1, 2, 3, 5, 9)] if engine.costs else None
        print(json.dumps({"start": start, "answers": answers, "final_steps_by_rows_1_2_3_5_9": curve}))
    finally:
        engine.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--noisy", action="store_true", help="run the bench's CPU hog beside the processes")
    ap.add_argument("--child", choices=["busy-box", "clean"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.max_tokens, args.threads)
        return 0
    from localspec.bench.hog import CpuHog, HogSchedule

    runs: list[dict] = []
    with contextlib.ExitStack() as stack:
        hog = stack.enter_context(CpuHog(HogSchedule())) if args.noisy else None
        pairs(args, runs)
        usage = hog.stop() if hog is not None else None
    ratios = []
    for pair in range(args.pairs):
        by = {r["start"]: r for r in runs if r["pair"] == pair}
        ratios.append(by["busy-box"]["answers"][1]["tokens_per_second"] / by["clean"]["answers"][1]["tokens_per_second"])
    summary = {"second_answer_ratio_busy_box_to_clean": [round(r, 3) for r in ratios],
               "median": round(statistics.median(ratios), 3), "goal": ">= 0.9",
               "noisy": {**HogSchedule().to_json(), "usage": usage.to_json() if usage else None} if args.noisy else None,
               "runs": runs}
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


def pairs(args: argparse.Namespace, runs: list[dict]) -> None:
    """The processes, pair by pair, each pair's two in alternating order; appends each one's line to `runs`."""
    for pair in range(args.pairs):
        order = ["busy-box", "clean"] if pair % 2 == 0 else ["clean", "busy-box"]
        for start in order:
            with tempfile.TemporaryDirectory() as cal:  # no shared file: each process starts where it is told
                env = {**os.environ, "LOCALSPEC_CALIBRATION_DIR": cal}
                cmd = [sys.executable, __file__, "--child", start, "--max-tokens", str(args.max_tokens)]
                if args.threads:
                    cmd += ["--threads", str(args.threads)]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
            line = json.loads(out.strip().splitlines()[-1])
            line["pair"] = pair
            print(json.dumps(line), flush=True)
            runs.append(line)


if __name__ == "__main__":
    raise SystemExit(main())
