"""Scoring policies: P(the request needs a tier above the cheapest one).

Two policies:

- `HeuristicPolicy`, used when no trained weights exist. Its score is a logistic function of a
  hand-set sum over the features (see `features.FEATURE_NAMES`)::

      z = -0.6
          + 0.35 * max(0, numbers - 2)        # multi-step arithmetic carries many quantities
          + 0.25 * step_words                 # then / if / except / each / only ...: conditions
          + 0.20 * max(0, sentences - 2)      # a longer chain of facts or requirements
          + 0.80 * (log_tokens - log(61))     # longer than ~60 tokens (~240 chars) costs more
          + 0.30 * max(0, turns - 1)          # deep conversations carry more context
          + 0.05 * code_markers
          + 0.30 * max(0, log_max_tokens - log(257))   # a long answer was asked for
      score = 1 / (1 + exp(-z)),  threshold 0.5

- `LogisticPolicy`, logistic regression over the standardised features and (optionally) the
  MiniLM sentence embedding of the request, fitted by Newton's method with an L2 penalty
  (numpy only). Its weights live in a JSON file (never pickle); the threshold is the quantile
  of its training scores that sends the profile's `large_share` of requests to the large tier.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from localspec.errors import ConfigError
from localspec.logistic import fit_logistic, sigmoid
from localspec.router.features import FEATURE_NAMES, feature_vector

WEIGHTS_FORMAT = "localspec-router-weights"
WEIGHTS_VERSION = 1
HEURISTIC_THRESHOLD = 0.5


class HeuristicPolicy:
    """The documented hand-set rule (module docstring); needs no training and no embedder."""

    name = "heuristic"
    uses_embedding = False
    threshold = HEURISTIC_THRESHOLD

    def score(self, features: dict[str, float], embedding: np.ndarray | None = None) -> float:
        f = features
        z = (
            -0.6
            + 0.35 * max(0.0, f["numbers"] - 2)
            + 0.25 * f["step_words"]
            + 0.20 * max(0.0, f["sentences"] - 2)
            + 0.80 * (f["log_tokens"] - math.log(61))
            + 0.30 * max(0.0, f["turns"] - 1)
            + 0.05 * f["code_markers"]
            + 0.30 * max(0.0, f["log_max_tokens"] - math.log(257))
        )
        return float(sigmoid(z))

    def describe(self, features: dict[str, float]) -> str:
        """The features that pushed the score up most, for the one-line reason."""
        parts = []
        if features["numbers"] > 2:
            parts.append(f"{int(features['numbers'])} numbers")
        if features["step_words"] >= 2:
            parts.append(f"{int(features['step_words'])} conditions/steps")
        if features["log_tokens"] > math.log(61):
            parts.append(f"~{int(math.expm1(features['log_tokens']))} tokens")
        if features["turns"] > 1:
            parts.append(f"{int(features['turns'])} turns")
        return ", ".join(parts) or "short, simple request"


@dataclass
class LogisticPolicy:
    """Logistic regression over [standardised features, weighted embedding]."""

    feature_names: list[str]
    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: float
    embedding_dim: int = 0  # 0: features only
    embedding_model: str | None = None
    train_scores: list[float] = field(default_factory=list)
    l2: float = 1.0
    embedding_weight: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)
    threshold: float = 0.5
    name = "learned"

    @property
    def uses_embedding(self) -> bool:
        return self.embedding_dim > 0

    def inputs(self, features: dict[str, float], embedding: np.ndarray | None) -> np.ndarray:
        x = np.asarray(feature_vector(features), dtype=np.float64)
        if not self.uses_embedding:
            return (x - self.mean) / self.scale
        if embedding is None or embedding.shape[0] != self.embedding_dim:
            # No vector (text over the embedder's window): the training mean, i.e. no push either way.
            n = len(x)
            return np.concatenate([(x - self.mean[:n]) / self.scale[:n], np.zeros(self.embedding_dim)])
        x = np.concatenate([x, np.asarray(embedding, dtype=np.float64)])
        return (x - self.mean) / self.scale

    def score(self, features: dict[str, float], embedding: np.ndarray | None = None) -> float:
        return float(sigmoid(self.inputs(features, embedding) @ self.coef + self.intercept))

    def set_share(self, large_share: float) -> None:
        """The threshold that sends `large_share` of the training requests to the large tier."""
        self.threshold = share_threshold(self.train_scores, large_share)

    def describe(self, features: dict[str, float]) -> str:
        """The standardised features contributing most to the score."""
        x = (np.asarray(feature_vector(features)) - self.mean[: len(FEATURE_NAMES)]) / self.scale[: len(FEATURE_NAMES)]
        contrib = x * self.coef[: len(FEATURE_NAMES)]
        top = np.argsort(-np.abs(contrib))[:2]
        parts = [f"{FEATURE_NAMES[i]} {'+' if contrib[i] >= 0 else '-'}{abs(contrib[i]):.2f}" for i in top]
        if self.uses_embedding:
            parts.append("embedding")
        return ", ".join(parts)

    # ---------------------------------------------------------------- JSON

    def to_json(self) -> dict[str, Any]:
        return {
            "format": WEIGHTS_FORMAT,
            "version": WEIGHTS_VERSION,
            "feature_names": list(self.feature_names),
            "embedding": {"model": self.embedding_model, "dim": self.embedding_dim} if self.uses_embedding else None,
            "mean": [float(v) for v in self.mean],
            "scale": [float(v) for v in self.scale],
            "coef": [float(v) for v in self.coef],
            "intercept": float(self.intercept),
            "l2": self.l2,
            "embedding_weight": self.embedding_weight,
            "train_scores": [round(float(v), 6) for v in self.train_scores],
            "meta": self.meta,
        }

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> LogisticPolicy:
        """Read weights JSON; anything malformed is a ConfigError naming the file and the field."""
        fix = f"Retrain with `localspec router train`, or delete {path}."
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"Cannot read router weights {path}: {exc.strerror or exc}.", fix) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"Router weights {path} are not valid JSON: {exc}.", fix) from None
        try:
            return cls.from_json(raw)
        except ValueError as exc:
            raise ConfigError(f"Router weights {path}: {exc}.", fix) from None

    @classmethod
    def from_json(cls, raw: Any) -> LogisticPolicy:
        if not isinstance(raw, dict) or raw.get("format") != WEIGHTS_FORMAT:
            raise ValueError(f"not a {WEIGHTS_FORMAT} file")
        if raw.get("version") != WEIGHTS_VERSION:
            raise ValueError(f"version {raw.get('version')!r} is not the supported {WEIGHTS_VERSION}")
        names = raw.get("feature_names")
        if names != list(FEATURE_NAMES):
            raise ValueError("feature_names differ from this version's features")
        emb = raw.get("embedding")
        dim, model = 0, None
        if emb is not None:
            if not isinstance(emb, dict) or not isinstance(emb.get("dim"), int) or emb["dim"] <= 0:
                raise ValueError("embedding must be null or {model, dim > 0}")
            dim, model = emb["dim"], emb.get("model")
        n = len(FEATURE_NAMES) + dim

        def vec(key: str, positive: bool = False) -> np.ndarray:
            v = raw.get(key)
            if not isinstance(v, list) or len(v) != n or not all(isinstance(a, (int, float)) for a in v):
                raise ValueError(f"{key} must be a list of {n} numbers")
            arr = np.asarray(v, dtype=np.float64)
            if not np.all(np.isfinite(arr)) or (positive and np.any(arr <= 0)):
                raise ValueError(f"{key} holds {'non-positive or ' if positive else ''}non-finite values")
            return arr

        intercept = raw.get("intercept")
        if not isinstance(intercept, (int, float)) or not math.isfinite(intercept):
            raise ValueError("intercept must be a finite number")
        scores = raw.get("train_scores", [])
        if not isinstance(scores, list) or not all(isinstance(s, (int, float)) and 0 <= s <= 1 for s in scores):
            raise ValueError("train_scores must be a list of numbers in [0, 1]")
        return cls(
            feature_names=list(names), mean=vec("mean"), scale=vec("scale", positive=True), coef=vec("coef"),
            intercept=float(intercept), embedding_dim=dim, embedding_model=model, train_scores=list(scores),
            l2=float(raw.get("l2", 1.0)), embedding_weight=float(raw.get("embedding_weight", 0.0)),
            meta=dict(raw.get("meta") or {}),
        )


def share_threshold(scores: list[float] | np.ndarray, large_share: float) -> float:
    """The score above which `large_share` of `scores` lie (1.0 + eps: none; 0.0: all)."""
    s = np.sort(np.asarray(scores, dtype=np.float64))
    if len(s) == 0:
        return HEURISTIC_THRESHOLD
    if large_share <= 0:
        return float(np.nextafter(1.0, 2.0))
    if large_share >= 1:
        return 0.0
    k = int(round(len(s) * (1.0 - large_share)))  # this many stay on the small tier
    k = min(max(k, 0), len(s) - 1)
    return float(s[k])


# ---------------------------------------------------------------- fitting


def _log_loss(p: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    p = np.clip(p, 1e-9, 1 - 1e-9)
    return float(-(w * (y * np.log(p) + (1 - y) * np.log(1 - p))).sum() / w.sum())


def _design(F: np.ndarray, E: np.ndarray | None, alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Standardise features; centre the embedding block and scale it so its total variance is
    `alpha` times the features' (384 dims would otherwise drown 11 features)."""
    mean = F.mean(axis=0)
    scale = F.std(axis=0)
    scale[scale < 1e-9] = 1.0
    if E is None or alpha <= 0:
        return (F - mean) / scale, mean, scale
    e_mean = E.mean(axis=0)
    total = float(((E - e_mean) ** 2).sum(axis=1).mean()) or 1.0
    # Each embedding dim gets the same divisor: sqrt(total / (alpha * n_features)).
    e_scale = np.full(E.shape[1], math.sqrt(total / (alpha * F.shape[1])))
    X = np.hstack([(F - mean) / scale, (E - e_mean) / e_scale])
    return X, np.concatenate([mean, e_mean]), np.concatenate([scale, e_scale])


def train_policy(
    F: np.ndarray, y: np.ndarray, E: np.ndarray | None = None, weights: np.ndarray | None = None,
    embedding_model: str | None = None, l2_grid: tuple[float, ...] = (0.3, 1.0, 3.0, 10.0, 30.0),
    alpha_grid: tuple[float, ...] = (0.0, 0.5, 2.0), folds: int = 5, seed: int = 0,
) -> LogisticPolicy:
    """Fit the policy; L2 strength and the embedding's weight are picked by k-fold log-loss.

    `alpha` 0 means features only; the chosen model records whether it needs the embedder.
    """
    F = np.asarray(F, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    w = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=np.float64)
    if len(y) < 4 or y[w > 0].min() == y[w > 0].max():
        raise ValueError("training needs at least 4 labelled examples of both classes")
    alphas = alpha_grid if E is not None else (0.0,)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    fold_of = np.empty(len(y), dtype=int)
    # Stratified: deal each class round-robin into the folds.
    for cls in (0.0, 1.0):
        idx = order[y[order] == cls]
        fold_of[idx] = np.arange(len(idx)) % folds
    best: tuple[float, float, float] | None = None
    for alpha in alphas:
        for l2 in l2_grid:
            losses = []
            for k in range(folds):
                tr, te = fold_of != k, fold_of == k
                if not te.any() or y[tr].min() == y[tr].max():
                    continue
                X, mean, scale = _design(F[tr], E[tr] if E is not None else None, alpha)
                coef, b = fit_logistic(X, y[tr], l2, w[tr])
                Xt = np.hstack([F[te], E[te]]) if (E is not None and alpha > 0) else F[te]
                p = sigmoid(((Xt - mean) / scale) @ coef + b)
                losses.append(_log_loss(p, y[te], w[te]))
            loss = float(np.mean(losses)) if losses else math.inf
            if best is None or loss < best[0] - 1e-9:
                best = (loss, alpha, l2)
    assert best is not None
    _, alpha, l2 = best
    X, mean, scale = _design(F, E, alpha)
    coef, b = fit_logistic(X, y, l2, w)
    scores = sigmoid(X @ coef + b)
    uses_emb = E is not None and alpha > 0
    return LogisticPolicy(
        feature_names=list(FEATURE_NAMES), mean=mean, scale=scale, coef=coef, intercept=b,
        embedding_dim=int(E.shape[1]) if E is not None and uses_emb else 0,
        embedding_model=embedding_model if uses_emb else None,
        train_scores=[float(s) for s in scores], l2=l2, embedding_weight=alpha if uses_emb else 0.0,
        meta={"n": int(len(y)), "positives": int((y * (w > 0)).sum()), "cv_log_loss": round(best[0], 4)},
    )
