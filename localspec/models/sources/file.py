"""Local files: ``localspec models import PATH`` copies a GGUF into the store, and a pull takes a
registry model from the user's own model folders (LOCALSPEC_MODEL_DIRS) when a copy there has the
pinned sha256.

A copy (not a link or move) keeps the store self-contained: the user may delete or edit the
original without breaking an installed model.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

from localspec.models.progress import Emitter
from localspec.models.registry import FileSource, FileSpec, ModelEntry
from localspec.models.sources import FetchResult, SourceUnavailable
from localspec.models.store import ManifestFile, Store, check_free_space, iter_file, sha256_file, stream_to_partial


def copy_into_store(entry: ModelEntry, origin: Path, name: str, store: Store, emit: Emitter,
                    expected_size: int | None = None, expected_sha: str | None = None) -> FetchResult:
    final = store.model_dir(entry.id) / name
    partial = store.partial_path(final)
    size_now = origin.stat().st_size
    check_free_space(store.root, size_now)
    emit("download", 0, size_now, f"copying {origin}")
    # Capped at the size seen above: a file that grows while we copy it is refused, not followed.
    size, sha = stream_to_partial(partial, iter_file(origin), lambda d: emit("download", d, size_now),
                                  expected_size=size_now, max_bytes=size_now)
    label = "registry sha256" if expected_sha else ""
    store.finalize(partial, final, size, sha, expected_size, [(label, expected_sha)], model_id=entry.id)
    return FetchResult(
        files=[ManifestFile(name, str(final.resolve()), size, sha)],
        source={"kind": "file", "origin": str(origin.resolve())},
        downloaded_bytes=size,
    )


def fetch(entry: ModelEntry, src: FileSource, store: Store, emit: Emitter) -> FetchResult:
    """A file source is served from the model folders (tried before any source) or by `models import`."""
    where = ", ".join(str(d) for d in model_dirs_from_env()) or f"no folders ({MODEL_DIRS_ENV} is not set)"
    raise SourceUnavailable(
        f"local file {src.files[0].name} not found in the model folders ({where})",
        f"Set {MODEL_DIRS_ENV} to a folder holding it and pull again, or run "
        f"`localspec models import PATH --id {entry.id}`.",
    )


# ---------------------------------------------------------------- local model folders

MODEL_DIRS_ENV = "LOCALSPEC_MODEL_DIRS"
_SEARCH_DEPTH = 3  # folder/publisher/repo/file, as LM Studio lays out its models folder


def _candidates(dirs: Sequence[Path], spec: FileSpec) -> list[Path]:
    """Files in the folders with the spec's size; files named like the spec come first."""
    found: list[Path] = []
    for root in dirs:
        if not root.is_dir():
            continue
        base = len(root.parts)
        for folder, subdirs, files in os.walk(root):
            if len(Path(folder).parts) - base >= _SEARCH_DEPTH:
                subdirs.clear()
            subdirs[:] = [d for d in subdirs if not d.startswith(".")]
            for name in files:
                path = Path(folder) / name
                with contextlib.suppress(OSError):
                    if path.is_file() and path.stat().st_size == spec.size:
                        found.append(path)
    return sorted(found, key=lambda p: p.name != spec.name)


def _matching_copy(dirs: Sequence[Path], spec: FileSpec) -> Path | None:
    for path in _candidates(dirs, spec):
        with contextlib.suppress(OSError):
            if sha256_file(path) == spec.sha256:
                return path
    return None


def fetch_from_dirs(entry: ModelEntry, dirs: Sequence[Path], store: Store, emit: Emitter) -> FetchResult | None:
    """A copy of the model from the user's local folders, found by size and verified by sha256.

    Only files whose sha256 the registry pins can be taken this way: a file found by name alone
    could be anything. The first source whose every file is pinned and found wins.
    """
    for src in entry.sources:
        specs = list(src.files)
        if not specs or not all(f.sha256 and f.size is not None for f in specs):
            continue
        copies = [_matching_copy(dirs, f) for f in specs]
        if not all(copies):
            continue
        files: list[ManifestFile] = []
        for spec, origin in zip(specs, copies, strict=True):
            assert origin is not None
            emit("start", 0, spec.size, f"found {origin} (sha256 matches)")
            result = copy_into_store(entry, origin, spec.name, store, emit, spec.size, spec.sha256)
            files.extend(result.files)
        return FetchResult(files=files, source={"kind": "file", "origin": str(copies[0]), "found_in": "model dirs"},
                           downloaded_bytes=sum(f.size for f in files))
    return None


def model_dirs_from_env() -> tuple[Path, ...]:
    raw = os.environ.get(MODEL_DIRS_ENV, "")
    return tuple(Path(p).expanduser() for p in raw.split(os.pathsep) if p.strip())
