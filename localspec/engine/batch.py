"""The step's one target batch: every slot's rows, and which logits belong to whom."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from localspec.engine.runtime import Row
from localspec.engine.slots import Slot
from localspec.engine.verify import Draft


@dataclass(frozen=True)
class BatchPart:
    """One slot's share of the batch: a verify of its draft, or a chunk of its prompt (draft None)."""

    slot: Slot
    draft: Draft | None
    n_logits: int  # rows of logits this part gets back from the decode


@dataclass
class Batch:
    rows: list[Row] = field(default_factory=list)
    parts: list[BatchPart] = field(default_factory=list)

    def add(self, slot: Slot, rows: list[Row], draft: Draft | None) -> None:
        self.rows.extend(rows)
        self.parts.append(BatchPart(slot, draft, sum(r.logits for r in rows)))

    @property
    def all_verify(self) -> bool:
        """Only verifies (one sequence or several): every row asks for logits, so the pass's time
        is verify(total rows), what the cost model learns. A prompt chunk's rows cost otherwise."""
        return bool(self.parts) and all(p.draft is not None for p in self.parts)

    def split(self, logits: np.ndarray) -> Iterator[tuple[BatchPart, np.ndarray]]:
        """Each part with its own rows of the decode's logits, in batch order."""
        offset = 0
        for part in self.parts:
            yield part, logits[offset : offset + part.n_logits]
            offset += part.n_logits
