"""Any GGUF on the Hugging Face Hub: what a pull string names, which files a repo has, which quant
to take, and search.

`localspec models pull` takes ``hf.co/USER/REPO[:QUANT]``, ``USER/REPO[:QUANT]`` and a file's URL
(``https://huggingface.co/USER/REPO/blob|resolve/REV/FILE.gguf``). Registry ids never hold a '/',
so any string with one is a Hub reference. Listing and search go through huggingface-hub's own
client (its session, token and HF_ENDPOINT), one request each with a short timeout, no retries:
an unreachable Hub is one line within seconds, not minutes of backoff.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localspec.errors import DownloadError, ModelNotFoundError, UsageError
from localspec.models.registry import _HF_REPO_RE, _HF_REVISION_RE, MAX_FILE_NAME_BYTES

if TYPE_CHECKING:
    from localspec.models.hub_header import HeaderRead

DEFAULT_QUANT = "Q4_K_M"
FAST_TIMEOUT = 10.0  # seconds for one listing or search request
HUB_HOSTS = ("hf.co", "huggingface.co", "www.huggingface.co")

# Bits per weight of llama.cpp's quantisations (llama-quantize's table, rounded): "closest" means
# nearest in this figure, so a repo without Q4_K_M gives Q4_K_S or IQ4_XS, not Q2_K.
BITS_PER_WEIGHT: dict[str, float] = {
    "F32": 32.0, "F16": 16.0, "BF16": 16.0, "Q8_0": 8.5, "Q6_K": 6.56, "Q5_1": 6.0, "Q5_K_M": 5.69,
    "Q5_K_S": 5.54, "Q5_0": 5.5, "Q4_1": 5.0, "Q4_K_M": 4.85, "Q4_K_S": 4.58, "Q4_0": 4.5, "IQ4_NL": 4.5,
    "Q3_K_L": 4.27, "IQ4_XS": 4.25, "MXFP4": 4.25, "Q3_K_M": 3.91, "IQ3_M": 3.66, "Q3_K_S": 3.5, "IQ3_S": 3.44,
    "IQ3_XS": 3.3, "IQ3_XXS": 3.06, "Q2_K": 2.96, "Q2_K_S": 2.8, "IQ2_M": 2.7, "IQ2_S": 2.5, "IQ2_XS": 2.31,
    "IQ2_XXS": 2.06, "TQ2_0": 2.06, "IQ1_M": 1.75, "TQ1_0": 1.69, "IQ1_S": 1.56,
}
_QUANT_RE = re.compile(r"(?:^|[-._/])((?:ud-)?(?:i?q\d(?:_[a-z0-9]+)*|bf16|f16|f32|mxfp4|tq\d_\d))(?=$|[-._/])",
                       re.IGNORECASE)
_SPLIT_RE = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_FILE_URL_RE = re.compile(r"^(?P<repo>[^/]+/[^/]+)/(?:blob|resolve)/(?P<rev>[^/]+)/(?P<file>.+\.gguf)$",
                          re.IGNORECASE)
_SHA_RE = re.compile(r"[0-9a-f]{64}")


# ---------------------------------------------------------------- what a pull string names


@dataclass(frozen=True)
class HubRef:
    repo: str
    quant: str | None = None  # upper case; None: the default (or the closest)
    revision: str = "main"
    filename: str | None = None  # a file URL names one file (or a split's first shard)

    @property
    def alias(self) -> str:
        """The canonical spelling, kept as the installed model's alias (`--model`, `rm` take it)."""
        if self.filename:
            return f"hf.co/{self.repo}/{self.filename}"
        return f"hf.co/{self.repo}" + (f":{self.quant}" if self.quant else "")


def _bad_ref(text: str, why: str) -> UsageError:
    return UsageError(f"{text!r} is not a Hugging Face model: {why}.",
                      "Use hf.co/USER/REPO[:QUANT], USER/REPO:QUANT or a file URL "
                      "(https://huggingface.co/USER/REPO/blob/main/FILE.gguf).")


def _check_repo(text: str, repo: str) -> str:
    if not _HF_REPO_RE.fullmatch(repo) or "/" not in repo or "--" in repo or ".." in repo:
        raise _bad_ref(text, f"{repo!r} is not a repo id like USER/REPO")
    return repo


def _check_path(text: str, path: str) -> str:
    if not _safe_path(path):
        raise _bad_ref(text, f"{path!r} is not a plain file path in the repo")
    return path


def parse_hub_ref(text: str) -> HubRef | None:
    """The Hub reference in a pull string; None for a registry id (it has no '/')."""
    raw = text.strip()
    if "/" not in raw:
        return None
    is_url = raw.lower().startswith(("https://", "http://"))
    rest = raw.split("://", 1)[1] if is_url else raw
    host, _, tail = rest.partition("/")
    if host.lower() in HUB_HOSTS:
        rest = tail
    elif is_url:
        raise _bad_ref(text, f"{host!r} is not huggingface.co")
    rest = rest.split("?", 1)[0].split("#", 1)[0].rstrip("/")
    url = _FILE_URL_RE.match(rest)
    if url:
        rev = url["rev"]
        if not _HF_REVISION_RE.fullmatch(rev) or ".." in rev:
            raise _bad_ref(text, f"{rev!r} is not a branch, tag or commit")
        return HubRef(_check_repo(text, url["repo"]), None, rev, _check_path(text, url["file"]))
    repo, colon, quant = rest.partition(":")
    if colon and not re.fullmatch(r"[A-Za-z0-9_]{1,32}", quant):
        raise _bad_ref(text, f"{quant!r} is not a quant name like Q4_K_M")
    return HubRef(_check_repo(text, repo), quant.upper() if colon else None)


# ---------------------------------------------------------------- a repo's GGUF files


@dataclass(frozen=True)
class HubFile:
    path: str  # in the repo, maybe under a folder
    size: int
    sha256: str | None  # the LFS sha256; None for a file stored in git itself

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class HubQuant:
    """One downloadable model in a repo: a file, or every shard of a split GGUF in order."""

    quant: str  # Q4_K_M, or the file's stem when its name says no quant
    files: tuple[HubFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def bits_per_weight(self) -> float | None:
        return bits_per_weight(self.quant)


@dataclass(frozen=True)
class RepoListing:
    repo: str
    revision: str
    commit: str | None
    gated: bool
    quants: tuple[HubQuant, ...]
    incomplete_splits: tuple[str, ...] = ()  # split models with a shard missing: not offered
    unsafe_names: int = 0  # GGUF files whose path cannot be one here (too long, '..', control characters)


def quant_of(path: str) -> str | None:
    """The quant a file name states (``...-Q4_K_M.gguf``, ``model.q8_0.gguf``), upper case."""
    name = path.rsplit("/", 1)[-1]
    split = _SPLIT_RE.match(name)
    stem = split["stem"] if split else re.sub(r"\.gguf$", "", name, flags=re.IGNORECASE)
    found = _QUANT_RE.findall(stem)
    return found[-1].upper().removeprefix("UD-") if found else None


def bits_per_weight(quant: str) -> float | None:
    if quant in BITS_PER_WEIGHT:
        return BITS_PER_WEIGHT[quant]
    m = re.match(r"I?Q(\d)", quant)  # a newer or vendor quant (Q4_K_XL): its leading digit is near
    return int(m.group(1)) + 0.5 if m else None


def _is_model_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1].lower()
    # Vision projectors and imatrix data ride along in GGUF repos; they are not models.
    return name.endswith(".gguf") and "mmproj" not in name and not name.startswith("imatrix")


def group_quants(files: Iterable[HubFile]) -> tuple[tuple[HubQuant, ...], tuple[str, ...]]:
    """GGUF files grouped into models: single files, and split models whose every shard is there."""
    singles: list[HubQuant] = []
    splits: dict[tuple[str, int], dict[int, HubFile]] = {}
    for f in files:
        if not _is_model_file(f.path):
            continue
        m = _SPLIT_RE.match(f.name)
        if m is None:
            singles.append(HubQuant(quant_of(f.path) or f.name[:-5], (f,)))
            continue
        folder = f.path[: -len(f.name)]
        splits.setdefault((folder + m["stem"], int(m["count"])), {})[int(m["no"])] = f
    incomplete: list[str] = []
    for (stem, count), shards in sorted(splits.items()):
        if sorted(shards) != list(range(1, count + 1)):
            incomplete.append(f"{stem} ({len(shards)} of {count} shards)")
            continue
        ordered = tuple(shards[i] for i in range(1, count + 1))
        singles.append(HubQuant(quant_of(ordered[0].path) or stem.rsplit("/", 1)[-1], ordered))
    # One model per quant name: the first by path (a repo rarely holds two of one quant).
    by_quant: dict[str, HubQuant] = {}
    for q in sorted(singles, key=lambda q: q.files[0].path):
        by_quant.setdefault(q.quant, q)
    ordered_quants = sorted(by_quant.values(), key=lambda q: (-(q.bits_per_weight or 0.0), q.quant))
    return tuple(ordered_quants), tuple(incomplete)


@dataclass(frozen=True)
class QuantPick:
    quant: HubQuant
    note: str  # why this one, for one line; "" when it is the one asked for


def quant_names(quants: Sequence[HubQuant]) -> str:
    return ", ".join(q.quant for q in quants)


def pick_quant(listing: RepoListing, ref: HubRef, fits: Callable[[HubQuant], bool]) -> QuantPick:
    """The quant to pull: the file or quant asked for, else Q4_K_M, else the one nearest in bits
    per weight among those that fit this machine (all of them when none fits)."""
    quants = listing.quants
    if not quants:
        cut = listing.incomplete_splits
        extra = f" (split models with shards missing: {', '.join(cut)})" if cut else ""
        if listing.unsafe_names:  # counted, not shown: such a name may hold anything
            extra += (f" ({listing.unsafe_names} GGUF file name(s) not taken: too long for a file name "
                      f"(over {MAX_FILE_NAME_BYTES} bytes), or not a plain path in the repo)")
        raise ModelNotFoundError(f"{listing.repo} has no GGUF model files{extra}.",
                                 f"Pick a GGUF repo: `localspec models search {listing.repo.split('/')[-1]}`.")
    if ref.filename:
        for q in quants:
            if ref.filename in (f.path for f in q.files):
                return QuantPick(q, "")
        raise ModelNotFoundError(f"{listing.repo} has no GGUF file {ref.filename!r}.",
                                 f"Its GGUF quants: {quant_names(quants)}; pull hf.co/{listing.repo}:QUANT.")
    if ref.quant:
        for q in quants:
            if q.quant.upper() == ref.quant:
                return QuantPick(q, "")
        raise ModelNotFoundError(f"{listing.repo} has no {ref.quant} quant.",
                                 f"Pick one it has: {quant_names(quants)} (hf.co/{listing.repo}:QUANT).")
    for q in quants:
        if q.quant == DEFAULT_QUANT:
            return QuantPick(q, "")
    want = BITS_PER_WEIGHT[DEFAULT_QUANT]
    fitting = [q for q in quants if fits(q)]
    pool = fitting or list(quants)
    best = min(pool, key=lambda q: (abs((q.bits_per_weight or 99.0) - want), q.size))
    bpw = f"{best.bits_per_weight:.2f}" if best.bits_per_weight else "?"
    why = "that fits this machine" if fitting else "(none fits this machine)"
    return QuantPick(best, f"{listing.repo} has no {DEFAULT_QUANT}: took {best.quant}, the nearest in bits per "
                           f"weight ({bpw} vs {want}) {why}")


# ---------------------------------------------------------------- talking to the Hub


def endpoint() -> str:
    from huggingface_hub import constants

    return str(constants.ENDPOINT).rstrip("/")


def offline() -> bool:
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return bool(constants.HF_HUB_OFFLINE) or env.strip().lower() in {"1", "on", "yes", "true"}


def login_command() -> str:
    """The login command of the installed huggingface-hub: `hf auth login` since it ships the `hf`
    command with its auth group, `huggingface-cli login` before."""
    try:
        has_hf = importlib.util.find_spec("huggingface_hub.cli.auth") is not None
    except (ImportError, ValueError):
        has_hf = False
    return "hf auth login" if has_hf else "huggingface-cli login"


def has_token() -> bool:
    from huggingface_hub import get_token

    return bool(get_token())


def gated_error(repo: str) -> DownloadError:
    return DownloadError(
        f"{repo} is a gated repo: its files download only for an account that accepted its terms.",
        f"Accept them on {endpoint()}/{repo}, then run `{login_command()}` (or set HF_TOKEN) and pull again.")


def hub_error(exc: BaseException, repo: str, what: str) -> DownloadError:
    """One line for anything huggingface-hub raised while ``what`` (listing, searching) ``repo``."""
    from huggingface_hub import errors as hf_errors

    if isinstance(exc, hf_errors.OfflineModeIsEnabled) or offline():
        return offline_error(what)
    if isinstance(exc, hf_errors.GatedRepoError):
        return gated_error(repo)
    if isinstance(exc, hf_errors.RevisionNotFoundError):
        return DownloadError(f"{repo} has no such revision (branch, tag or commit).",
                             f"Check the revision in the URL, or pull hf.co/{repo}.")
    if isinstance(exc, hf_errors.RepositoryNotFoundError):
        return DownloadError(f"{repo} was not found on the Hub ({endpoint()}), or it is private.",
                             f"Check the name (`localspec models search NAME`); if it is private, run "
                             f"`{login_command()}` (or set HF_TOKEN) with an account that can read it.")
    if isinstance(exc, hf_errors.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", "?")
        return DownloadError(f"The Hub ({endpoint()}) answered HTTP {status} while {what}.",
                             "Retry later; if it persists, check HF_ENDPOINT.")
    if isinstance(exc, (ValueError, TypeError, KeyError, AttributeError)):  # JSON that does not parse or fit
        return not_the_api_error(f"{type(exc).__name__}: {_first_line(exc)}", what)
    return unreachable_error(exc, what)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]


def not_the_api_error(detail: str, what: str) -> DownloadError:
    """The Hub was reached but answered something else: a captive portal's page, another service's
    JSON, a broken mirror."""
    return DownloadError(f"The Hub ({endpoint()}) answered something that is not what the Hub's API sends while "
                         f"{what} ({detail}).",
                         "Check HF_ENDPOINT (the Hub or a mirror of its API) and the network's login page, if any; "
                         "registry models still install from a mirror (`localspec models pull ID`).")


def offline_error(what: str) -> DownloadError:
    return DownloadError(f"Offline (HF_HUB_OFFLINE is set), so the Hub cannot be asked while {what}.",
                         "Unset HF_HUB_OFFLINE to reach the Hub; registry models still install from the "
                         "cache or a mirror (`localspec models list`).")


def unreachable_error(exc: BaseException, what: str) -> DownloadError:
    return DownloadError(f"Cannot reach the Hub at {endpoint()} while {what} ({type(exc).__name__}: "
                         f"{_first_line(exc)}).",
                         "Check the network (or HF_ENDPOINT); registry models still install from a mirror "
                         "(`localspec models pull ID`).")


def _safe_path(path: str) -> bool:
    """A path the Hub listed is untrusted: it becomes a path under the HF cache's snapshot folder,
    each part a file or folder name that the file system must take (with suffixes of ours)."""
    parts = path.split("/")
    return (0 < len(path) <= 1000 and "\\" not in path and path.isprintable()
            and not any(p in ("", ".", "..") or p.startswith(".") or len(p.encode()) > MAX_FILE_NAME_BYTES
                        for p in parts))


def _unsafe_names(siblings: Iterable[Any]) -> int:
    """How many GGUF files of a listing _files_of leaves out for their path."""
    names = (getattr(s, "rfilename", None) for s in siblings)
    return sum(1 for n in names if isinstance(n, str) and n.lower().endswith(".gguf") and not _safe_path(n))


def _files_of(siblings: Iterable[Any]) -> list[HubFile]:
    out = []
    for s in siblings or ():
        path = getattr(s, "rfilename", None)
        size = getattr(s, "size", None)
        if not isinstance(path, str) or not _safe_path(path) or not _is_model_file(path):
            continue
        lfs = getattr(s, "lfs", None)
        sha = getattr(lfs, "sha256", None) if lfs is not None else None
        size = getattr(lfs, "size", None) if size is None and lfs is not None else size
        if not isinstance(size, int) or size < 0:
            continue  # a listing without sizes cannot be checked against the disk: skip the file
        out.append(HubFile(path, size, sha.lower() if isinstance(sha, str) and _SHA_RE.fullmatch(sha.lower())
                           else None))
    return out


def list_repo(repo: str, revision: str = "main") -> RepoListing:
    """The repo's GGUF models with sizes and LFS sha256s, in one request."""
    from huggingface_hub import HfApi

    what = f"listing {repo}"
    if offline():
        raise offline_error(what)
    try:
        info = HfApi(endpoint=endpoint()).model_info(repo, revision=revision, files_metadata=True,
                                                     timeout=FAST_TIMEOUT)
    except Exception as exc:  # noqa: BLE001  every failure becomes one line naming its cause
        raise hub_error(exc, repo, what) from None
    quants, incomplete = group_quants(_files_of(info.siblings or ()))
    commit = info.sha if isinstance(info.sha, str) and re.fullmatch(r"[0-9a-f]{40}", info.sha) else None
    return RepoListing(repo, revision, commit, bool(info.gated), quants, incomplete, _unsafe_names(info.siblings or ()))


@dataclass(frozen=True)
class SearchHit:
    repo: str
    downloads: int | None
    gated: bool
    quants: tuple[HubQuant, ...]
    error: str | None = None  # why its files could not be listed
    header: HeaderRead | None = None  # one quant's header (the KV layout is the same in every quant)


def read_fit_header(repo: str, revision: str, quants: Sequence[HubQuant]) -> HeaderRead | None:
    """The header a fit verdict needs, from the smallest quant's first file (a split model's keys
    are in its first shard); None when the repo has no quant."""
    from localspec.models.hub_header import Depth, read_remote_header

    if not quants:
        return None
    first = min(quants, key=lambda q: q.size).files[0]
    return read_remote_header(repo, first.path, revision, first.size, depth=Depth.FIT)


def search(query: str, limit: int = 10) -> list[SearchHit]:
    """GGUF repos matching ``query``, most downloaded first, each with its quants and sizes."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    what = f"searching for {query!r}"
    if offline():
        raise offline_error(what)
    params = {"search": query, "filter": "gguf", "sort": "downloads", "limit": str(limit)}
    try:
        r = get_session().get(f"{endpoint()}/api/models", params=params, headers=build_hf_headers(),
                              timeout=FAST_TIMEOUT)
        hf_raise_for_status(r)
        found = r.json()
    except Exception as exc:  # noqa: BLE001
        raise hub_error(exc, query, what) from None
    if not isinstance(found, list):
        raise not_the_api_error(f"a {type(found).__name__}, not a list of repos", what)
    api = HfApi(endpoint=endpoint())
    hits: list[SearchHit] = []
    for item in found[:limit]:
        repo = item.get("id") if isinstance(item, dict) else None
        if not isinstance(repo, str) or not _HF_REPO_RE.fullmatch(repo):
            continue  # untrusted: an id we could not pull is not shown
        downloads = item.get("downloads")
        gated = bool(item.get("gated"))
        try:
            info = api.model_info(repo, files_metadata=True, timeout=FAST_TIMEOUT)
        except Exception as exc:  # noqa: BLE001  one repo's failure leaves the others
            hits.append(SearchHit(repo, downloads if isinstance(downloads, int) else None, gated, (),
                                  hub_error(exc, repo, f"listing {repo}").cause))
            continue
        quants, _ = group_quants(_files_of(info.siblings or ()))
        commit = info.sha if isinstance(info.sha, str) and re.fullmatch(r"[0-9a-f]{40}", info.sha) else "main"
        hits.append(SearchHit(repo, downloads if isinstance(downloads, int) else None,
                              gated or bool(info.gated), quants, header=read_fit_header(repo, commit, quants)))
    return hits


def generated_id(repo: str, quant: str) -> str:
    """A store id for a Hub pull: ``user-name-quant``, lower case, '-GGUF' dropped."""
    user, name = repo.split("/", 1)
    name = re.sub(r"[-_.]gguf$", "", name, flags=re.IGNORECASE)
    raw = f"{user}-{name}-{quant}".lower()
    mid = re.sub(r"[^a-z0-9._+-]+", "-", raw).strip("-._")
    return re.sub(r"\.{2,}", ".", mid)[:120] or "hub-model"
