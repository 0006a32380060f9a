"""Models on demand: which installed models a request may name, what one would take in memory, and
which idle loaded models make room for it (least recently used first), as LM Studio's JIT loading
and Ollama do.

The memory figures and the installed models come through seams (`MemoryProbe`, `ModelSource`) so
that tests give fake figures and fake models; the server's own are `system_memory` and
`InstalledModels`.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from localspec.errors import LocalspecError

if TYPE_CHECKING:
    from localspec.models import ModelManager

logger = logging.getLogger(__name__)

HEADROOM = 0.9  # as models/fit.py: keep 10% of RAM spare, an estimate is not a promise
# Drafts and embedding models are not offered as chat models; nor are store-only imports (role "?"):
# a load resolves its target through the registry, which does not know them.
CHAT_ROLES = frozenset({"target"})


@dataclass(frozen=True)
class MemoryFigures:
    available: int  # bytes the system can give now (psutil's `available`)
    total: int


MemoryProbe = Callable[[], MemoryFigures]


def system_memory() -> MemoryFigures:
    import psutil

    vm = psutil.virtual_memory()
    return MemoryFigures(available=int(vm.available), total=int(vm.total))


def release_memory() -> None:
    """Hand what unloaded models leave behind back to the system now, not at some later time.

    - `gc.collect()`: garbage in reference cycles, which refcounting never frees. sqlite3 connections
      are such (their statement cache), and the semantic cache's diskcache opens one per thread that
      uses it and closes only the closing thread's: the others held two descriptors and a page cache
      each until a full collection, and every reload opened a new set (scripts/soak.py).
    - `malloc_trim(0)` (glibc): the freed buffers of llama.cpp and numpy stay in malloc's arenas
      otherwise; unloaded, the server kept ~100 MB more RSS per unload/reload cycle of the 0.5B model.
    """
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None (another C library, another system)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)  # musl has none
    except OSError:
        return None


@dataclass(frozen=True)
class InstalledModel:
    id: str
    names: frozenset[str]  # the id and its aliases: what /v1/models lists and a request may name


class ModelSource(Protocol):
    """The installed models a request may load on demand, and what each takes in memory once loaded."""

    def installed(self) -> list[InstalledModel]: ...

    def find(self, name: str) -> InstalledModel | None: ...

    def need_bytes(self, model_id: str) -> int: ...

    def path_of(self, model_id: str) -> Path | None:
        """The GGUF file of an installed model (None: not installed), for what its header says."""
        ...

    def draft_for(self, model_id: str) -> str | None:
        """The draft a load of `model_id` is likely to pair with, when cheaply known (else None)."""
        ...


class NoModels:
    """No model beyond the profile's: the source of a server whose `load` is not the real one (tests)."""

    def installed(self) -> list[InstalledModel]:
        return []

    def find(self, name: str) -> InstalledModel | None:
        return None

    def need_bytes(self, model_id: str) -> int:
        return 0

    def path_of(self, model_id: str) -> Path | None:
        return None

    def draft_for(self, model_id: str) -> str | None:
        return None


class InstalledModels:
    """The store's installed chat models (registry ids, aliases, pulled `hf.co/USER/REPO:QUANT` names),
    each estimated with the KV cache the server gives it (context per slot x slots)."""

    def __init__(self, n_ctx: int | None, parallel: int, profile: str | None = None) -> None:
        self.n_ctx, self.parallel, self.profile = n_ctx, parallel, profile
        self._need: dict[str, int] = {}  # a header read per model, not per request

    def installed(self) -> list[InstalledModel]:
        from localspec.models import ModelManager

        rows = ModelManager().list(with_fit=False)
        return [InstalledModel(r.id, frozenset({r.id, *r.aliases})) for r in rows
                if r.installed and r.role in CHAT_ROLES]

    def find(self, name: str) -> InstalledModel | None:
        """The installed chat model a request's name means, or None (unknown, not installed, not chat)."""
        from localspec.models import ModelManager

        mm = ModelManager()
        try:
            entry = mm.resolve(name)
        except LocalspecError:
            return None  # not in the registry (a store-only import included): nothing a load could resolve
        if entry.role not in CHAT_ROLES or mm.installed_path(entry.id) is None:
            return None
        return InstalledModel(entry.id, frozenset({entry.id, *entry.aliases}))

    def need_bytes(self, model_id: str) -> int:
        """Weights + KV cache for `n_ctx_tokens` + compute buffers (models/fit.py), 0 when unknown."""
        if model_id not in self._need:
            self._need[model_id] = self._estimate(model_id)
        return self._need[model_id]

    def path_of(self, model_id: str) -> Path | None:
        from localspec.models import ModelManager

        return ModelManager().installed_path(model_id)

    def draft_for(self, model_id: str) -> str | None:
        """The installed draft a registry profile pairs with `model_id` as its target: the load's
        pairing prefers it when the tokenizers match. Read from the registry only: no file is opened."""
        from localspec.models import ModelManager

        mm = ModelManager()
        for prof in mm.registry.profiles.values():
            if prof.target == model_id and prof.draft and mm.installed_path(prof.draft) is not None:
                return prof.draft
        return None

    def _estimate(self, model_id: str) -> int:
        from localspec.models import ModelManager
        from localspec.models.fit import estimate_fit

        mm = ModelManager()
        path = mm.installed_path(model_id)
        if path is None:
            return 0
        try:
            from localspec.service import load_settings

            # As the load decides it: the flag, the model's own, settings.toml's [engine], the profile's.
            n_ctx = (self.n_ctx or own_n_ctx(mm, model_id) or load_settings().get("n_ctx")
                     or mm.profile(self.profile).n_ctx)
            return estimate_fit(path, n_ctx=n_ctx * self.parallel, ram=1, vram=0).total_bytes
        except (LocalspecError, OSError, ValueError):
            logger.warning("cannot estimate %s's memory; counting its file alone", model_id)
            return path.stat().st_size if path.exists() else 0


def own_n_ctx(mm: ModelManager, model_id: str) -> int | None:
    """The model's own [models.settings] n_ctx, which its load uses when no --n-ctx is given."""
    try:
        own = mm.resolve(model_id).settings
    except LocalspecError:
        return None
    return own.n_ctx if own else None


@dataclass(frozen=True)
class Held:
    """A loaded (or loading) set of models, as room planning sees it."""

    key: str
    need_bytes: int
    busy: bool  # requests in flight: never evicted
    last_used: float
    loading: bool = False  # its memory is not taken yet: not in the system's `available`, and not evictable


@dataclass(frozen=True)
class Room:
    evict: tuple[str, ...]  # keys to unload first, least recently used first


@dataclass(frozen=True)
class NoRoom:
    need_bytes: int
    room_bytes: int  # what evicting every idle model would give
    busy: tuple[str, ...]  # the models with requests in flight that hold the rest


def room_bytes(mem: MemoryFigures, held: Sequence[Held], kept: Sequence[Held]) -> int:
    """Room for a new model with `kept` still loaded. Weights are mmapped, so the system may count a
    loaded model's pages as available: the room is also bounded by total RAM less what `kept` takes."""
    freed = sum(h.need_bytes for h in held if h not in kept)
    coming = sum(h.need_bytes for h in kept if h.loading)
    return int(min(mem.available - coming + freed, mem.total - sum(h.need_bytes for h in kept)) * HEADROOM)


def plan_room(need_bytes: int, mem: MemoryFigures, held: Sequence[Held]) -> Room | NoRoom:
    """Which idle models to unload (least recently used first, only as many as needed) so that
    `need_bytes` fits; NoRoom when even unloading every idle one is not enough."""
    kept = list(held)
    evict: list[str] = []
    for h in sorted((h for h in held if not h.busy and not h.loading), key=lambda h: h.last_used):
        if need_bytes <= room_bytes(mem, held, kept):
            break
        kept.remove(h)
        evict.append(h.key)
    room = room_bytes(mem, held, kept)
    if need_bytes <= room:
        return Room(tuple(evict))
    return NoRoom(need_bytes, room, tuple(h.key for h in kept if h.busy or h.loading))
