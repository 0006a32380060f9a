"""What a target pass costs on this machine, learned from every pass the engine runs.

The `auto` controller needs verify(n): the seconds of one target pass of n rows that ask for
logits. A one-time calibration is a poor answer on a developer's machine: taken while a build ran,
it said 2 rows cost 2.4 single steps (the truth was 1.7), was cached, and `auto` never drafted
again, so it never saw a pass that would have shown the truth. So the calibration is only the
starting belief, and every pass corrects it:

    verify(n, L) = level[bucket(L)] × shape[n]          shape[1] = 1

`level` is what a single-row pass costs now at a KV length near L (load and context both move
it); `shape` is how much more n rows cost than one. A pass of n rows at context L taking t seconds
gives the residual e = clip(log t − log verify(n, L), ±CLIP) and

    log level[b] += level_rate · e      log shape[n] += shape_rate · e      (n > 1)

with each rate 1 / (evidence + 1), floored: the first real passes at a row count outvote a
starting curve worth PRIOR_WEIGHT passes, and later ones move it by a few percent. The clip bounds
what one pass can do: a pass that waited on another process moves an estimate by at most
rate × CLIP. After each update a weighted isotonic fit keeps the shape non-decreasing in n (a GPU's
flat curve with kernel bumps is valid; a curve where 9 rows cost less than 5 is not), and where no pass
taught it, at most n for n rows (see `_fit`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

CLIP = 0.3  # most log-residual one pass counts for (a 10x outlier counts as 1.35x, times its rate)
PRIOR_WEIGHT = 2.0  # passes a starting curve (calibration, persisted estimate) is worth per row count
LEVEL_MIN_RATE = 0.1  # the level follows load and context within ~10 passes
SHAPE_MIN_RATE = 0.05  # the shape is the machine's: it moves slower
MAX_WEIGHT = 1000.0  # evidence stops growing here, so the rates above stay the floor
COST_OPTIMISM = 0.5  # exploring picks by verify × exp(−this / √(1 + evidence)): the unknown looks hopeful
_BUCKET_MIN_BITS = 8  # contexts under 256 tokens share a bucket; then one bucket per doubling
_BUCKETS = 10  # ... up to 128k tokens


class Obtained(StrEnum):
    """Where the starting curve came from, for `localspec doctor --calibration`."""

    CALIBRATED = "calibrated"  # measured at load on an idle engine, passed its checks
    UNSETTLED = "unsettled"  # measured, failed its checks (a busy box): used, not saved
    GIVEN = "given"  # a fixture or a planted curve


def context_bucket(context: int) -> int:
    """0 for < 256 tokens of KV, then one bucket per doubling."""
    return min(max(context.bit_length() - _BUCKET_MIN_BITS, 0), _BUCKETS - 1)


def isotonic(values: list[float], weights: list[float]) -> list[float]:
    """The non-decreasing sequence closest to `values` in weighted least squares (pool adjacent
    violators): a dip between two heavier points is lifted to their level, not trusted."""
    blocks: list[list[float]] = []  # [weighted mean, weight, length]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v, max(w, 1e-9), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks[-1]
            blocks[-1] = [(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2]
    out: list[float] = []
    for mean, _, n in blocks:
        out += [mean] * int(n)
    return out


def _clipped_log_ratio(observed: float, predicted: float) -> float:
    return max(-CLIP, min(CLIP, math.log(observed / predicted)))


def _rate(weight: float, floor: float) -> float:
    return max(1.0 / (weight + 1.0), floor)


@dataclass
class Costs:
    """Seconds per operation on this machine: a starting curve, then what real passes taught.

    `verify` is the starting curve (verify[n-1] = n rows); read the current belief with
    `verify_cost(rows, context=...)`.
    """

    verify: list[float]
    draft_step: float  # one single-row draft decode
    draft_row: float  # per extra row when the draft catches up in one batch
    obtained: Obtained = Obtained.GIVEN
    created: float = field(default_factory=time.time)
    updated: float = 0.0
    passes: int = 0  # target passes learned from
    calibration_context: int = 48
    about: str = ""  # the models and threads this curve belongs to, for `doctor --calibration`
    pinned: bool = False  # learns nothing: tests that assert auto's choices pin the costs they choose by
    shape: list[float] = field(default_factory=list)
    shape_weight: list[float] = field(default_factory=list)
    level: dict[int, float] = field(default_factory=dict)
    level_weight: dict[int, float] = field(default_factory=dict)
    # One sequence's multi-row passes since the last single-row pass, and that one's log residual against the
    # level: only a plain step measures the level alone (see Controller's LEVEL_CHECK). Not persisted.
    plain_ago: int = 0
    plain_error: float = 0.0

    def __post_init__(self) -> None:
        if not self.verify or any(not (v > 0 and math.isfinite(v)) for v in self.verify):
            raise ValueError(f"verify costs must be positive and finite: {self.verify}")
        if not self.shape:
            base = self.verify[0]
            self.shape = [v / base for v in self.verify]
            self.shape_weight = [PRIOR_WEIGHT] * len(self.shape)
            self._fit()
        if not self.level:
            b = context_bucket(self.calibration_context)
            self.level = {b: self.verify[0]}
            self.level_weight = {b: PRIOR_WEIGHT}

    # ------------------------------------------------------------------ beliefs

    def level_at(self, context: int) -> float:
        """A single-row pass at this KV length: its bucket's level, else the nearest learned one
        (the longer context on a tie: over-estimating a verify costs less than under-estimating)."""
        b = context_bucket(context)
        if b in self.level:
            return self.level[b]
        nearest = min(self.level, key=lambda k: (abs(k - b), -k))
        return self.level[nearest]

    def shape_at(self, rows: int) -> float:
        if rows <= len(self.shape):
            return self.shape[rows - 1]
        # Past the learned range, the slope of the curve's top third goes on, between a quarter of
        # its mean slope and the mean slope. The mean alone over-prices a concave curve: a CPU's per-row
        # cost falls as batched kernels take over (9 rows 7.3 steps, 49 rows 20-23 here; the mean slope
        # of 1..9 says 39), and a draft believed too dear is never tried, so never corrected. The top
        # third, not half: a busy box's curve held to n rows for n (`_fit`) climbs one step a row below
        # its top, and its upper half's slope said 37 steps for 49 rows. The floor: a flat stretch the
        # isotonic fit pooled must not make every longer draft look free. A belief too low is tried and
        # corrected by the pass that tries it.
        last, n = self.shape[-1], len(self.shape)
        if n == 1:
            return float(rows)
        mean = (last - 1.0) / (n - 1)
        top = max(n // 3, 1)
        upper = (last - self.shape[n - 1 - top]) / top
        return min(last + (rows - n) * min(mean, max(upper, mean / 4)), float(rows))

    def verify_cost(self, rows: int, context: int | None = None) -> float:
        ctx = self.calibration_context if context is None else context
        return self.level_at(ctx) * self.shape_at(rows)

    def evidence(self, rows: int) -> float:
        """Passes' worth of evidence behind verify(rows)'s shape (0 past the learned range)."""
        return self.shape_weight[rows - 1] if rows <= len(self.shape_weight) else 0.0

    def hope(self, rows: int) -> float:
        """The factor an optimist puts on verify(rows): well below 1 where few passes were seen."""
        return math.exp(-COST_OPTIMISM / math.sqrt(1.0 + self.evidence(rows)))

    def catch_up(self, tokens: int) -> float:
        return 0.0 if tokens <= 0 else self.draft_step + (tokens - 1) * self.draft_row

    def steps(self, rows: int, context: int | None = None) -> float:
        """verify(rows) in single-row passes: the unit `doctor` and the choice's reason speak in."""
        return self.verify_cost(rows, context) / self.verify_cost(1, context)

    # ------------------------------------------------------------------ learning

    def observe_verify(self, rows: int, seconds: float, *, context: int | None = None, sequences: int = 1) -> None:
        """Learn from one target pass of `rows` logits rows (all `sequences` together) at `context`."""
        if self.pinned or rows < 1 or not (seconds > 0 and math.isfinite(seconds)):
            return
        ctx = self.calibration_context if context is None else context
        e = _clipped_log_ratio(seconds, self.verify_cost(rows, ctx))
        b = context_bucket(ctx)
        if b not in self.level:  # a new context range starts from its nearest neighbour
            self.level[b], self.level_weight[b] = self.level_at(ctx), 0.0
        if rows == 1:
            self._move_level(b, e, 1.0)
            self.plain_ago, self.plain_error = 0, e
        else:
            self.plain_ago += sequences == 1  # beside other sequences no step of one is a single-row pass
            self._grow_shape(rows)
            i = rows - 1
            shape_rate = _rate(self.shape_weight[i], SHAPE_MIN_RATE)
            self.shape[i] *= math.exp(shape_rate * e)
            self.shape_weight[i] = min(self.shape_weight[i] + 1.0, MAX_WEIGHT)
            # What the shape did not take is partly the level's: little while the shape is unsure.
            self._move_level(b, e * (1.0 - shape_rate), 0.5)
            self._pull_neighbours(i, e, shape_rate)
            self._fit()
        self.passes += 1
        self.updated = time.time()

    def _fit(self) -> None:
        """Non-decreasing in n, with shape[1] pinned at 1 (it is the unit), and at most n where no real pass
        at n rows taught it (the starting curve's weight): a pass of n rows could run as n passes of one. A
        calibration taken beside six busy processes read 2 rows as 4.2 single steps and 17 as 19, and `auto`
        drafted nothing: a belief too high is never tried, so never corrected, while one too low is corrected
        by the pass that tries it. Passes may teach more than n (this CPU: 6 rows 6.3 steps, a kernel switch)."""
        fitted = isotonic(self.shape, [1e12, *self.shape_weight[1:]])
        self.shape, top = [], 1.0
        for n, (v, w) in enumerate(zip(fitted, self.shape_weight, strict=True), start=1):
            top = max(top, min(v, float(n)) if w <= PRIOR_WEIGHT else v)
            self.shape.append(top)
        self.shape[0] = 1.0

    def _pull_neighbours(self, i: int, e: float, rate: float) -> None:
        """Curves are smooth in n, on a scale that grows with n: a residual at n moves the little-known
        row counts beside it too, in full within a factor of 1.5 of n, then half as much per further 0.5.
        One learned point heals a poisoned neighbourhood, and a long stretch no pass has reached moves
        as one: moved in part (half per row away), each 49-row copy taught that 49 rows cost more than
        believed and left 45 looking cheap, so a planted process copied its earlier answer 48, 44, 40,
        ... 28 tokens a pass (a clean one: 47 a pass). No neighbour moves faster than n itself."""
        n = i + 1
        for j in range(1, len(self.shape)):
            if j != i and self.shape_weight[j] < PRIOR_WEIGHT * 2:
                apart = max(n, j + 1) / min(n, j + 1)
                near = 0.5 ** max(0.0, (apart - 1.5) / 0.5)
                self.shape[j] *= math.exp(near * min(rate, _rate(self.shape_weight[j], SHAPE_MIN_RATE)) * e)

    def _move_level(self, b: int, e: float, evidence: float) -> None:
        self.level[b] *= math.exp(_rate(self.level_weight[b], LEVEL_MIN_RATE) * e)
        self.level_weight[b] = min(self.level_weight[b] + evidence, MAX_WEIGHT)

    def _grow_shape(self, rows: int) -> None:
        while len(self.shape) < rows:
            self.shape.append(self.shape_at(len(self.shape) + 1))
            self.shape_weight.append(0.0)

    def observe_draft_step(self, seconds: float) -> None:
        if not self.pinned and seconds > 0 and math.isfinite(seconds):
            self.draft_step *= math.exp(SHAPE_MIN_RATE * 2 * _clipped_log_ratio(seconds, self.draft_step))

    # ------------------------------------------------------------------ persistence

    def to_json(self) -> dict[str, Any]:
        """A snapshot: copies of the lists, which learning goes on changing in place (a bench.json's
        starting calibration once carried the run's end-of-run weights)."""
        return {
            "version": 2, "obtained": str(self.obtained), "created": self.created, "updated": self.updated,
            "passes": self.passes, "calibration_context": self.calibration_context, "about": self.about,
            "verify": list(self.verify),
            "draft_step": self.draft_step, "draft_row": self.draft_row, "shape": list(self.shape),
            "shape_weight": list(self.shape_weight), "level": {str(k): v for k, v in self.level.items()},
            "level_weight": {str(k): v for k, v in self.level_weight.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Costs:
        """A persisted curve; raises ValueError (or KeyError, TypeError) on anything malformed."""
        costs = cls(verify=[float(v) for v in data["verify"]], draft_step=float(data["draft_step"]),
                    draft_row=float(data["draft_row"]))
        if data.get("version") == 2:
            shape = [float(v) for v in data["shape"]]
            weight = [float(v) for v in data["shape_weight"]]
            level = {int(k): float(v) for k, v in data["level"].items()}
            level_weight = {int(k): float(v) for k, v in data["level_weight"].items()}
            values = [*shape, *weight, *level.values(), *level_weight.values()]
            if (len(shape) != len(weight) or not shape or not level or level.keys() != level_weight.keys()
                    or any(not math.isfinite(v) or v < 0 for v in values)
                    or any(v <= 0 for v in [*shape, *level.values()])):
                raise ValueError("inconsistent learned costs")
            costs.shape, costs.shape_weight, costs.level, costs.level_weight = shape, weight, level, level_weight
            costs._fit()  # a curve saved before a rule of `_fit` (at most n for n rows) holds to it from the start
            costs.obtained = Obtained(data["obtained"])
            costs.created, costs.updated = float(data["created"]), float(data["updated"])
            costs.passes, costs.calibration_context = int(data["passes"]), int(data["calibration_context"])
            costs.about = str(data.get("about", ""))
        return costs

    def save(self, path: Path) -> None:
        """Atomically, under a unique temporary name: concurrent processes never leave a torn file
        (the last writer wins, and what it wrote is whole)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.to_json(), f, indent=1)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def load(path: Path) -> Costs | None:
    """The persisted costs at `path`, or None (missing; unreadable or corrupt: with a warning)."""
    try:
        data = json.loads(path.read_text())
        costs = Costs.from_json(data)
        if data.get("version") is None:  # a curve from before costs were learned: a calibration, as old as its file
            costs.obtained, costs.created = Obtained.CALIBRATED, path.stat().st_mtime
        return costs
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        logger.warning("ignoring unreadable speculative costs %s (%s); they will be re-measured", path, exc)
        return None
