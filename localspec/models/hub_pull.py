"""Any GGUF on the Hugging Face Hub: list the repo, pick the quant, refuse what cannot work before
downloading, fetch and verify every shard, and register it under a generated id."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from localspec.errors import DownloadError, UsageError
from localspec.models.hub import HubRef, QuantPick, RepoListing, parse_hub_ref
from localspec.models.manager import HubPull, InstallRecord, first_gguf
from localspec.models.progress import Emitter, ProgressCallback
from localspec.models.registry import HFSource, ModelEntry
from localspec.models.sources import SourceUnavailable
from localspec.models.store import Manifest

if TYPE_CHECKING:
    from localspec.models.manager import ModelManager


def pull_hub(mm: ModelManager, reference: str, progress: ProgressCallback | None = None,
             force: bool = False) -> HubPull:
    """Pull ``hf.co/USER/REPO[:QUANT]`` (or ``USER/REPO:QUANT``, or a file URL): list the repo,
    pick the quant, refuse what cannot work before downloading, fetch and verify every shard,
    and register it under a generated id (its alias: the reference)."""
    from localspec.models import hub

    ref = parse_hub_ref(reference)
    if ref is None:
        raise UsageError(f"{reference!r} is not a Hugging Face reference.", "Use hf.co/USER/REPO[:QUANT].")
    mm.store.prune_quarantine()
    if not force and ref.alias in mm.registry:  # pulled before: no need to ask the Hub
        entry = mm.resolve(ref.alias)
        done = mm.already_installed(entry)
        if done is not None:
            Emitter(progress, entry.id)("skip", done.size, done.size, f"already installed from {done.source}")
            return HubPull(done, ref.repo, entry.quant or "?", "", mm.pair_draft(entry.id))
    listing = hub.list_repo(ref.repo, ref.revision)
    if listing.gated and not hub.has_token():
        raise hub.gated_error(ref.repo)  # refused before a byte: the download would be a 401
    pick = hub.pick_quant(listing, ref, _fits_here)
    known = _registry_entry_for(mm, listing, pick)
    if known is not None:  # the curated registry has this very file: pull it from there (mirrors too)
        rec = mm.pull(known.id, progress, force)
        return HubPull(rec, ref.repo, pick.quant.quant, pick.note, mm.pair_draft(known.id))
    entry = _hub_entry(mm, ref, listing, pick)
    rec = _install_hub(mm, entry, pick, progress, force)
    return HubPull(rec, ref.repo, pick.quant.quant, pick.note, mm.pair_draft(rec.model_id))

def _registry_entry_for(mm: ModelManager, listing: RepoListing, pick: QuantPick) -> ModelEntry | None:
    names = [f.path for f in pick.quant.files]
    for entry in mm.registry.models.values():
        for src in entry.sources:
            if (isinstance(src, HFSource) and src.repo.lower() == listing.repo.lower()
                    and [f.hub_path for f in src.files] == names and not _pulled_from_hub(entry)):
                return entry
    return None

def _hub_entry(mm: ModelManager, ref: HubRef, listing: RepoListing, pick: QuantPick) -> ModelEntry:
    from localspec.models import hub
    from localspec.models.registry import FileSpec

    files = [FileSpec(name=f.name, repo_path=f.path if f.path != f.name else None, size=f.size,
                      sha256=f.sha256) for f in pick.quant.files]
    # Pinned to the commit listed: what was checked is what gets downloaded, now and on a re-pull.
    src = HFSource(kind="hf", repo=listing.repo, revision=listing.commit or ref.revision, files=files)
    aliases = [ref.alias]
    exact = f"hf.co/{listing.repo}:{pick.quant.quant}"
    if exact != ref.alias:
        aliases.append(exact)
    mid = hub.generated_id(listing.repo, pick.quant.quant)
    taken = mm.registry.models.get(mid)
    n = 2
    while taken is not None and not _same_hub_model(taken, src):
        mid = f"{hub.generated_id(listing.repo, pick.quant.quant)}-{n}"
        taken, n = mm.registry.models.get(mid), n + 1
    return ModelEntry(id=mid, aliases=aliases, role="target", quant=pick.quant.quant, sources=[src])

def _install_hub(mm: ModelManager, entry: ModelEntry, pick: QuantPick, progress: ProgressCallback | None,
                 force: bool) -> InstallRecord:
    from localspec.models import overlay
    from localspec.models.gguf_info import read_gguf_info
    from localspec.models.sources import hf

    src = entry.sources[0]
    assert isinstance(src, HFSource)
    emit = Emitter(progress, entry.id, "hf")
    with mm.store.lock(entry.id):
        done = None if force else mm.already_installed(entry)
        if done is not None:
            emit("skip", done.size, done.size, f"already installed from {done.source}")
            return done
        shards = f", {len(src.files)} files" if len(src.files) > 1 else ""
        emit("start", 0, pick.quant.size, pick.note or f"pulling {src.repo} {pick.quant.quant}{shards}")
        try:
            result = hf.fetch(entry, src, mm.store, emit)
        except SourceUnavailable as exc:
            raise DownloadError(f"Could not pull {entry.aliases[0]}: {exc.reason}.",
                                exc.fix or "Check the network (or HF_ENDPOINT) and pull again; "
                                           "a pull that stopped resumes where it was.") from None
        mm.check_fetched_gguf(entry, result)
        info = read_gguf_info(first_gguf([Path(f.path) for f in result.files]))
        entry = entry.model_copy(update={
            "family": info.architecture, "quant": info.quant or entry.quant, "parameters": info.parameters,
            "context_length": info.context_length})
        overlay.put_hub_entry(mm.paths.user_registry, entry)
        mm.forget_registry()  # reload with the new entry
        manifest = Manifest(entry.id, result.source, result.files)
        mm.store.write_manifest(manifest)
    rec = mm.install_record(entry.id, manifest, downloaded=True, desc=src.describe())
    emit("done", rec.size, rec.size, f"installed as {entry.id}")
    return rec


def _pulled_from_hub(entry: ModelEntry) -> bool:
    return any(a.startswith("hf.co/") for a in entry.aliases)


def _same_hub_model(entry: ModelEntry, src: HFSource) -> bool:
    """An entry this pull may replace: one an earlier pull of the same repo and files wrote."""
    paths = [f.hub_path for f in src.files]
    return _pulled_from_hub(entry) and any(
        isinstance(s, HFSource) and s.repo == src.repo and [f.hub_path for f in s.files] == paths
        for s in entry.sources)


def _fits_here(q) -> bool:
    """Would this quant fit in free memory? From its size alone (no header read yet)."""
    from localspec.models.fit import fit_verdict_for_size

    return fit_verdict_for_size(q.size) != "too large"
