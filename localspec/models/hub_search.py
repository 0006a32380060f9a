"""A Hub search's rows: each repo's quants with size and fit verdict, shared by `localspec models
search` and the chat app's models screen so the two always give the same verdict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from localspec.models.hub_header import RemoteFit, remote_fit

if TYPE_CHECKING:
    from localspec.models import ModelManager
    from localspec.models.hub import SearchHit


@dataclass(frozen=True)
class QuantRow:
    """One pullable quant of a searched repo and its fit before download."""

    repo: str
    quant: str
    size: int
    files: int
    bits_per_weight: float | None
    fit: RemoteFit

    @property
    def pull_ref(self) -> str:
        return f"hf.co/{self.repo}:{self.quant}"


def quant_rows(hit: SearchHit, n_ctx: int) -> list[QuantRow]:
    """Every quant of ``hit``, judged at ``n_ctx`` from the repo's header (or its size alone)."""
    return [QuantRow(hit.repo, q.quant, q.size, len(q.files), q.bits_per_weight, remote_fit(q.size, hit.header, n_ctx))
            for q in hit.quants]


def default_n_ctx(mgr: ModelManager) -> int:
    """The context a fit is judged at: the default profile's, as `models info` does."""
    try:
        return int(mgr.profile().n_ctx)
    except Exception:  # noqa: BLE001  a broken overlay still searches
        return 4096
