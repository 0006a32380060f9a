"""The model store as the endpoint manages it: pull a model (a registry id or alias, or a Hub
reference `hf.co/USER/REPO[:QUANT]`), delete one, and describe an installed one (size, digest,
family, parameter count, quant) for listings. Ollama's `/api/pull`, `/api/delete` and `/api/tags`
are its face (routes/ollama_store.py), so that a UI written for Ollama (Open WebUI's model
settings) downloads and removes models here as it does there.

The store comes through a seam (`ModelStore`) so that the server's tests run with a store of their
own; the server's is `ManagerStore`, over the same ModelManager as `localspec models`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Protocol

from localspec.errors import LocalspecError, ModelNotFoundError
from localspec.models.progress import ProgressEvent

MAX_PULLS = 2  # pulls at once; more wait their turn (each is a network- and disk-bound thread)
STEP_EVERY_S = 0.25  # a download reports at most this often: a UI redraws per line, a copy makes thousands


class PullPhase(Enum):
    """Where a pull stands, in the words Ollama's clients show (its status texts where it has one)."""

    MANIFEST = "pulling manifest"  # looking the model up and choosing a source
    DOWNLOAD = "downloading"  # bytes of the model's file arriving (completed of total)
    RETRY = "trying another source"  # a source failed; the next is tried
    VERIFY = "verifying sha256 digest"
    WRITE = "writing manifest"
    SUCCESS = "success"


@dataclass(frozen=True)
class PullStep:
    phase: PullPhase
    model_id: str = ""
    completed: int = 0
    total: int | None = None
    digest: str | None = None  # the sha256 (hex) the registry pins for the file, when it pins one
    message: str = ""


PullListener = Callable[[PullStep], None]


@dataclass(frozen=True)
class StoredModel:
    """An installed model as a listing shows it."""

    id: str
    size: int  # bytes, all of its files
    sha256: str  # its (first) file's, as installed and verified
    modified: float  # when it was installed (unix time)
    family: str  # the GGUF's architecture ("qwen2")
    parameter_size: str  # "1.5B", "494M"
    quantization: str  # "Q4_K_M"


class ModelStore(Protocol):
    def check(self, name: str) -> None:
        """Refuse, before a pull starts, a name no pull could serve: a malformed Hub reference
        (UsageError), a name the registry does not know (ModelNotFoundError). Reads no network."""
        ...

    def pull(self, name: str, on_step: PullListener) -> str:
        """Install the model `name` means (a no-op when it is installed) and return its id; `on_step`
        hears the progress, from the pulling thread. Raises LocalspecError (unknown name, every source
        failed, a bad hash, a full disk)."""
        ...

    def installed_id(self, name: str) -> str | None:
        """The id of the installed model a name (id, alias, Hub reference) means, or None."""
        ...

    def remove(self, model_id: str) -> None: ...

    def describe(self, model_id: str) -> StoredModel | None:
        """An installed model's size, digest and header facts; None when it is not installed."""
        ...

    def profile_models(self, profile: str | None) -> frozenset[str]:
        """The ids a profile loads (target, draft, small tier, embedding): a delete leaves them to the server.
        Raises LocalspecError when the registry cannot say."""
        ...


class NoStore:
    """No store to manage: the endpoint of tests that load models of their own."""

    def check(self, name: str) -> None:
        self.pull(name, lambda step: None)

    def pull(self, name: str, on_step: PullListener) -> str:
        raise ModelNotFoundError(f"This server pulls no models ({name[:200]!r} asked).",
                                 "Pull it with `localspec models pull NAME`.")

    def installed_id(self, name: str) -> str | None:
        return None

    def remove(self, model_id: str) -> None:
        raise ModelNotFoundError(f"Model {model_id!r} is not installed.", "Nothing to remove.")

    def describe(self, model_id: str) -> StoredModel | None:
        return None

    def profile_models(self, profile: str | None) -> frozenset[str]:
        return frozenset()


class ManagerStore:
    """The store `localspec models` manages (a ModelManager per call: the registry overlay may change)."""

    def __init__(self) -> None:
        self._headers: dict[tuple[Path, int, int], tuple[str, str, str]] = {}  # a header read per file version
        self._lock = threading.Lock()

    def check(self, name: str) -> None:
        from localspec.models import ModelManager
        from localspec.models.hub import parse_hub_ref

        if parse_hub_ref(name) is None:
            ModelManager().resolve(name)

    def pull(self, name: str, on_step: PullListener) -> str:
        from localspec.models import ModelManager
        from localspec.models.hub import parse_hub_ref

        mm = ModelManager()
        steps = PullSteps(on_step, pinned=_pinned_sha256)
        steps.say(PullPhase.MANIFEST, name)
        if parse_hub_ref(name) is not None:  # a malformed reference raises here, before any download
            model_id = mm.pull_hub(name, progress=steps).record.model_id
        else:
            model_id = mm.pull(name, progress=steps).model_id
        steps.say(PullPhase.WRITE, model_id)
        return model_id

    def installed_id(self, name: str) -> str | None:
        from localspec.models import ModelManager

        mm = ModelManager()
        try:
            model_id = mm.resolve(name).id
        except LocalspecError:
            model_id = name  # a store-only import has no registry entry: its id is its name
        try:
            return model_id if mm.manifest(model_id) is not None or mm.installed_path(model_id) else None
        except LocalspecError:  # a name no id can be (a path, a URL)
            return None

    def remove(self, model_id: str) -> None:
        """Frees the disk, as a client that deletes expects: a Hub download's file in the Hugging Face
        cache goes too (`localspec models rm` keeps it unless --purge-hf-cache)."""
        from localspec.models import ModelManager

        ModelManager().remove(model_id, purge_hf_cache=True)

    def describe(self, model_id: str) -> StoredModel | None:
        from localspec.models import ModelManager

        mm = ModelManager()
        try:
            m = mm.manifest(model_id)
            manifest_path = mm.store.manifest_path(model_id)
        except LocalspecError:
            return None
        if m is None or not m.files:
            return None
        first = Path(m.files[0].path)
        try:
            st, modified = first.stat(), manifest_path.stat().st_mtime
        except OSError:
            return None
        family, params, quant = self._header_facts(first, st.st_mtime_ns, st.st_size)
        return StoredModel(id=model_id, size=sum(f.size for f in m.files), sha256=m.files[0].sha256,
                           modified=modified, family=family, parameter_size=params, quantization=quant)

    def profile_models(self, profile: str | None) -> frozenset[str]:
        from localspec.models import ModelManager

        return frozenset(ModelManager().profile(profile).model_ids())  # a registry it cannot read raises

    def _header_facts(self, path: Path, mtime_ns: int, size: int) -> tuple[str, str, str]:
        key = (path, mtime_ns, size)
        with self._lock:
            if key in self._headers:
                return self._headers[key]
        from localspec.models.gguf_info import read_header
        from localspec.models.gguf_summary import info_from_meta

        try:
            meta = read_header(path)
            info = info_from_meta(meta)
            facts = (info.architecture or "", size_label(meta.get("general.size_label")) or
                     parameter_size(info.parameters), info.quant or "")
        except (LocalspecError, OSError, ValueError):
            facts = ("", "", "")  # a listing still lists a model whose header it cannot read
        with self._lock:
            self._headers[key] = facts
        return facts


def size_label(label: object) -> str | None:
    """The GGUF's own size label ("1.5B", the size the model is known by: counting its tensors says
    1.8B for Qwen2.5-Coder 1.5B); None when absent or not a short printable label (it is the file's)."""
    if isinstance(label, str) and 0 < len(label) <= 16 and label.isprintable() and label.strip() == label:
        return label
    return None


def parameter_size(n: int) -> str:
    """A parameter count as Ollama's listings write it: "1.5B", "494M"; "" when unknown."""
    if n <= 0:
        return ""
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _pinned_sha256(model_id: str) -> str | None:
    """The sha256 the registry pins for a model's (first) file, from any of its sources; None if none does."""
    from localspec.models import ModelManager

    try:
        entry = ModelManager().resolve(model_id)
    except LocalspecError:
        return None
    return next((f.sha256 for src in entry.sources for f in src.files if f.sha256), None)


class PullSteps:
    """The model manager's progress events as pull steps: a download at most every STEP_EVERY_S (and
    its last), a verify once, a failed source as a retry. Called on the pulling thread."""

    def __init__(self, on_step: PullListener, *, pinned: Callable[[str], str | None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.on_step, self.pinned, self.clock = on_step, pinned, clock
        self._digests: dict[str, str | None] = {}
        self._last = -1e9
        self._verified: set[str] = set()

    def say(self, phase: PullPhase, model_id: str, message: str = "") -> None:
        self.on_step(PullStep(phase, model_id, message=message))

    def __call__(self, event: ProgressEvent) -> None:
        if event.phase in ("download", "assemble"):
            finished = event.bytes_total is not None and event.bytes_done >= event.bytes_total
            now = self.clock()
            if not finished and now - self._last < STEP_EVERY_S:
                return
            self._last = now
            self.on_step(PullStep(PullPhase.DOWNLOAD, event.model_id, event.bytes_done, event.bytes_total,
                                  self._digest(event.model_id), event.message))
        elif event.phase == "verify" and event.model_id not in self._verified:
            self._verified.add(event.model_id)
            self.say(PullPhase.VERIFY, event.model_id)
        elif event.phase == "failed":
            self.say(PullPhase.RETRY, event.model_id, event.message)

    def _digest(self, model_id: str) -> str | None:
        if model_id not in self._digests:
            self._digests[model_id] = self.pinned(model_id)
        return self._digests[model_id]
