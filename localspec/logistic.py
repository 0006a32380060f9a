"""Logistic regression in numpy, shared by the router's policy and the cache's pair scorer.

Both fit a few hundred to a few thousand labelled examples once, offline, and save the weights as
JSON; Newton's method on the L2-penalised log-likelihood converges in a handful of steps there, so
neither needs scikit-learn at run time.
"""

from __future__ import annotations

from typing import overload

import numpy as np


@overload
def sigmoid(z: float) -> float: ...
@overload
def sigmoid(z: np.ndarray) -> np.ndarray: ...
def sigmoid(z: np.ndarray | float) -> np.ndarray | float:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -40.0, 40.0)))


def fit_logistic(X: np.ndarray, y: np.ndarray, l2: float, weights: np.ndarray | None = None,
                 iters: int = 50) -> tuple[np.ndarray, float]:
    """Weighted L2-penalised logistic regression by Newton's method.

    The penalty applies to X's columns as given (standardise them first if they should weigh alike);
    the intercept is not penalised. Returns (coef, intercept).
    """
    n, d = X.shape
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    A = np.hstack([X, np.ones((n, 1))])
    beta = np.zeros(d + 1)
    penalty = np.full(d + 1, l2)
    penalty[-1] = 0.0
    for _ in range(iters):
        p = sigmoid(A @ beta)
        grad = A.T @ (w * (p - y)) + penalty * beta
        hess = (A * (w * p * (1 - p))[:, None]).T @ A + np.diag(penalty) + 1e-9 * np.eye(d + 1)
        step = np.linalg.solve(hess, grad)
        beta -= step
        if np.max(np.abs(step)) < 1e-8:
            break
    return beta[:-1], float(beta[-1])
