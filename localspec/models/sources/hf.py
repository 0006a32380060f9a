"""Hugging Face Hub source: files stay in the standard HF cache (``hf cache ls`` sees them).

huggingface-hub reads HF_ENDPOINT / HF_HUB_OFFLINE / timeouts into ``constants`` at import time,
so everything here reads ``huggingface_hub.constants`` at call time, never a copy.

Resume: hf_hub_download retries a dropped connection with an HTTP Range request inside the same
call. Since huggingface-hub 1.x its temporary file is unique per process and deleted on failure,
so a pull that is killed outright restarts that file from zero on the next run; it still
completes (covered by the tests).
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Any

from localspec.errors import IntegrityError
from localspec.models.progress import Emitter
from localspec.models.registry import FileSpec, HFSource, ModelEntry
from localspec.models.sources import FetchResult, SourceUnavailable
from localspec.models.store import ManifestFile, Store, disk_full_error, sha256_file, too_large_error

_SHA_RE = re.compile(r"[0-9a-f]{64}")
_TRUE = {"1", "on", "yes", "true"}
# Unreachable hosts must fail within seconds so the next source gets its turn.
FAST_TIMEOUT = 10.0


def _offline() -> bool:
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return bool(constants.HF_HUB_OFFLINE) or env.strip().lower() in _TRUE


def _endpoint() -> str:
    from huggingface_hub import constants

    return str(constants.ENDPOINT).rstrip("/")


class _TooLarge(Exception):
    """Raised from the progress hook: more bytes arrived than the file may have."""


def _tqdm_adapter(emit: Emitter, name: str, offset: int, total: int | None, limit: int | None = None):
    """A tqdm subclass that forwards byte counts to our progress callback and draws nothing.

    With ``limit``, the byte that would pass it stops the download: huggingface-hub reports each
    chunk before writing it, and deletes its temporary file when the download raises.
    """
    from tqdm.auto import tqdm as base

    class _Forward(base):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.pop("name", None)
            kwargs["disable"] = True  # we draw our own bar
            super().__init__(*args, **kwargs)
            self._done = int(kwargs.get("initial") or 0)
            emit("download", offset + self._done, total, name)

        def update(self, n: float | None = 1) -> bool | None:
            self._done += int(n or 0)
            if limit is not None and self._done > limit:
                raise _TooLarge()
            emit("download", offset + self._done, total, name)
            return super().update(n)

        # Having these makes huggingface-hub's Xet reporter use one bar for file bytes and
        # route network bytes here, where we drop them: we report file bytes only.
        def update_transfer(self, n: float | None = 1) -> None:
            pass

        def set_transfer_postfix_str(self, s: str = "", refresh: bool = True) -> None:
            pass

    return _Forward


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = next((t for t in text if t.strip()), type(exc).__name__)
    return f"{type(exc).__name__}: {first[:200]}"


def _from_cache(src: HFSource, spec: FileSpec) -> str | None:
    """The file from the local HF cache only (offline, or the Hub unreachable)."""
    from huggingface_hub import hf_hub_download

    try:
        return hf_hub_download(src.repo, spec.name, revision=src.revision, local_files_only=True)
    except Exception:  # LocalEntryNotFoundError and friends: not cached
        return None


def _metadata(src: HFSource, spec: FileSpec) -> tuple[str | None, int | None, str | None]:
    """(lfs sha256 or None, size, commit) from one HEAD request, without retries."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub import errors as hf_errors

    url = hf_hub_url(src.repo, spec.name, revision=src.revision, endpoint=_endpoint())
    timeout = min(float(constants.HF_HUB_ETAG_TIMEOUT), FAST_TIMEOUT)
    try:
        meta = get_hf_file_metadata(url, timeout=timeout)
    except hf_errors.OfflineModeIsEnabled:
        raise SourceUnavailable("offline mode (HF_HUB_OFFLINE) and not in the Hugging Face cache") from None
    except (hf_errors.RepositoryNotFoundError, hf_errors.RevisionNotFoundError, hf_errors.GatedRepoError) as exc:
        raise SourceUnavailable(f"{src.repo}@{src.revision}: {_describe(exc)}") from None
    except hf_errors.HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", "?")
        what = "not found" if status == 404 else f"HTTP {status}"
        raise SourceUnavailable(f"{src.repo}/{spec.name}: {what} at {_endpoint()}") from None
    except Exception as exc:  # network: DNS, refused, timeout, TLS
        raise SourceUnavailable(f"cannot reach {_endpoint()}: {_describe(exc)}") from None
    etag = (meta.etag or "").strip('"').lower()
    # An LFS file's ETag is its sha256; a small git-stored file has a git sha1 instead.
    lfs_sha = etag if _SHA_RE.fullmatch(etag) else None
    return lfs_sha, meta.size, meta.commit_hash


def _size_limit(src: HFSource, spec: FileSpec, hub_size: int | None) -> int | None:
    """The most bytes this file may have: the registry's size, else the Hub's; a disagreement is
    refused before downloading."""
    if spec.size is not None and hub_size is not None and hub_size != spec.size:
        raise IntegrityError(f"{spec.name} from {src.repo}: the Hub has {hub_size:,} bytes, the registry expects "
                             f"{spec.size:,}; nothing was downloaded.",
                             "Check the registry entry's size and revision, or pull from another source.")
    return spec.size if spec.size is not None else hub_size


def fetch(entry: ModelEntry, src: HFSource, store: Store, emit: Emitter) -> FetchResult:
    from huggingface_hub import constants, hf_hub_download

    files: list[ManifestFile] = []
    total = entry.expected_size() or None
    offset = 0
    downloaded = 0
    commit: str | None = None
    for spec in src.files:
        if _offline():
            path = _from_cache(src, spec)
            if path is None:
                raise SourceUnavailable("offline mode (HF_HUB_OFFLINE=1) and not in the Hugging Face cache")
            hub_sha, hub_size = None, None
        else:
            try:
                hub_sha, hub_size, commit = _metadata(src, spec)
            except SourceUnavailable:
                path = _from_cache(src, spec)  # the Hub is down but we have it: fine
                if path is None:
                    raise
                hub_sha, hub_size = None, None
            else:
                limit = _size_limit(src, spec, hub_size)
                adapter = _tqdm_adapter(emit, spec.name, offset, total or hub_size, limit)
                try:
                    path = hf_hub_download(
                        src.repo, spec.name, revision=src.revision, endpoint=_endpoint(),
                        etag_timeout=min(float(constants.HF_HUB_ETAG_TIMEOUT), FAST_TIMEOUT),
                        tqdm_class=adapter,
                    )
                except _TooLarge:
                    raise too_large_error(spec.name, limit or 0) from None
                except OSError as exc:
                    if exc.errno == errno.ENOSPC:
                        raise disk_full_error(Path(constants.HF_HUB_CACHE), hub_size) from None
                    raise SourceUnavailable(f"download of {spec.name} failed: {_describe(exc)}") from None
                except Exception as exc:
                    raise SourceUnavailable(f"download of {spec.name} failed: {_describe(exc)}") from None
                downloaded += hub_size or 0
        pointer = Path(path)
        blob = pointer.resolve()
        size = blob.stat().st_size
        emit("verify", 0, size, f"checking sha256 of {spec.name}")

        def on_bytes(d: int, total: int = size) -> None:
            emit("verify", d, total)  # the default binds this file's size

        sha = sha256_file(blob, on_bytes)
        want_size = spec.size if spec.size is not None else hub_size
        problems = []
        if want_size is not None and size != want_size:
            problems.append(f"size {size:,} bytes, expected {want_size:,}")
        for label, want in (("Hub's LFS sha256", hub_sha), ("registry sha256", spec.sha256)):
            if want and want != sha:
                problems.append(f"sha256 {sha[:12]}… does not match the {label} ({want[:12]}…)")
        if problems:
            # Take the bad blob out of the HF cache too, so nothing else picks it up.
            q = store.quarantine(blob, model_id=entry.id, name=spec.name)
            if pointer != blob:
                pointer.unlink(missing_ok=True)
            raise IntegrityError(f"{spec.name} from {src.repo}: {'; '.join(problems)}; moved to {q}.",
                                 "Pull again; if it repeats, the source or the registry entry is wrong.")
        files.append(ManifestFile(spec.name, str(pointer.absolute()), size, sha))
        offset += size
    return FetchResult(
        files=files,
        source={"kind": "hf", "repo": src.repo, "revision": src.revision, "commit": commit,
                "endpoint": _endpoint()},
        downloaded_bytes=downloaded,
    )
