"""Verification of a draft against the target: the rule that makes speculation lossless.

Notation (Leviathan et al. 2023, Chen et al. 2023): p is the target's distribution at a position,
q the drafter's, d the drafted token.

* accept d with probability min(1, p(d) / q(d));
* on the first rejection, sample the replacement from norm(max(0, p - q)) and stop;
* if every draft token is accepted, sample one bonus token from the target's next p.

The output then has exactly the target's distribution. Drafters that propose deterministically
(prompt lookup, greedy draft) have a point-mass q: q(d) = 1. Greedy requests have one-hot p,
so the same rule reduces to "accept while the target's argmax equals the draft token";
`verify_greedy` is that case, taking the argmax tokens instead of the one-hot rows.

A greedy argmax at a near-tie depends on the batch its row is read in (llama.cpp takes other kernels
for 1, 2-7 and 8-63 rows; `scripts/batch_invariance.py`), which is the float difference the lossless
tests allow. `settle_near_ties` decides such ties one way when there is a way to prefer: the same
question's earlier greedy answer, at exactly this context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

# Logits. A token of the target's own earlier greedy answer that a row puts within this of its top
# was picked over the row's argmax by batch float noise alone: about three spreads of a top-two gap
# between batch shapes (drafters.GAP_SPREAD, 0.08), half of the bound the lossless tests allow (0.5).
TIE_MARGIN = 0.25

# Below this mass the residual max(0, p - q) is rounding noise; sample from p instead of dividing
# by (almost) zero. It only happens when p and q are (almost) equal, where p is the right answer.
RESIDUAL_EPS = 1e-9


class PositionRng:
    """Random draws keyed by (seed, token position, purpose), not by call order.

    So for a fixed mode and draft length, a seed reproduces a run exactly however the scheduler
    interleaves this sequence with others. A different k (as `auto` chooses) uses different
    draws for the same positions: the output distribution stays exact, the sample may differ.
    """

    DRAFT, ACCEPT, SAMPLE = 0, 1, 2

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def _gen(self, pos: int, purpose: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, pos, purpose])

    def uniform(self, pos: int) -> float:
        return float(self._gen(pos, self.ACCEPT).random())

    def choice(self, probs: np.ndarray, pos: int, purpose: int = SAMPLE) -> int:
        cdf = np.cumsum(probs)
        u = self._gen(pos, purpose).random() * cdf[-1]
        return int(min(np.searchsorted(cdf, u, side="right"), probs.shape[0] - 1))


@dataclass(frozen=True)
class PickRule:
    """How a greedy request picks its tokens from a row: the penalties that move its argmax (none by default).
    Another request's picks stand for this one's only under the same rule (settle_near_ties)."""

    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 0


GREEDY = PickRule()


@dataclass(frozen=True)
class Draft:
    """Proposed tokens; `q[i]` is the drafter's distribution for tokens[i], or None for a point mass."""

    tokens: tuple[int, ...]
    q: tuple[np.ndarray, ...] | None = None
    source: str = "none"
    match_length: int = 0  # prompt lookup: length of the n-gram the proposal continues
    # Per token, the chance the target picks it again beside what the drafter's evidence says: a copy of
    # an earlier greedy answer through a near-tie that another batch shape may decide the other way.
    odds: tuple[float, ...] = ()
    # A copy of the same question's earlier greedy answer whose text so far is this sequence's word for
    # word: its next tokens that are the target's own picks at exactly this context, up to one past `tokens`
    # (settle_near_ties).
    own_picks: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class Verdict:
    accepted: int  # how many draft tokens were kept
    next_token: int  # the target's own token after them: a correction or the bonus


def verify(p: Sequence[np.ndarray], draft: Draft, rng: PositionRng, start_pos: int) -> Verdict:
    """Check `draft` against the target rows `p` (len(draft) + 1 of them).

    p[i] is the target's distribution for the token at position start_pos + i, given the history
    and draft.tokens[:i]. Draws are keyed by that position.
    """
    for i, d in enumerate(draft.tokens):
        pos = start_pos + i
        q_d = 1.0 if draft.q is None else float(draft.q[i][d])
        # Accept d with probability min(1, p(d)/q(d)), written without the division.
        if rng.uniform(pos) * q_d < p[i][d]:
            continue
        # Rejected: the replacement comes from norm(max(0, p - q)).
        if draft.q is None:
            residual = p[i].copy()
            residual[d] = 0.0
        else:
            residual = np.maximum(p[i] - draft.q[i], 0.0)
        if residual.sum() < RESIDUAL_EPS:
            residual = p[i]
        return Verdict(accepted=i, next_token=rng.choice(residual, pos))
    # Every draft token survived: the last row gives a bonus token for free.
    k = len(draft.tokens)
    return Verdict(accepted=k, next_token=rng.choice(p[k], start_pos + k))


def verify_greedy(targets: Sequence[int], draft: Draft) -> Verdict:
    """`verify` when every target row is a point mass on targets[i] (greedy decoding).

    Then min(1, p(d)/q(d)) is 1 for d == targets[i] and 0 otherwise, and norm(max(0, p - q)) is
    that point mass again: accept while the draft matches, then take the target's own token. No
    random draw is involved, and no vocabulary-sized vector (two per row in `verify`) is built.
    """
    for i, d in enumerate(draft.tokens):
        if d != targets[i]:
            return Verdict(accepted=i, next_token=targets[i])
    k = len(draft.tokens)
    return Verdict(accepted=k, next_token=targets[k])


def settle_near_ties(targets: Sequence[int], scores: Callable[[int], np.ndarray], drafted: Sequence[int],
                     earlier: Sequence[int]) -> tuple[list[int], int]:
    """Greedy targets per row, with each near-tie decided as the earlier answer decided it; and how many were.

    `earlier[i]` is the target's own pick after the history and earlier[:i] (an answer to the same question
    whose text so far is this one's), `scores(i)` row i's logits as the pick is made from (penalties in).
    Row i reads the history and drafted[:i]: where that is earlier[:i] and the row puts earlier[i] within
    TIE_MARGIN of its argmax, both tokens are the target's greedy pick up to batch float noise, and the
    row's target becomes earlier[i]. So the answer asked again is made again token for token, instead of
    parting wherever a batch shape decides a tie the other way. Rows past the first one a verify would stop
    at (its draft token not the target) are left as they are.
    """
    out = list(targets)
    settled = 0
    for i in range(min(len(out), len(earlier))):
        if i > 0 and not (i - 1 < len(drafted) and drafted[i - 1] == earlier[i - 1] == out[i - 1]):
            break
        if out[i] != earlier[i]:
            row = scores(i)
            if not row[earlier[i]] >= row[out[i]] - TIE_MARGIN:  # (a NaN too)
                break  # a real difference: the answers part here, and the rows after read another text
            out[i] = earlier[i]
            settled += 1
    return out, settled
