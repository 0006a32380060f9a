"""Local files: ``localspec models import PATH`` copies a GGUF into the store.

A copy (not a link or move) keeps the store self-contained: the user may delete or edit the
original without breaking an installed model.
"""

from __future__ import annotations

from pathlib import Path

from localspec.models.progress import Emitter
from localspec.models.registry import FileSource, ModelEntry
from localspec.models.sources import FetchResult, SourceUnavailable
from localspec.models.store import ManifestFile, Store, check_free_space, iter_file, stream_to_partial


def copy_into_store(entry: ModelEntry, origin: Path, name: str, store: Store, emit: Emitter,
                    expected_size: int | None = None, expected_sha: str | None = None) -> FetchResult:
    final = store.model_dir(entry.id) / name
    partial = store.partial_path(final)
    size_now = origin.stat().st_size
    check_free_space(store.root, size_now)
    emit("download", 0, size_now, f"copying {origin}")
    size, sha = stream_to_partial(partial, iter_file(origin), lambda d: emit("download", d, size_now),
                                  expected_size=size_now)
    label = "registry sha256" if expected_sha else ""
    store.finalize(partial, final, size, sha, expected_size, [(label, expected_sha)])
    return FetchResult(
        files=[ManifestFile(name, str(final.resolve()), size, sha)],
        source={"kind": "file", "origin": str(origin.resolve())},
        downloaded_bytes=size,
    )


def fetch(entry: ModelEntry, src: FileSource, store: Store, emit: Emitter) -> FetchResult:
    """A pull cannot find a local file by itself; the user points at it with `models import`."""
    raise SourceUnavailable(
        f"local file {src.files[0].name}: import it with "
        f"`localspec models import PATH --id {entry.id}`"
    )
