"""Which draft model can speed up a target: installed models with the same tokenizer and
vocabulary (compat.py), smaller than the target.

`auto` drafts with the preferred draft (the profile's) when it is installed and compatible, else
with the best other compatible installed model (a registry draft first, then the smallest); with
none, a target still speculates with prompt lookup and Predicted Outputs, which need no draft
model. Registry drafts that are not installed cannot be compared yet (their GGUF header is not on
disk): they are suggested when their family matches, and checked once pulled.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from localspec.errors import IncompatibleDraftError, IntegrityError

if TYPE_CHECKING:
    from localspec.models.manager import ModelManager
    from localspec.models.registry import ModelEntry


class Compat(Enum):
    YES = "compatible"
    NO = "incompatible"
    UNCHECKED = "not installed"  # a registry draft of the same family: checked once pulled


@dataclass(frozen=True)
class DraftCandidate:
    model_id: str
    role: str
    installed: bool
    compat: Compat
    detail: str  # what was compared, or why it cannot draft for this target
    size: int | None


@dataclass(frozen=True)
class DraftPairing:
    target_id: str
    draft_id: str | None  # what `auto` drafts with; None: lookup and prediction only
    why: str
    candidates: tuple[DraftCandidate, ...]

    @property
    def summary(self) -> str:
        if self.draft_id:
            return f"auto drafts with {self.draft_id} ({self.why})"
        return f"no draft model: auto speculates with prompt lookup and prediction ({self.why})"

    @property
    def suggestions(self) -> tuple[str, ...]:
        return tuple(c.model_id for c in self.candidates if c.compat is Compat.UNCHECKED)

    def to_dict(self) -> dict[str, object]:
        return {"target": self.target_id, "draft": self.draft_id, "why": self.why, "summary": self.summary,
                "candidates": [{"id": c.model_id, "role": c.role, "installed": c.installed,
                                "compatible": c.compat.value, "detail": c.detail, "size": c.size}
                               for c in self.candidates]}


def _check(target: Path, draft: Path) -> tuple[Compat, str]:
    from localspec.models.compat import check_draft_compat

    try:
        c = check_draft_compat(target, draft)
    except (IncompatibleDraftError, IntegrityError) as exc:
        return Compat.NO, exc.cause
    pad = f", vocabulary padded by {c.vocab_padding}" if c.vocab_padding else ""
    return Compat.YES, f"same {c.tokenizer_model} tokenizer, {c.tokens_compared:,} token texts equal{pad}"


def _family(entry: ModelEntry | None) -> str:
    return entry.family.lower() if entry and entry.family else ""


def _candidates(mm: ModelManager, target_id: str, target_path: Path | None) -> list[DraftCandidate]:
    reg = mm.registry
    target_entry = reg.models.get(target_id)
    target_size = target_path.stat().st_size if target_path else (
        target_entry.expected_size() if target_entry else None)
    ids = list(reg.models) + [m.model_id for m in mm.store.manifests() if m.model_id not in reg.models]
    out: list[DraftCandidate] = []
    for mid in ids:
        entry = reg.models.get(mid)
        role = entry.role if entry else "?"
        if mid == target_id or role == "embedding":
            continue
        manifest = mm.store.installed(mid)
        path = mm.installed_path(mid) if manifest else None
        size = manifest.size if manifest else (entry.expected_size() if entry else None)
        if size is not None and target_size is not None and size >= target_size:
            continue  # a draft must be cheaper to run than its target
        if path is not None and target_path is not None:
            compat, detail = _check(target_path, path)
            out.append(DraftCandidate(mid, role, True, compat, detail, size))
        elif path is None and role == "draft" and _family(entry) and _family(entry) == _family(target_entry):
            out.append(DraftCandidate(mid, role, False, Compat.UNCHECKED,
                                      f"same family; not installed (`localspec models pull {mid}`)", size))
    return out


def pair_draft(mm: ModelManager, target_id: str, *, preferred: str | None = None) -> DraftPairing:
    """The draft `auto` uses for ``target_id``, and every candidate with the reason it is or is not one."""
    target_path = mm.installed_path(target_id)
    cands = _candidates(mm, target_id, target_path)
    if target_path is None:
        return DraftPairing(target_id, None, "the target is not installed, so no tokenizer could be compared",
                            tuple(cands))
    ok = [c for c in cands if c.compat is Compat.YES]
    pref = mm.resolve(preferred).id if preferred and preferred in mm.registry else preferred
    for c in ok:
        if c.model_id == pref:
            return DraftPairing(target_id, c.model_id, "the profile's draft; " + c.detail, tuple(cands))
    if ok:
        best = min(ok, key=lambda c: (c.role != "draft", c.size if c.size is not None else 1 << 62, c.model_id))
        return DraftPairing(target_id, best.model_id, best.detail, tuple(cands))
    why = "no installed model smaller than it has its tokenizer"
    if cands and any(c.compat is Compat.UNCHECKED for c in cands):
        why += f"; pull one to draft with: {', '.join(c.model_id for c in cands if c.compat is Compat.UNCHECKED)}"
    return DraftPairing(target_id, None, why, tuple(cands))
