"""How the engine picks the target's tokens from its logits rows: greedy, sampled, under a grammar.

Verification (verify.py) compares these with a draft; nothing here decides what is accepted.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from localspec.engine.sampling import distribution, greedy_token, penalize
from localspec.engine.slots import Active
from localspec.engine.verify import Draft, settle_near_ties

GRAMMAR_REDRAW = 3  # PositionRng purpose of the redraw after the grammar refused a sample


def target_rows(a: Active, rows: np.ndarray, drafted: tuple[int, ...]) -> list[np.ndarray]:
    """Sampled requests: the target's distribution per verify row, with the history up to it."""
    params = a.request.sampling
    return [
        distribution(row, params, a.tokens + list(drafted[:i]) if params.has_penalties else a.tokens)
        for i, row in enumerate(rows)
    ]


def target_tokens(a: Active, rows: np.ndarray, drafted: tuple[int, ...]) -> list[int]:
    """Greedy requests: the target's argmax per verify row, with the history up to it."""
    params = a.request.sampling
    if not params.has_penalties:
        return np.argmax(rows, axis=1).tolist()
    return [greedy_token(row, params, a.tokens + list(drafted[:i])) for i, row in enumerate(rows)]


def settled_targets(a: Active, rows: np.ndarray, d: Draft) -> tuple[list[int], int]:
    """Greedy requests: `target_tokens`, with near-ties settled as the same question's earlier answer settled
    them where the step copies it at exactly its context (`settle_near_ties`); and how many were."""
    targets = target_tokens(a, rows, d.tokens)
    # auto weighed the lookup proposal beside whatever it drafted; lookup drafted (a cut of) it.
    earlier = a.proposal.own_picks or d.own_picks
    if not earlier:
        return targets, 0
    params = a.request.sampling

    def scores(i: int) -> np.ndarray:
        return penalize(rows[i], params, a.tokens + list(d.tokens[:i])) if params.has_penalties else rows[i]

    return settle_near_ties(targets, scores, d.tokens, earlier)


def pick(a: Active, row: np.ndarray) -> int:
    """The target's own token for the next position (no draft involved)."""
    params = a.request.sampling
    pos = len(a.tokens)
    if params.greedy:
        if a.grammar is not None:
            return a.grammar.best(penalize(row, params, a.tokens))
        return greedy_token(row, params, a.tokens)
    p = distribution(row, params, a.tokens)
    token = a.rng.choice(p, pos)
    if a.grammar is None or a.grammar.allows(token):
        return token
    # Refused: redraw from p restricted to the allowed tokens; see grammar.py for why it is exact.
    allowed = np.isfinite(a.grammar.mask(row))
    if not allowed.any():
        return a.grammar.eos
    restricted = np.where(allowed, p, 0.0)
    if restricted.sum() <= 0.0:  # truncation (top-p/k) left no allowed token: use the full allowed set
        restricted = distribution(np.where(allowed, row, -np.inf), params, a.tokens)
    return a.rng.choice(restricted, pos, purpose=GRAMMAR_REDRAW)


def grammar_tokens(
    a: Active, rows: np.ndarray, drafted: tuple[int, ...], is_eog: Callable[[int], bool]
) -> list[int]:
    """The target's token per verify row under the request's grammar.

    Sampled requests come here only in mode off (one row). Greedy ones may carry a draft: row i
    is the allowed argmax after drafted[:i], so a draft token the grammar refuses is rejected.
    """
    if not drafted:
        return [pick(a, rows[0])]
    assert a.grammar is not None  # the engine comes here only for a request with a grammar
    params = a.request.sampling
    g = a.grammar.clone()
    out: list[int] = []
    try:
        for i, row in enumerate(rows):
            best = g.best(penalize(row, params, a.tokens + list(drafted[:i])))
            out.append(best)
            if i < len(drafted):
                if drafted[i] != best or is_eog(best):
                    # Past a mismatch or an end of generation the grammar has no state: repeat the
                    # token, so an accepted end of generation is followed by itself.
                    out.extend([best] * (len(rows) - i - 1))
                    break
                g.accept(best)
    finally:
        g.close()
    return out
