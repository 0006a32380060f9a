"""The ceiling of Predicted Outputs on a machine: the best speed-up any drafter could reach on the
answers a `bench --plan predicted` run measured, on a verify curve. Plain arithmetic over a bench's
runs, with no imports beyond the standard library, so that the offline GPU check
(packaging/gpu_check.py) can price a CPU run on a GPU's curve."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass

PREDICTED = "auto+prediction"
# The longest draft the ceiling considers: the engine's prediction_k_max default, the longest draft
# a prediction makes. The learned curve runs on to 49 rows (lookup's copies), where this CPU's
# ceiling is higher (2.05x against 1.79x at 16, docs/predicted-outputs.md); an edit's runs between
# its changes are mostly shorter than 48 tokens, so a prediction's drafts stop at 16.
CEILING_K_MAX = 16


@dataclass(frozen=True)
class Ceiling:
    covered: float  # the share of the answer's tokens drafts gave: accepted / answer tokens
    k: int  # the draft length that reaches the ceiling (0: not drafting)
    tokens_per_pass: float  # k + 1 on the covered part
    verify_steps: float  # verify(k + 1) / verify(1): a pass of k + 1 rows in single-row passes
    speedup: float
    source: str = ""  # what `covered` counts

    def to_json(self) -> dict:
        return asdict(self)


def ceiling(covered: float, verify: Callable[[int], float], k_max: int = CEILING_K_MAX,
            source: str = "") -> Ceiling:
    """The best speed-up over plain decoding for an answer of which drafts gave a share f:
    the covered part drafted in passes of k + 1 rows that each keep all k drafted tokens (and add
    the target's own), the rest decoded plainly, no draft ever rejected. Per token that costs
    f × verify(k + 1) / (k + 1) + (1 − f) × verify(1); the ceiling is verify(1) over its least.

    Why this and not E(α, k) with a per-token acceptance α: a prediction's accepted tokens come in
    long runs (whole unchanged lines) and its rejections at the edits, so an independent α (0.86 on
    the held-in edits) says drafting pays little where runs of 12 tokens per pass were measured. An
    upper bound: real passes also pay the rejected drafts and each run's first token.
    """
    base = verify(1)
    best = Ceiling(covered=covered, k=0, tokens_per_pass=1.0, verify_steps=1.0, speedup=1.0, source=source)
    for k in range(1, k_max + 1):
        steps = verify(k + 1) / base
        speedup = 1.0 / (covered * steps / (k + 1) + (1.0 - covered))
        if speedup > best.speedup:
            best = Ceiling(covered=covered, k=k, tokens_per_pass=k + 1.0, verify_steps=steps, speedup=speedup,
                           source=source)
    return best


def runs_of(runs: list[dict], suite: str, mode: str) -> list[dict]:
    return [r for r in runs if r["suite"] == suite and r["mode"] == mode]


def _share(rows: list[dict], accepted: str) -> float | None:
    total = sum(r.get("tokens") or 0 for r in rows)
    given = sum(r.get(accepted) or 0 for r in rows)
    return given / total if total and given else None


def coverage(runs: list[dict], suite: str, mode: str = PREDICTED) -> tuple[float, str] | None:
    """The median over a suite's edits of the share of `mode`'s answer tokens that came from drafts,
    and what it counts. Every accepted draft counts, the prediction's and lookup's alike: both copy
    the same file (auto may take either for a stretch), and the ceiling asks how much of the answer
    was there to copy."""
    rows = runs_of(runs, suite, mode)
    keys = sorted({str(r["prompt"]) for r in rows})
    shares = [f for k in keys if (f := _share([r for r in rows if str(r["prompt"]) == k], "accepted")) is not None]
    if not shares:
        return None
    return statistics.median(shares), f"accepted drafts over answer tokens, median of {len(shares)} edits"
