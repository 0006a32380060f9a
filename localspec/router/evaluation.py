"""`localspec router eval`: train on part of the tasks, measure routing on the rest (k-fold by default).

Labelling (for training the learned policy from outcomes):
- label 1, "needs large": the small tier fails and the large tier passes;
- label 0: the small tier passes (whatever the large tier does);
- tasks both tiers fail carry no information about which tier to pick and are left out.

The held-out half is scored by the learned policy, the heuristic, a cascade on the small tier's
own confidence (score = -mean token logprob; needs the small answer first, so it is reported as
a reference, not as a router that saves the small tier's cost) and the random router.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localspec.router.curve import RouterReport, evaluate_router
from localspec.router.features import extract_features, feature_vector, request_text
from localspec.router.outcomes import Outcome
from localspec.router.policy import HeuristicPolicy, LogisticPolicy, train_policy
from localspec.router.tasks import Task, jsonl_rows


@dataclass(frozen=True)
class Labelled:
    """One training example for the policy."""

    messages: list[dict] | None
    prompt: str | None
    max_tokens: int | None
    label: int
    weight: float = 1.0


def label_of(small_passed: bool, large_passed: bool) -> int | None:
    if small_passed:
        return 0
    if large_passed:
        return 1
    return None  # both fail: left out


def labels_from_outcomes(tasks: list[Task], small: dict[str, Outcome], large: dict[str, Outcome],
                         max_tokens: int) -> list[Labelled]:
    out = []
    for t in tasks:
        y = label_of(small[t.id].passed, large[t.id].passed)
        if y is not None:
            out.append(Labelled(t.messages(), None, max_tokens, y))
    return out


def write_labels(path: Path, examples: list[Labelled]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for e in examples:
            row: dict[str, object] = {"messages": e.messages} if e.messages is not None else {"prompt": e.prompt}
            row.update(max_tokens=e.max_tokens, label=e.label)
            if e.weight != 1.0:
                row["weight"] = e.weight
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_labels(path: Path) -> list[Labelled]:
    """JSON lines: {"messages": [...]} or {"prompt": "..."}, optional "max_tokens", "label": 0|1,
    optional "weight"."""
    from localspec.errors import ConfigError

    out = []
    fix = 'Each line: {"prompt": "..."} or {"messages": [...]}, and "label": 0 or 1.'
    for n, raw in jsonl_rows(path, "labelled example", fix):
        try:
            if raw.get("label") not in (0, 1):
                raise ValueError("label must be 0 or 1")
            messages, prompt, max_tokens = raw.get("messages"), raw.get("prompt"), raw.get("max_tokens")
            if (messages is None) == (prompt is None):
                raise ValueError("give exactly one of messages or prompt")
            # Checked here, at the line, so a wrong type never surfaces later as a training traceback.
            if messages is not None and not (isinstance(messages, list) and all(isinstance(m, dict) for m in messages)):
                raise ValueError("messages must be a list of objects")
            if prompt is not None and not isinstance(prompt, str):
                raise ValueError("prompt must be a string")
            if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
                raise ValueError("max_tokens must be an integer")
            out.append(Labelled(messages, prompt, max_tokens, int(raw["label"]), float(raw.get("weight", 1.0))))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{path}:{n}: not a valid labelled example ({exc}).", fix) from None
    return out


def feature_matrix(examples, embedder=None) -> tuple[np.ndarray, np.ndarray | None]:
    """Features (and embeddings, when an embedder is given) of (messages, prompt, max_tokens) rows."""
    F, E = [], []
    for messages, prompt, max_tokens in examples:
        text = request_text(messages, prompt)
        F.append(feature_vector(extract_features(text, max_tokens, None)))
        if embedder is not None:
            vec = embedder.embed(text.full)
            if vec is None:
                vec = embedder.embed(text.full[-1500:])
            E.append(vec if vec is not None else np.zeros(embedder.dim, dtype=np.float32))
    return np.asarray(F, dtype=np.float64), (np.asarray(E, dtype=np.float64) if embedder is not None else None)


def train_from_labels(examples: list[Labelled], embedder=None, embedding_model: str | None = None) -> LogisticPolicy:
    rows = [(e.messages, e.prompt, e.max_tokens) for e in examples]
    F, E = feature_matrix(rows, embedder)
    y = np.asarray([e.label for e in examples], dtype=np.float64)
    w = np.asarray([e.weight for e in examples], dtype=np.float64)
    return train_policy(F, y, E, w, embedding_model=embedding_model)


@dataclass
class EvalResult:
    tiers: dict[str, dict]
    train_size: float  # tasks each scoring model was trained on (mean over folds)
    held_size: int
    folds: int
    reports: list[RouterReport]
    learned: LogisticPolicy  # trained on every task given: the one --save-weights keeps
    threshold_share: float
    routed_at_threshold: dict

    def as_dict(self) -> dict:
        return {
            "tiers": self.tiers,
            "folds": self.folds,
            "train_tasks": self.train_size,
            "held_out_tasks": self.held_size,
            "evaluation": (f"{self.folds}-fold cross-validation: each task is scored by a policy trained on the "
                           f"other folds' tasks" if self.folds > 1 else "one train / held-out split"),
            "labelling": "1 = small fails and large passes; 0 = small passes; both fail: left out",
            "learned_policy": {"uses_embedding": self.learned.uses_embedding, "l2": self.learned.l2,
                               "embedding_weight": self.learned.embedding_weight, **self.learned.meta},
            "routers": {r.name: r.as_dict() for r in self.reports},
            "at_threshold": self.routed_at_threshold,
        }


def tier_summary(tasks: list[Task], outcomes: dict[str, Outcome]) -> dict:
    passed = [outcomes[t.id].passed for t in tasks]
    lat = [outcomes[t.id].latency_s for t in tasks]
    by_kind = {}
    for kind in sorted({t.kind for t in tasks}):
        ks = [outcomes[t.id].passed for t in tasks if t.kind == kind]
        by_kind[kind] = round(float(np.mean(ks)), 4)
    return {"model": next(iter(outcomes.values())).model, "quality": round(float(np.mean(passed)), 4),
            "quality_by_kind": by_kind, "mean_latency_s": round(float(np.mean(lat)), 3),
            "p50_latency_s": round(float(np.median(lat)), 3)}


def _learned_scores(train: list[Task], held: list[Task], small: dict[str, Outcome], large: dict[str, Outcome],
                    max_tokens: int, embedder, embedding_model: str | None,
                    large_share: float) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """Train on `train`; the held-out tasks' scores, whether each is sent up at the policy's
    threshold for `large_share`, and their features (for the heuristic)."""
    learned = train_from_labels(labels_from_outcomes(train, small, large, max_tokens), embedder, embedding_model)
    learned.set_share(large_share)
    rows = [(t.messages(), None, max_tokens) for t in held]
    F, E = feature_matrix(rows, embedder if learned.uses_embedding else None)
    feats = [dict(zip(learned.feature_names, f, strict=True)) for f in F]
    scores = np.asarray([learned.score(f, E[i] if E is not None else None) for i, f in enumerate(feats)])
    return scores, scores >= learned.threshold, feats


def evaluate(splits: list[tuple[list[Task], list[Task]]], small: dict[str, Outcome], large: dict[str, Outcome],
             max_tokens: int, embedder=None, embedding_model: str | None = None, large_share: float = 0.4,
             resamples: int = 1000, seed: int = 0) -> EvalResult:
    """Score every held-out task with a policy trained on its split's train part, then measure the
    routers over all held-out tasks together (one split: a plain held-out half; k folds: every
    task once)."""
    held: list[Task] = []
    parts = []
    for train, part in splits:
        parts.append(_learned_scores(train, part, small, large, max_tokens, embedder, embedding_model, large_share))
        held += part
    learned_scores = np.concatenate([p[0] for p in parts])
    up = np.concatenate([p[1] for p in parts])
    feats = [f for p in parts for f in p[2]]
    heuristic = HeuristicPolicy()
    heuristic_scores = np.asarray([heuristic.score(f) for f in feats])
    s_out = np.asarray([float(small[t.id].passed) for t in held])
    l_out = np.asarray([float(large[t.id].passed) for t in held])
    confidence = np.asarray([-(small[t.id].mean_logprob or 0.0) for t in held])  # None: no logprobs, 0
    reports = [
        evaluate_router("learned", learned_scores, s_out, l_out, resamples, seed),
        evaluate_router("heuristic", heuristic_scores, s_out, l_out, resamples, seed),
        evaluate_router("cascade-confidence", confidence, s_out, l_out, resamples, seed),
        evaluate_router("random", np.zeros(len(held)), s_out, l_out, resamples, seed, random_scores=True),
    ]
    # What each policy's saved threshold (its training-score quantile for large_share) does on its held-out tasks.
    routed_q = float(np.mean(np.where(up, l_out, s_out)))
    lat_s = np.asarray([small[t.id].latency_s for t in held])
    lat_l = np.asarray([large[t.id].latency_s for t in held])
    at_threshold = {
        "target_large_share": large_share, "large_share": round(float(up.mean()), 4), "quality": round(routed_q, 4),
        "mean_latency_s": round(float(np.mean(np.where(up, lat_l, lat_s))), 3),
    }
    # k folds: the kept policy learns from every task (each split holds them all); a single split
    # keeps the policy it was measured with.
    kept = splits[0][0] if len(splits) == 1 else splits[0][0] + splits[0][1]
    final = train_from_labels(labels_from_outcomes(kept, small, large, max_tokens), embedder, embedding_model)
    final.set_share(large_share)
    at_threshold["threshold"] = round(final.threshold, 4)
    tiers = {"small": tier_summary(held, small), "large": tier_summary(held, large)}
    tiers["large"]["note"] = "target alone, mode off: identical greedy output to target + draft"
    train_size = float(np.mean([len(train) for train, _ in splits]))
    return EvalResult(tiers, train_size, len(held), len(splits), reports, final, large_share, at_threshold)


def chart(result: EvalResult, path: Path) -> bool:
    """Quality against large share for each router; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for r in result.reports:
        if r.name == "random":
            ax.plot([0, 1], [r.quality_at[0.0], r.quality_at[1.0]], "--", color="grey", label="random (expected)")
        else:
            ax.plot(r.curve.shares, r.curve.quality, label=f"{r.name} (APGR {r.apgr.value:.2f})")
    ax.set_xlabel("share of calls to the large tier")
    ax.set_ylabel("held-out pass rate")
    ax.set_title("Router: quality against large-tier share")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True
