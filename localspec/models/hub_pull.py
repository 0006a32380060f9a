"""Any GGUF on the Hugging Face Hub: list the repo, pick the quant, refuse what cannot work before
downloading, fetch and verify every shard, and register it under a generated id.

Before the first byte of weights, the file's header is read with HTTP range requests
(hub_header.py): a file that is not a GGUF is refused, the fit (weights plus KV cache) is stated,
and a draft named with ``--draft-model`` is compared token by token with the target and refused when
its tokenizer differs. When the header cannot be read (a server without range support), the pull
goes on from the file size alone and says so; the draft is then checked once downloaded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from localspec.errors import DownloadError, IncompatibleDraftError, IntegrityError, UsageError
from localspec.models.gguf_info import GGUFMeta
from localspec.models.hub import HubQuant, HubRef, QuantPick, RepoListing, parse_hub_ref
from localspec.models.hub_header import Depth, HeaderRead, Outcome, RemoteFit, read_remote_header, remote_fit
from localspec.models.manager import HubPull, InstallRecord, first_gguf
from localspec.models.progress import Emitter, ProgressCallback
from localspec.models.registry import HFSource, ModelEntry, Role
from localspec.models.sources import SourceUnavailable
from localspec.models.store import Manifest

if TYPE_CHECKING:
    from localspec.models.manager import ModelManager


def pull_hub(mm: ModelManager, reference: str, progress: ProgressCallback | None = None,
             force: bool = False, *, draft: str | None = None, role: Role = "target",
             read_ahead: _ReadAhead | None = None) -> HubPull:
    """Pull ``hf.co/USER/REPO[:QUANT]`` (or ``USER/REPO:QUANT``, or a file URL): list the repo,
    pick the quant, refuse what cannot work before downloading, fetch and verify every shard,
    and register it under a generated id (its alias: the reference). ``draft`` (a Hub reference
    or a registry id) is checked against it before anything downloads, then pulled too.
    ``read_ahead``: a header of this model already read (the draft check's), not fetched again."""
    from localspec.models import hub

    ref = parse_hub_ref(reference)
    if ref is None:
        raise UsageError(f"{reference!r} is not a Hugging Face reference.", "Use hf.co/USER/REPO[:QUANT].")
    mm.store.prune_quarantine()
    if not force and ref.alias in mm.registry:  # pulled before: no need to ask the Hub
        entry = mm.resolve(ref.alias)
        done = mm.already_installed(entry)
        if done is not None:
            drafted = _pull_draft(mm, draft, done.path, ref.alias, progress, force)
            Emitter(progress, entry.id)("skip", done.size, done.size, f"already installed from {done.source}")
            return HubPull(done, ref.repo, entry.quant or "?", "", mm.pair_draft(entry.id), draft_record=drafted)
    listing = hub.list_repo(ref.repo, ref.revision)
    if listing.gated and not hub.has_token():
        raise hub.gated_error(ref.repo)  # refused before a byte: the download would be a 401
    revision = listing.commit or ref.revision
    n_ctx = _n_ctx(mm)
    pick = hub.pick_quant(listing, ref, _fitter(listing, revision, n_ctx))
    # The token texts (megabytes) only when a draft is compared with them; the fit needs a few KiB.
    head = _header(listing.repo, revision, pick.quant, Depth.TOKENS if draft else Depth.FIT, read_ahead)
    fit = remote_fit(pick.quant.size, head, n_ctx)
    checked = _check_draft(mm, draft, head.meta, ref.alias) if draft else None  # refused before any download
    known = _registry_entry_for(mm, listing, pick)
    if known is not None:  # the curated registry has this very file: pull it from there (mirrors too)
        rec = mm.pull(known.id, progress, force)
    else:
        entry = _hub_entry(mm, ref, listing, pick, role)
        rec = _install_hub(mm, entry, pick, progress, force, fit)
    drafted = _pull_draft(mm, draft, rec.path, ref.alias, progress, force, checked)
    return HubPull(rec, ref.repo, pick.quant.quant, pick.note, mm.pair_draft(rec.model_id), fit=fit.line,
                   draft_record=drafted)


# ---------------------------------------------------------------- headers, fit and the draft, before download


def _n_ctx(mm: ModelManager) -> int:
    """The context fit is judged at: the default profile's (as `models info` does)."""
    try:
        return int(mm.profile().n_ctx)
    except Exception:  # noqa: BLE001  a broken overlay still pulls
        return 4096


@dataclass(frozen=True)
class _ReadAhead:
    """A header read by range requests, and which file at which commit and depth it is."""

    repo: str
    path: str
    revision: str
    depth: Depth
    head: HeaderRead

    def serves(self, repo: str, path: str, revision: str, depth: Depth) -> bool:
        deep_enough = self.depth is Depth.TOKENS or depth is Depth.FIT
        return (self.repo, self.path, self.revision) == (repo, path, revision) and deep_enough


def _read_ahead(repo: str, revision: str, quant: HubQuant, depth: Depth) -> _ReadAhead:
    """A quant's header by range requests; a file that is not a GGUF is refused here, before download."""
    first = quant.files[0]  # a split model's keys are in its first shard
    head = read_remote_header(repo, first.path, revision, first.size, depth=depth)
    if head.outcome is Outcome.INVALID:
        raise IntegrityError(f"{repo}/{first.path} is not a GGUF model: {head.detail}; nothing was downloaded.",
                             "Pick another quant or repo (`localspec models search NAME`).")
    return _ReadAhead(repo, first.path, revision, depth, head)


def _header(repo: str, revision: str, quant: HubQuant, depth: Depth, known: _ReadAhead | None = None) -> HeaderRead:
    """A quant's header: `known` when it is this file's, read deep enough, else by range requests."""
    if known is not None and known.serves(repo, quant.files[0].path, revision, depth):
        return known.head
    return _read_ahead(repo, revision, quant, depth).head


def _fitter(listing: RepoListing, revision: str, n_ctx: int) -> Callable[[HubQuant], bool]:
    """Would a quant fit in free memory, weights plus KV cache? The KV layout is the model's, the same
    in every quant, so one header (read only if a quant must be chosen by fit) serves them all."""
    from localspec.models import hub

    @cache
    def fit_header() -> HeaderRead | None:
        try:
            return hub.read_fit_header(listing.repo, revision, listing.quants)
        except Exception:  # noqa: BLE001  the size alone still judges
            return None

    def fits(q: HubQuant) -> bool:
        return remote_fit(q.size, fit_header(), n_ctx).verdict != "too large"

    return fits


def read_header_of(path: Path) -> GGUFMeta | None:
    from localspec.models.gguf_info import read_header

    try:
        return read_header(path)
    except IntegrityError:
        return None


@dataclass(frozen=True)
class _DraftCheck:
    """What was known of a ``--draft-model`` before download."""

    compared: bool  # False: its header could not be read ahead; it is checked once downloaded
    detail: str
    read_ahead: _ReadAhead | None = None  # the Hub draft's header, for its own pull not to read it again


def _draft_header(mm: ModelManager, draft: str) -> tuple[GGUFMeta | None, str, _ReadAhead | None]:
    """The draft's header with its token texts: from disk when installed, else by range requests
    (then also the read itself, which the draft's Hub pull reuses)."""
    from localspec.models import hub
    from localspec.models.registry import HFSource

    ref = parse_hub_ref(draft)
    if ref is not None:
        listing = hub.list_repo(ref.repo, ref.revision)
        if listing.gated and not hub.has_token():
            raise hub.gated_error(ref.repo)
        pick = hub.pick_quant(listing, ref, lambda q: True)
        ahead = _read_ahead(listing.repo, listing.commit or ref.revision, pick.quant, Depth.TOKENS)
        return ahead.head.meta, ahead.head.detail, ahead
    entry = mm.resolve(draft)  # ModelNotFoundError names the ids there are
    path = mm.installed_path(entry.id)
    if path is not None:
        return read_header_of(path), "its installed file is not a valid GGUF", None
    src = next((s for s in entry.sources if isinstance(s, HFSource) and s.files[0].size), None)
    if src is None:
        return None, "it is not installed and no Hub file of it is known", None
    spec = src.files[0]
    head = read_remote_header(src.repo, spec.hub_path, src.revision, spec.size or 0, depth=Depth.TOKENS)
    return head.meta, head.detail, None


def _check_draft(mm: ModelManager, draft: str, target: GGUFMeta | None, target_name: str) -> _DraftCheck:
    """Refuse, before any download, a draft whose tokenizer differs from the target's."""
    from localspec.models.compat import check_draft_compat

    meta, why, ahead = _draft_header(mm, draft)
    if target is None or meta is None:
        missing = "the target's" if target is None else f"{draft}'s"
        return _DraftCheck(False, f"{missing} header could not be read ahead ({why}); checked once downloaded",
                           ahead)
    try:
        c = check_draft_compat(target, meta)
    except IncompatibleDraftError as exc:
        raise IncompatibleDraftError(f"{draft} cannot draft for {target_name}: {exc.cause.rstrip('.')}; "
                                     "nothing was downloaded.", exc.fix) from None
    return _DraftCheck(True, f"same {c.tokenizer_model} tokenizer, {c.tokens_compared:,} token texts equal", ahead)


def _pull_draft(mm: ModelManager, draft: str | None, target_path: Path, target_name: str,
                progress: ProgressCallback | None, force: bool, checked: _DraftCheck | None = None
                ) -> InstallRecord | None:
    """Pull ``--draft-model`` after its target; one not compared ahead is compared now, and refused
    (left installed, but said) when it differs."""
    if draft is None:
        return None
    target = read_header_of(target_path)
    if checked is None:
        checked = _check_draft(mm, draft, target, target_name)
    if parse_hub_ref(draft) is not None:
        rec = pull_hub(mm, draft, progress, force, role="draft", read_ahead=checked.read_ahead).record
    else:
        rec = mm.pull(draft, progress, force)
    if not checked.compared and target is not None:
        from localspec.models.compat import check_draft_compat
        from localspec.models.gguf_info import read_header

        try:
            check_draft_compat(target, read_header(rec.path))
        except IncompatibleDraftError as exc:
            raise IncompatibleDraftError(f"{draft} (installed as {rec.model_id}, as its header could not be read "
                                         f"ahead) cannot draft for {target_name}: {exc.cause}",
                                         f"Remove it (`localspec models rm {rec.model_id}`) and pick a draft of "
                                         "the target's family.") from None
    return rec

def _registry_entry_for(mm: ModelManager, listing: RepoListing, pick: QuantPick) -> ModelEntry | None:
    names = [f.path for f in pick.quant.files]
    for entry in mm.registry.models.values():
        for src in entry.sources:
            if (isinstance(src, HFSource) and src.repo.lower() == listing.repo.lower()
                    and [f.hub_path for f in src.files] == names and not _pulled_from_hub(entry)):
                return entry
    return None

def _hub_entry(mm: ModelManager, ref: HubRef, listing: RepoListing, pick: QuantPick, role: Role) -> ModelEntry:
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
    return ModelEntry(id=mid, aliases=aliases, role=role, quant=pick.quant.quant, sources=[src])

def _install_hub(mm: ModelManager, entry: ModelEntry, pick: QuantPick, progress: ProgressCallback | None,
                 force: bool, fit: RemoteFit) -> InstallRecord:
    from localspec.models import overlay
    from localspec.models.gguf_summary import read_gguf_info
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
        what = pick.note or f"pulling {src.repo} {pick.quant.quant}{shards}"
        emit("start", 0, pick.quant.size, f"{what}; {fit.line}")  # the fit is known before the download
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

