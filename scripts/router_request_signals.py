"""How much can a router that reads only the request gain on this task set? (issue #7)

`localspec router eval` reports the learned policy (logistic regression over the request's
features and its MiniLM embedding, trained on "small fails and large passes" against "small
passes", tasks both tiers fail left out). This script measures, on the same 5 folds, the same
shipped outcomes and with the same metrics (APGR and CPT(50%), bootstrap 95% intervals), what
else a request-only router could do:

- kind only: every math task before every code task, in random order within each kind (the point
  value is the mean over 500 orders);
- the learned policy as shipped, and on the features alone;
- the learned policy over the 0.5B model's own view of the request (its last hidden layer,
  mean-pooled, through localspec's Embedder) instead of MiniLM's;
- other targets for the same model: "small fails and large passes" against every other task
  (both-fail tasks count as "escalating does not help"), and two models, P(large passes) minus
  P(small passes), whose difference is the expected gain of escalating a task;
- references: a perfect request router (the tasks escalation helps first), and a perfect detector
  of the small tier's failures (what a cascade's signal can reach at best).

    python scripts/router_request_signals.py [--out docs/router/request-signals.json] [--chart ....png]

About 5 minutes on a 2-core CPU (most of it embedding the 383 requests with the 0.5B model).
Needs the profile's small model and embedding model installed; generates no answers.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from localspec.router import evaluation as ev
from localspec.router.curve import evaluate_router, routing_curve
from localspec.router.outcomes import OutcomeCache
from localspec.router.policy import train_policy
from localspec.router.tasks import Task, kfold, load_tasks, shipped_outcomes

FOLDS = 5
MAX_TOKENS = 512
DRAWN = ("kind only (math first)", "learned, as shipped", "learned, P(large passes) - P(small passes)",
         "ceiling: perfect request router", "ceiling: perfect failure detector (cascade)")


def cv_scores(tasks: list[Task], F: np.ndarray, E: np.ndarray | None,
              label: Callable[[int], int | None], keep: float = 1.0, seed: int = 0) -> np.ndarray:
    """Each task's score from a policy trained (as `router train` trains) on the other folds, or on
    a random `keep` share of them (the learning curve)."""
    row = {t.id: i for i, t in enumerate(tasks)}
    out = np.full(len(tasks), np.nan)
    rng = np.random.default_rng(seed)
    for train, held in kfold(tasks, FOLDS):
        if keep < 1.0:
            train = [train[j] for j in sorted(rng.choice(len(train), int(round(keep * len(train))), replace=False))]
        tr = [row[t.id] for t in train if label(row[t.id]) is not None]
        y = np.asarray([label(i) for i in tr], dtype=np.float64)
        policy = train_policy(F[tr], y, E[tr] if E is not None else None)
        for t in held:
            i = row[t.id]
            features = dict(zip(policy.feature_names, F[i], strict=True))
            out[i] = policy.score(features, E[i] if E is not None else None)
    return out


def expected_quality(scores: np.ndarray, small: np.ndarray, large: np.ndarray, draws: int = 500) -> np.ndarray:
    """Routed quality at each large share, averaged over random orders among tied scores."""
    rng = np.random.default_rng(0)
    return np.mean([routing_curve(scores, small, large, rng.permutation(len(scores))).quality
                    for _ in range(draws)], axis=0)


def draw(curves: dict[str, np.ndarray], small: np.ndarray, large: np.ndarray, path: Path) -> bool:
    """Quality against large share for each router; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for name, quality in curves.items():
        shares = np.arange(len(quality)) / (len(quality) - 1)
        style = ":" if name.startswith("ceiling") else "-"
        ax.plot(shares, quality, style, label=name)
    ax.plot([0, 1], [small.mean(), large.mean()], "--", color="grey", label="random (expected)")
    ax.set_xlabel("share of calls to the large tier")
    ax.set_ylabel("held-out pass rate")
    ax.set_title("Request-only routers, 5-fold CV on the 383 shipped tasks")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--outcomes", type=Path, default=None, help="default: evals/router/outcomes.json")
    ap.add_argument("--out", type=Path, default=Path("docs/router/request-signals.json"))
    ap.add_argument("--chart", type=Path, default=Path("docs/router/request-signals.png"))
    ap.add_argument("--resamples", type=int, default=1000)
    args = ap.parse_args()

    from localspec.cli.router_cmd import _embedder, _profile
    from localspec.engine.embedder import Embedder

    tasks = load_tasks()
    cache = OutcomeCache(args.outcomes or shipped_outcomes())
    S = np.asarray([float(cache.find(t, "small", MAX_TOKENS).passed) for t in tasks])
    L = np.asarray([float(cache.find(t, "large", MAX_TOKENS).passed) for t in tasks])
    is_math = np.asarray([float(t.kind == "math") for t in tasks])
    rows = [(t.messages(), None, MAX_TOKENS) for t in tasks]

    mm, _, profile = _profile(None)
    minilm, minilm_id = _embedder(mm, profile, False)
    F, E_minilm = ev.feature_matrix(rows, minilm)
    minilm.close()
    small_path = mm.require_path(mm.resolve(profile.small).id)
    print(f"embedding {len(tasks)} requests with {small_path.name} ...", flush=True)
    with Embedder(small_path, n_threads=2) as own:
        _, E_small = ev.feature_matrix(rows, own)

    def shipped_label(i: int) -> int | None:
        return ev.label_of(bool(S[i]), bool(L[i]))

    def gain_vs_rest(i: int) -> int:
        return int(L[i] == 1 and S[i] == 0)

    rng = np.random.default_rng(1)
    routers: dict[str, tuple[np.ndarray, str]] = {
        "kind only (math first)": (is_math, "no model: every math task, then every code task"),
        "learned, as shipped": (cv_scores(tasks, F, E_minilm, shipped_label), f"features + {minilm_id}"),
        "learned, features only": (cv_scores(tasks, F, None, shipped_label), "features, no embedding"),
        "learned, the 0.5B's own embedding": (cv_scores(tasks, F, E_small, shipped_label),
                                              f"features + {small_path.stem}, mean-pooled"),
        "learned, gain against every other task": (cv_scores(tasks, F, E_minilm, gain_vs_rest),
                                                   "label 1: small fails and large passes; 0: the rest"),
        "learned, P(large passes) - P(small passes)": (
            cv_scores(tasks, F, E_minilm, lambda i: int(L[i])) - cv_scores(tasks, F, E_minilm, lambda i: int(S[i])),
            "two policies on every task; their difference is the expected gain"),
        "ceiling: perfect request router": ((L - S) + 1e-3 * rng.random(len(tasks)),
                                            "the true gain of each task: helped first, hurt last"),
        "ceiling: perfect failure detector (cascade)": (1.0 - S, "every small failure first, random among them"),
    }
    report: dict = {"tasks": len(tasks), "folds": FOLDS, "max_tokens": MAX_TOKENS,
                    "small_quality": round(float(S.mean()), 4), "large_quality": round(float(L.mean()), 4),
                    "routers": {}}
    print(f"{'router':46s} {'APGR [95% CI]':24s} CPT(50%) [95% CI]")
    curves: dict[str, np.ndarray] = {}
    for name, (scores, how) in routers.items():
        r = evaluate_router(name, scores, S, L, args.resamples, 0)
        tied = len(np.unique(scores)) < len(scores)
        quality = expected_quality(scores, S, L) if tied else r.curve.quality
        apgr = float(np.mean((quality - S.mean()) / (L.mean() - S.mean())))
        if name in DRAWN:
            curves[name] = quality
        d = r.as_dict()
        report["routers"][name] = {"how": how, "apgr": {"value": round(apgr, 4), "ci95": d["apgr"]["ci95"]},
                                   "cpt50": d["cpt50"], "tied_scores_averaged": tied}
        lo, hi = d["apgr"]["ci95"]
        clo, chi = d["cpt50"]["ci95"]
        print(f"{name:46s} {apgr:.3f} [{lo:.3f}, {hi:.3f}]     {r.cpt50.value:.3f} [{clo:.3f}, {chi:.3f}]")
    # Learning curve: does the shipped policy gain from more training tasks?
    print("learning curve (learned, as shipped; mean over 3 subsamples of each fold's training part):")
    report["learning_curve"] = []
    for keep in (0.25, 0.5, 0.75, 1.0):
        seeds = (0,) if keep == 1.0 else (0, 1, 2)
        apgrs = [evaluate_router("lc", cv_scores(tasks, F, E_minilm, shipped_label, keep, seed), S, L, 0, 0).apgr.value
                 for seed in seeds]
        n_train = int(round(keep * len(tasks) * (FOLDS - 1) / FOLDS))
        report["learning_curve"].append({"train_tasks": n_train, "apgr": [round(a, 4) for a in apgrs]})
        print(f"  {n_train:4d} training tasks: APGR {np.mean(apgrs):.3f} ({', '.join(f'{a:.3f}' for a in apgrs)})",
              flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"written to {args.out}")
    if draw(curves, S, L, args.chart):
        print(f"chart written to {args.chart}")


if __name__ == "__main__":
    main()
