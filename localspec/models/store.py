"""The on-disk model store: ``<models_dir>/<model_id>/<file>`` plus ``manifest.json``.

Writes go to ``<name>.partial`` beside the final file, are hashed while written, verified, then
``os.replace``d into place: a reader (llama.cpp mmaps the weights) never sees a half-written file
and an existing file is never rewritten in place.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from localspec.errors import DiskFullError, IntegrityError, LocalspecError
from localspec.models.registry import check_model_id

logger = logging.getLogger(__name__)
CHUNK = 4 * 1024 * 1024
MANIFEST = "manifest.json"
QUARANTINE_KEEP = 3  # bad files kept per model, newest first
QUARANTINE_MAX_AGE_S = 7 * 24 * 3600  # and none older than a week
_UNREADABLE: set[Path] = set()  # manifests already said to be unreadable, in this process


@dataclass(frozen=True)
class ManifestFile:
    name: str
    path: str  # absolute; HF files live in the HF cache, others under the model's dir
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    model_id: str
    source: dict[str, Any]  # {"kind": ..., plus repo/revision/commit or packages or origin}
    files: list[ManifestFile]
    installed_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        d = json.loads(text)
        return cls(
            model_id=d["model_id"],
            source=dict(d.get("source") or {}),
            files=[ManifestFile(**f) for f in d["files"]],
            installed_at=d.get("installed_at", ""),
        )


def sha256_file(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    h = hashlib.sha256()
    done = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            done += len(chunk)
            if on_bytes:
                on_bytes(done)
    return h.hexdigest()


def _write_chunk(fh: BinaryIO, data: bytes) -> None:
    """The single place model bytes hit the disk (tests inject ENOSPC here)."""
    fh.write(data)


def disk_full_error(path: Path, needed: int | None) -> DiskFullError:
    try:
        free = shutil.disk_usage(path.parent if not path.is_dir() else path).free
    except OSError:
        free = None
    need = f"needs {needed:,} bytes" if needed else "needs more space"
    have = f", {free:,} free" if free is not None else ""
    return DiskFullError(
        f"Disk full while writing {path} ({need}{have}).",
        "Free space on that disk, or set LOCALSPEC_MODELS_DIR to a disk with room.",
    )


def check_free_space(directory: Path, needed: int | None, *, what: str | None = None,
                     fix: str | None = None, outcome: str = "nothing was downloaded") -> None:
    """Fail before downloading anything when the target disk cannot hold the file(s)."""
    if not needed:
        return
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent  # the store may not exist yet: ask its nearest ancestor
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return
    if free < needed:
        from localspec.models.units import human_bytes

        raise DiskFullError(
            f"Not enough disk space for {what or 'the file'}: it needs {needed:,} bytes ({human_bytes(needed)}), "
            f"{directory} has {free:,} ({human_bytes(free)}) free; {outcome}.",
            fix or "Free space on that disk, or set LOCALSPEC_MODELS_DIR to a disk with room.",
        )


def too_large_error(name: str, limit: int) -> IntegrityError:
    return IntegrityError(
        f"{name}: more than the expected {limit:,} bytes arrived; stopped and removed the partial file.",
        "Pull again; if it repeats, the source (or the registry entry's size) is wrong.",
    )


def stream_to_partial(
    partial: Path,
    chunks: Iterable[bytes],
    on_bytes: Callable[[int], None] | None = None,
    expected_size: int | None = None,
    *,
    max_bytes: int | None = None,
) -> tuple[int, str]:
    """Write chunks to ``partial`` (truncating), hashing as we go. Returns (size, sha256).

    ``max_bytes`` caps the file: the chunk that would pass it is never written, the partial file is
    removed and an IntegrityError says so (a source cannot fill the disk with more than it promised).
    On ENOSPC the partial file is deleted and a DiskFullError names the path and the size.
    Any other failure also removes the partial file: nothing half-written survives.
    """
    h = hashlib.sha256()
    done = 0
    partial.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(partial, "wb") as fh:
            for chunk in chunks:
                if max_bytes is not None and done + len(chunk) > max_bytes:
                    raise too_large_error(partial.name.removesuffix(".partial"), max_bytes)
                _write_chunk(fh, chunk)
                h.update(chunk)
                done += len(chunk)
                if on_bytes:
                    on_bytes(done)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        partial.unlink(missing_ok=True)
        if exc.errno == errno.ENOSPC:
            raise disk_full_error(partial.with_suffix(""), expected_size) from None
        raise
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return done, h.hexdigest()


def iter_file(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


class Store:
    """Files and manifests under one models directory."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # ---- layout
    def model_dir(self, model_id: str) -> Path:
        return self.root / check_model_id(model_id)

    def manifest_path(self, model_id: str) -> Path:
        return self.model_dir(model_id) / MANIFEST

    def downloads_dir(self, model_id: str) -> Path:
        return self.root / ".downloads" / check_model_id(model_id)

    @property
    def quarantine_dir(self) -> Path:
        return self.root / ".quarantine"

    @staticmethod
    def partial_path(final: Path) -> Path:
        return final.with_name(final.name + ".partial")

    # ---- manifests
    def read_manifest(self, model_id: str) -> Manifest | None:
        p = self.manifest_path(model_id)
        try:
            return Manifest.from_json(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # A corrupt manifest means "not installed"; a pull rewrites it. Said once, or the model was
            # simply gone from every listing with no word of why.
            if p not in _UNREADABLE:
                _UNREADABLE.add(p)
                logger.warning("model %r looks not installed: its manifest %s is unreadable (%s); "
                               "`localspec models pull %s` installs it again", model_id, p,
                               type(exc).__name__, model_id)
            return None

    def write_manifest(self, manifest: Manifest) -> Path:
        p = self.manifest_path(manifest.model_id)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".partial")
        tmp.write_text(manifest.to_json(), encoding="utf-8")
        os.replace(tmp, p)
        return p

    def installed(self, model_id: str) -> Manifest | None:
        """The manifest when every recorded file is present with its recorded size."""
        m = self.read_manifest(model_id)
        if m is None or not m.files:
            return None
        for f in m.files:
            try:
                if os.stat(f.path).st_size != f.size:
                    return None
            except OSError:
                return None
        return m

    def manifests(self) -> list[Manifest]:
        out: list[Manifest] = []
        if not self.root.is_dir():
            return out
        for d in sorted(self.root.iterdir()):
            if d.is_dir() and not d.name.startswith(".") and (d / MANIFEST).is_file():
                m = self.read_manifest(d.name)
                if m is not None:
                    out.append(m)
        return out

    # ---- installing
    def finalize(self, partial: Path, final: Path, size: int, sha256: str,
                 expected_size: int | None, expected_sha: Iterable[tuple[str, str | None]], *, model_id: str) -> None:
        """Verify a finished partial file and move it into place, or quarantine it."""
        if expected_size is not None and size != expected_size:
            q = self.quarantine(partial, model_id=model_id, name=final.name)
            raise IntegrityError(
                f"{final.name}: size {size:,} bytes, expected {expected_size:,}; moved to {q}.",
                "Pull again; if it repeats, the source is corrupt.",
            )
        for label, want in expected_sha:
            if want and want != sha256:
                q = self.quarantine(partial, model_id=model_id, name=final.name)
                raise IntegrityError(
                    f"{final.name}: sha256 {sha256[:12]}… does not match the {label} ({want[:12]}…); "
                    f"moved to {q}.",
                    "Pull again; if it repeats, the source or the registry entry is wrong.",
                )
        os.replace(partial, final)

    def quarantine(self, path: Path, *, model_id: str, name: str | None = None) -> Path:
        """Move a bad file out of the way (kept for inspection, never loaded), under its model's
        folder; the oldest are pruned (see prune_quarantine)."""
        folder = self.quarantine_dir / check_model_id(model_id)
        folder.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        dest = folder / f"{stamp}-{uuid.uuid4().hex[:8]}-{name or path.name}"
        try:
            os.replace(path, dest)
        except OSError:
            shutil.move(str(path), str(dest))
        with contextlib.suppress(OSError):
            os.utime(dest)  # its age in quarantine counts from now, not from its download
        self.prune_quarantine()
        return dest

    def prune_quarantine(self, now: float | None = None) -> list[Path]:
        """Keep at most QUARANTINE_KEEP files per model and none older than QUARANTINE_MAX_AGE_S.

        Returns what was removed. Files from before the per-model folders form one group.
        """
        root = self.quarantine_dir
        if not root.is_dir():
            return []
        now = time.time() if now is None else now
        groups = [root] + [d for d in root.iterdir() if d.is_dir() and not d.is_symlink()]
        removed: list[Path] = []
        for folder in groups:
            removed += _prune_folder(folder, now)
            if folder != root:
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only when empty
        return removed

    @contextlib.contextmanager
    def lock(self, model_id: str, *, wait: bool = True) -> Iterator[None]:
        """One pull, import or removal per model at a time, across processes (advisory; POSIX only).

        With ``wait=False`` a lock held elsewhere raises a LocalspecError instead of waiting.
        """
        d = self.model_dir(model_id)
        try:
            import fcntl
        except ImportError:  # Windows: no cross-process lock
            d.mkdir(parents=True, exist_ok=True)
            yield
            return
        while True:
            d.mkdir(parents=True, exist_ok=True)
            fh = open(d / ".lock", "w")  # noqa: SIM115 -- closed below on every path
            try:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
                except BlockingIOError:
                    raise LocalspecError(
                        f"Model {model_id!r} is being pulled or imported by another localspec process.",
                        "Wait for it to finish, then run the command again.",
                    ) from None
                try:
                    same = os.stat(d / ".lock").st_ino == os.fstat(fh.fileno()).st_ino
                except OSError:
                    same = False
                if not same:  # removed (with its directory) while we waited: lock the new one
                    continue
                try:
                    yield
                finally:
                    self._drop_if_empty(d)  # a failed pull or import leaves no empty directory
                    fcntl.flock(fh, fcntl.LOCK_UN)
                return
            finally:
                fh.close()

    @staticmethod
    def _drop_if_empty(d: Path) -> None:
        """A failed pull leaves no empty model directory behind (only its lock file)."""
        try:
            if {p.name for p in d.iterdir()} <= {".lock"}:
                (d / ".lock").unlink(missing_ok=True)
                d.rmdir()
        except OSError:
            pass

    def remove(self, model_id: str) -> int:
        """Delete the model's directory; returns bytes freed. The caller holds its lock."""
        d = self.model_dir(model_id)
        freed = dir_size(d)
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(self.downloads_dir(model_id), ignore_errors=True)
        return freed


def _prune_folder(folder: Path, now: float) -> list[Path]:
    files: list[tuple[float, Path]] = []
    for p in folder.iterdir():
        with contextlib.suppress(OSError):
            if p.is_file() or p.is_symlink():
                files.append((p.lstat().st_mtime, p))
    files.sort(reverse=True)  # newest first
    doomed = [p for i, (mtime, p) in enumerate(files) if i >= QUARANTINE_KEEP or now - mtime > QUARANTINE_MAX_AGE_S]
    for p in doomed:
        with contextlib.suppress(OSError):
            p.unlink()
    return doomed


def dir_size(path: Path) -> int:
    total = 0
    if not path.exists():
        return 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total
