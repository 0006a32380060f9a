"""Hugging Face Hub source: files stay in the standard HF cache (``hf cache ls`` sees them).

huggingface-hub reads HF_ENDPOINT / HF_HUB_OFFLINE / timeouts into ``constants`` at import time,
so everything here reads ``huggingface_hub.constants`` at call time, never a copy.

Resume: files download through huggingface-hub's own `http_get` (its session, token, proxies and
in-call retries with an HTTP Range request) into ``blobs/<etag>.localspec.incomplete`` in the HF
cache, a name that stays the same across runs: a pull that is killed, or loses the network, resumes
the next time from the bytes already on disk. (hf_hub_download's temporary file is unique per
process and deleted on failure since huggingface-hub 1.x, so it restarts a killed download from
zero.) A finished file is hashed, compared with the Hub's LFS sha256 and the registry's, and only
then moved to ``blobs/<etag>`` with the snapshot link that hf_hub_download would make, so the
Hugging Face cache tools see it. Xet-backed files download the same way, over HTTP from the
resolve URL (ranges work there too); Xet's chunk deduplication is not used.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from localspec.errors import IntegrityError
from localspec.models.progress import Emitter
from localspec.models.registry import FileSpec, HFSource, ModelEntry
from localspec.models.sources import FetchResult, SourceUnavailable
from localspec.models.store import (
    ManifestFile,
    Store,
    check_free_space,
    disk_full_error,
    sha256_file,
    too_large_error,
)

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
        return hf_hub_download(src.repo, spec.hub_path, revision=src.revision, local_files_only=True)
    except Exception:  # LocalEntryNotFoundError and friends: not cached
        return None


@dataclass(frozen=True)
class _Remote:
    """What one HEAD request says about a file."""

    lfs_sha: str | None  # an LFS file's ETag is its sha256; a small git-stored file has a git sha1 instead
    size: int | None
    commit: str | None
    etag: str | None
    location: str  # where to GET it (the Hub redirects LFS files to a CDN)
    url: str  # the resolve URL on the Hub that was asked


def _metadata(src: HFSource, spec: FileSpec) -> _Remote:
    """The file's metadata from one HEAD request, without retries."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub import errors as hf_errors

    from localspec.models.hub import gated_error

    url = hf_hub_url(src.repo, spec.hub_path, revision=src.revision, endpoint=_endpoint())
    timeout = min(float(constants.HF_HUB_ETAG_TIMEOUT), FAST_TIMEOUT)
    try:
        meta = get_hf_file_metadata(url, timeout=timeout)
    except hf_errors.OfflineModeIsEnabled:
        raise SourceUnavailable("offline mode (HF_HUB_OFFLINE) and not in the Hugging Face cache") from None
    except hf_errors.GatedRepoError:
        gated = gated_error(src.repo)
        raise SourceUnavailable(gated.cause, gated.fix) from None
    except (hf_errors.RepositoryNotFoundError, hf_errors.RevisionNotFoundError) as exc:
        raise SourceUnavailable(f"{src.repo}@{src.revision}: {_describe(exc)}") from None
    except hf_errors.HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", "?")
        what = "not found" if status == 404 else f"HTTP {status}"
        raise SourceUnavailable(f"{src.repo}/{spec.hub_path}: {what} at {_endpoint()}") from None
    except Exception as exc:  # network: DNS, refused, timeout, TLS
        raise SourceUnavailable(f"cannot reach {_endpoint()}: {_describe(exc)}") from None
    etag = (meta.etag or "").strip('"').lower()
    lfs_sha = etag if _SHA_RE.fullmatch(etag) else None
    return _Remote(lfs_sha, meta.size, meta.commit_hash, etag or None, meta.location, url)


def _size_limit(src: HFSource, spec: FileSpec, hub_size: int | None) -> int | None:
    """The most bytes this file may have: the registry's size, else the Hub's; a disagreement is
    refused before downloading."""
    if spec.size is not None and hub_size is not None and hub_size != spec.size:
        raise IntegrityError(f"{spec.name} from {src.repo}: the Hub has {hub_size:,} bytes, the registry expects "
                             f"{spec.size:,}; nothing was downloaded.",
                             "Check the registry entry's size and revision, or pull from another source.")
    return spec.size if spec.size is not None else hub_size


# ---------------------------------------------------------------- the HF cache layout

_ETAG_RE = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_COMMIT_RE = re.compile(r"[0-9a-f]{40}")
PARTIAL_SUFFIX = ".localspec.incomplete"


@dataclass(frozen=True)
class _CachePaths:
    blob: Path  # blobs/<etag>
    partial: Path  # blobs/<etag>.localspec.incomplete: the same name on every run, so it resumes
    pointer: Path  # snapshots/<commit>/<path in repo>, a link to the blob
    storage: Path  # models--USER--REPO


def _cache_paths(src: HFSource, spec: FileSpec, remote: _Remote) -> _CachePaths:
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    # Both come from the server and become path parts: anything but hex is refused.
    if remote.etag is None or not _ETAG_RE.fullmatch(remote.etag):
        raise SourceUnavailable(f"{src.repo}/{spec.hub_path}: the Hub sent no usable ETag ({remote.etag!r})")
    if remote.commit is None or not _COMMIT_RE.fullmatch(remote.commit):
        raise SourceUnavailable(f"{src.repo}/{spec.hub_path}: the Hub sent no usable commit ({remote.commit!r})")
    storage = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=src.repo, repo_type="model")
    blob = storage / "blobs" / remote.etag
    return _CachePaths(blob, blob.with_name(remote.etag + PARTIAL_SUFFIX),
                       storage / "snapshots" / remote.commit / spec.hub_path, storage)


def _link(paths: _CachePaths, src: HFSource, commit: str) -> None:
    """The snapshot entry and the ref that hf_hub_download would write for this file."""
    paths.pointer.parent.mkdir(parents=True, exist_ok=True)
    if not (paths.pointer.is_symlink() and paths.pointer.resolve() == paths.blob.resolve()):
        tmp = paths.pointer.with_name(paths.pointer.name + PARTIAL_SUFFIX)
        tmp.unlink(missing_ok=True)
        try:
            os.symlink(os.path.relpath(paths.blob, paths.pointer.parent), tmp)
        except OSError:  # no symlinks (some Windows setups): hf keeps the file in the snapshot itself
            os.replace(paths.blob, paths.pointer)
        else:
            os.replace(tmp, paths.pointer)
    if src.revision != commit:
        ref = paths.storage / "refs" / src.revision
        ref.parent.mkdir(parents=True, exist_ok=True)
        if not ref.is_file() or ref.read_text().strip() != commit:
            tmp_ref = ref.with_name(ref.name + PARTIAL_SUFFIX)
            tmp_ref.write_text(commit)
            os.replace(tmp_ref, ref)


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:  # a port out of range: an origin of its own
        port = -1
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


def _download_headers(remote: _Remote) -> dict[str, str]:
    """The headers for the GET of ``remote.location``: the token only where the Hub itself serves
    it. A CDN's signed URL needs none, and a Hub (or a mirror set as HF_ENDPOINT) may redirect to
    any host, so the token goes nowhere else, as in hf_hub_download."""
    from huggingface_hub.utils import build_hf_headers

    from localspec.models.hub import HUB_HOSTS

    headers = dict(build_hf_headers())
    scheme, host, _ = target = _origin(remote.location)
    if target != _origin(remote.url) and not (scheme == "https" and host in HUB_HOSTS):
        headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
    return headers


def _resume_download(paths: _CachePaths, remote: _Remote, name: str, adapter: type) -> None:
    """Fetch the rest of the file into its partial, from the bytes already there."""
    from huggingface_hub.file_download import http_get

    paths.partial.parent.mkdir(parents=True, exist_ok=True)
    with open(paths.partial, "ab") as fh:
        with contextlib.suppress(ImportError):  # two pulls of one file take turns (POSIX)
            import fcntl

            fcntl.flock(fh, fcntl.LOCK_EX)
        if paths.blob.exists():
            return  # another pull finished it while we waited
        have = fh.tell()
        if remote.size is not None and have > remote.size:
            fh.truncate(0)  # not this file's bytes: start again
            fh.seek(0)
            have = 0
        http_get(remote.location, fh, resume_size=have, headers=_download_headers(remote),
                 expected_size=remote.size, displayed_filename=name, tqdm_class=adapter)
        fh.flush()
        os.fsync(fh.fileno())


def _drop(path: Path) -> None:
    path.unlink(missing_ok=True)


@dataclass(frozen=True)
class _Planned:
    spec: FileSpec
    remote: _Remote | None  # None: served from the cache without asking the Hub
    cached: str | None  # the cached file's path when there is one
    paths: _CachePaths | None


def _plan(src: HFSource, spec: FileSpec) -> _Planned:
    if _offline():
        path = _from_cache(src, spec)
        if path is None:
            raise SourceUnavailable("offline mode (HF_HUB_OFFLINE=1) and not in the Hugging Face cache")
        return _Planned(spec, None, path, None)
    try:
        remote = _metadata(src, spec)
    except SourceUnavailable:
        path = _from_cache(src, spec)  # the Hub is down but we have it: fine
        if path is None:
            raise
        return _Planned(spec, None, path, None)
    paths = _cache_paths(src, spec, remote)
    return _Planned(spec, remote, str(paths.pointer) if paths.blob.is_file() else None, paths)


def _check_space(plans: list[_Planned], src: HFSource) -> None:
    """Refuse before the first byte when the HF cache's disk cannot hold what is left to fetch."""
    from huggingface_hub import constants

    needed = 0
    for p in plans:
        if p.cached is None and p.remote is not None and p.paths is not None:
            have = p.paths.partial.stat().st_size if p.paths.partial.is_file() else 0
            needed += max(0, (p.remote.size or 0) - have)
    names = ", ".join(p.spec.name for p in plans)
    check_free_space(Path(constants.HF_HUB_CACHE), needed, what=f"{names} from {src.repo}",
                     fix="Free space on that disk, or set HF_HUB_CACHE (or HF_HOME) to a disk with room.")


def fetch(entry: ModelEntry, src: HFSource, store: Store, emit: Emitter) -> FetchResult:
    from huggingface_hub import constants

    plans = [_plan(src, spec) for spec in src.files]
    for p in plans:
        if p.remote is not None:
            limit = _size_limit(src, p.spec, p.remote.size)  # a disagreement is refused before any download
            if limit is None and p.cached is None:  # nothing would stop an endless body short of a full disk
                raise SourceUnavailable(f"{src.repo}/{p.spec.hub_path}: neither the registry nor the Hub gives its "
                                        "size, so the download could not be bounded; nothing was downloaded",
                                        "Add `size = BYTES` to the file in the registry entry, or check HF_ENDPOINT.")
    _check_space(plans, src)
    files: list[ManifestFile] = []
    total = entry.expected_size() or sum((p.remote.size or 0) if p.remote else 0 for p in plans) or None
    offset = 0
    downloaded = 0
    commit: str | None = None
    for plan in plans:
        spec, remote, paths = plan.spec, plan.remote, plan.paths
        hub_sha = remote.lfs_sha if remote else None
        hub_size = remote.size if remote else None
        commit = remote.commit if remote else commit
        if plan.cached is not None:
            target = Path(plan.cached)
            if paths is not None and remote is not None and remote.commit:
                _link(paths, src, remote.commit)  # cached under another revision: link this one too
                target = paths.pointer
        else:
            assert remote is not None and paths is not None and remote.commit is not None
            limit = _size_limit(src, spec, hub_size)
            adapter = _tqdm_adapter(emit, spec.name, offset, total or hub_size, limit)
            try:
                _resume_download(paths, remote, spec.name, adapter)
            except _TooLarge:
                _drop(paths.partial)
                raise too_large_error(spec.name, limit or 0) from None
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    _drop(paths.partial)  # the space is what is missing: give it back
                    raise disk_full_error(Path(constants.HF_HUB_CACHE), hub_size) from None
                raise _interrupted(spec, paths, exc) from None
            except Exception as exc:
                raise _interrupted(spec, paths, exc) from None
            known_sha = None
            if not paths.blob.exists():
                known_sha = _verify(entry, src, spec, paths.partial, hub_sha, hub_size, store, emit)
                os.replace(paths.partial, paths.blob)
            _link(paths, src, remote.commit)
            target = paths.pointer
            downloaded += hub_size or 0
            if known_sha is not None:  # hashed on its way in: once is enough
                files.append(ManifestFile(spec.name, str(target.absolute()), paths.blob.stat().st_size, known_sha))
                offset += files[-1].size
                continue
        files.append(_verified_file(entry, src, spec, target, hub_sha, hub_size, store, emit))
        offset += files[-1].size
    return FetchResult(
        files=files,
        source={"kind": "hf", "repo": src.repo, "revision": src.revision, "commit": commit,
                "endpoint": _endpoint()},
        downloaded_bytes=downloaded,
    )


def _interrupted(spec: FileSpec, paths: _CachePaths, exc: BaseException) -> SourceUnavailable:
    kept = paths.partial.stat().st_size if paths.partial.is_file() else 0
    again = f"; {kept:,} bytes kept, pulling again resumes there" if kept else ""
    return SourceUnavailable(f"download of {spec.name} failed: {_describe(exc)}{again}")


def _problems(spec: FileSpec, size: int, sha: str, hub_sha: str | None, hub_size: int | None) -> list[str]:
    want_size = spec.size if spec.size is not None else hub_size
    problems = []
    if want_size is not None and size != want_size:
        problems.append(f"size {size:,} bytes, expected {want_size:,}")
    for label, want in (("Hub's LFS sha256", hub_sha), ("registry sha256", spec.sha256)):
        if want and want != sha:
            problems.append(f"sha256 {sha[:12]}… does not match the {label} ({want[:12]}…)")
    return problems


def _verify(entry: ModelEntry, src: HFSource, spec: FileSpec, path: Path, hub_sha: str | None,
            hub_size: int | None, store: Store, emit: Emitter) -> str:
    """A finished download is checked before it enters the HF cache (a bad one is quarantined);
    returns its sha256."""
    size = path.stat().st_size
    emit("verify", 0, size, f"checking sha256 of {spec.name}")
    sha = sha256_file(path, lambda d: emit("verify", d, size))
    problems = _problems(spec, size, sha, hub_sha, hub_size)
    if problems:
        q = store.quarantine(path, model_id=entry.id, name=spec.name)
        raise IntegrityError(f"{spec.name} from {src.repo}: {'; '.join(problems)}; moved to {q}.",
                             "Pull again; if it repeats, the source or the registry entry is wrong.")
    return sha


def _verified_file(entry: ModelEntry, src: HFSource, spec: FileSpec, pointer: Path, hub_sha: str | None,
                   hub_size: int | None, store: Store, emit: Emitter) -> ManifestFile:
    """Hash the file in the cache (what the manifest records), with progress."""
    blob = pointer.resolve()
    size = blob.stat().st_size
    emit("verify", 0, size, f"checking sha256 of {spec.name}")

    def on_bytes(d: int, total: int = size) -> None:
        emit("verify", d, total)  # the default binds this file's size

    sha = sha256_file(blob, on_bytes)
    problems = _problems(spec, size, sha, hub_sha, hub_size)
    if problems:
        # Take the bad blob out of the HF cache too, so nothing else picks it up.
        q = store.quarantine(blob, model_id=entry.id, name=spec.name)
        if pointer != blob:
            pointer.unlink(missing_ok=True)
        raise IntegrityError(f"{spec.name} from {src.repo}: {'; '.join(problems)}; moved to {q}.",
                             "Pull again; if it repeats, the source or the registry entry is wrong.")
    return ManifestFile(spec.name, str(pointer.absolute()), size, sha)
