"""The semantic cache: exact match, then embedding similarity, then the false-hit guard.

Lookup order for a prompt in a scope:
1. the exact normalised prompt (works without an embedder and for prompts longer than its window);
2. the most similar stored prompts of the same scope at or above the threshold, best first, each
   re-checked against the store (diskcache evicts silently) and against the guard, which is given
   the similarity (its soft rules need a high one); the first that passes is served;
3. or, when the lookup brings a reuse judge (a model, `localspec.cache.judge`), the first of the
   best MAX_JUDGED of those that the judge also agrees with. The judge's yes is remembered for that
   prompt (until its entry goes), so the same prompt asked again is served without a search or a
   judgement: at the cost of an exact hit rather than of a prefill.

The request path never fails because of the cache: every error is logged as a warning and turns
into a miss (lookup) or a skipped write (store). A corrupt or unreadable directory is moved aside
and rebuilt; a full disk skips caching.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import hashlib
import hmac
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from localspec.cache.guard import compare, conflict
from localspec.cache.index import VectorIndex, replace_whole
from localspec.cache.judge import JUDGED_THRESHOLD
from localspec.cache.normalize import normalize_prompt
from localspec.cache.scope import CacheScope, PromptKind
from localspec.cache.store import EntryStore
from localspec.paths import resolve_paths

if TYPE_CHECKING:
    from localspec.engine.embedder import Embedder


class ReuseJudge(Protocol):
    """Confirms that `saved`'s answer serves `new` (see localspec.cache.judge.ModelJudge)."""

    def agrees(self, saved: str, new: str) -> tuple[bool, float]: ...

logger = logging.getLogger("localspec.cache")

# Bump when the entry layout or its key changes: older stores are cleared on open. 2: the exact key keeps
# case that is meaning and a line's indentation, and an entry says its prompt's kind.
SCHEMA_VERSION = 2
# Chosen from the dev pair set (`localspec cache eval --split dev`) by evaluate.choose_threshold: the
# highest threshold within 2 points of the most paraphrase hits at a false-hit rate of at most 0.5%
# (dev: 89.1% hits, 0 false hits at 0.74). Below SOFT_SIMILARITY the guard serves only prompts whose
# content words agree, so the threshold mostly trades hits against traps the guard has never seen.
DEFAULT_THRESHOLD = 0.74
DEFAULT_SIZE_LIMIT = 512 * 1024 * 1024
DEFAULT_TTL_S = 30 * 24 * 3600.0
VERDICT_KEY_BYTES = 32
_SAVE_EVERY = 64  # index writes are batched; entries missing from a stale index are re-embedded on open
_COUNTERS = ("lookups", "exact_hits", "semantic_hits", "misses", "guard_rejections", "judged", "judge_rejections",
             "remembered_verdicts", "judge_errors", "evicted_on_hit", "too_long", "stores", "store_skipped",
             "false_hits", "errors")
MAX_JUDGED = 2  # semantic candidates put to the judge per lookup, best first: each costs a prefill


@dataclass(frozen=True)
class CacheHit:
    answer: str
    token_ids: list[int]
    similarity: float
    matched_prompt: str
    entry_id: str
    kind: str  # "exact" or "semantic"
    stats: dict[str, Any] = field(default_factory=dict)
    judge: float | None = None  # the reuse judge's score, when one confirmed the hit
    remembered: bool | None = None  # True: the judge's earlier yes for this very prompt, not asked again
    judged_by: str | None = None  # which judge: the model file, or the pair scorer ("pair-scorer:...")


@dataclass(frozen=True)
class Probe:
    """What a lookup would see, for evaluation: the best candidate above `floor` and the guard's verdict."""

    exact: bool
    similarity: float | None
    matched_prompt: str | None
    guard: str | None  # None: agrees; else the first disagreement (guard.compare)
    conflict: str | None = None  # the facts-only check used when a judge confirms (guard.conflict)


def _judge_name(judge: ReuseJudge) -> str:
    return getattr(judge, "name", "") or type(judge).__name__


def _judge_id(judge: ReuseJudge) -> str:
    """Which judge said yes: a remembered verdict holds only for the same model and threshold."""
    return f"{_judge_name(judge)}@{getattr(judge, 'threshold', '')}"


def entry_id_for(scope: CacheScope, prompt: str) -> str:
    """A chat prompt's key is its normal form; a raw completion prompt's is itself, since the model
    continues it character by character (a space more at its end is another next token)."""
    key = prompt if scope.kind == PromptKind.COMPLETION else normalize_prompt(prompt)
    return hashlib.sha256(f"{scope.key}\n{key}".encode()).hexdigest()[:32]


class SemanticCache:
    def __init__(
        self,
        directory: Path | None = None,
        embedder: Embedder | None = None,
        threshold: float | None = None,
        judged_threshold: float | None = None,
        size_limit: int = DEFAULT_SIZE_LIMIT,
        ttl_s: float | None = DEFAULT_TTL_S,
        guard: bool = True,
    ) -> None:
        self.directory = Path(directory) if directory else resolve_paths().cache_dir / "semantic"
        self.embedder = embedder
        self.threshold = DEFAULT_THRESHOLD if threshold is None else float(threshold)
        self.judged_threshold = JUDGED_THRESHOLD if judged_threshold is None else float(judged_threshold)
        self.size_limit = size_limit
        self.ttl_s = ttl_s
        self.guard = guard
        self._lock = threading.RLock()
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._unsaved = 0
        self._last_flush = time.monotonic()
        self._store: EntryStore | None = None
        self._index: VectorIndex | None = None
        self.disabled_reason: str | None = None
        self.exact_reason = "no embedding model installed (run `localspec models pull minilm`)"
        self._open()

    # ------------------------------------------------------------ state

    @property
    def mode(self) -> str:
        if self.disabled_reason:
            return "off"
        return "semantic" if self.embedder is not None else "exact"

    def describe(self) -> str:
        if self.mode == "off":
            return f"cache off: {self.disabled_reason}"
        if self.embedder is None:  # the mode is "exact"
            return f"exact-match mode: {self.exact_reason}"
        return f"semantic mode (threshold {self.threshold:.2f}, {self.embedder.model_path.name})"

    def _open(self) -> None:
        for attempt in (1, 2):
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._check_schema()
                self._store = EntryStore(self.directory / "entries", self.size_limit, self.ttl_s)
                self._load_counts()
                if self.embedder is not None:
                    self._index = self._load_index()
                self.disabled_reason = None
                return
            except Exception as exc:  # corrupt sqlite, unreadable files, permissions...
                self._close_store()
                if attempt == 1:
                    logger.warning("semantic cache at %s is unreadable (%s); rebuilding it empty", self.directory, exc)
                    self._reset_directory()
                else:
                    self.disabled_reason = f"{self.directory} cannot be used ({exc})"
                    logger.warning("semantic cache disabled: %s", self.disabled_reason)

    def _reset_directory(self) -> None:
        try:
            if self.directory.exists():
                aside = self.directory.with_name(f"{self.directory.name}.corrupt-{int(time.time())}")
                try:
                    os.replace(self.directory, aside)
                    shutil.rmtree(aside, ignore_errors=True)
                except OSError:
                    shutil.rmtree(self.directory, ignore_errors=True)
        except OSError as exc:
            logger.warning("could not remove the broken cache at %s: %s", self.directory, exc)

    def _check_schema(self) -> None:
        meta_path = self.directory / "meta.json"
        if meta_path.exists():
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            if meta.get("schema") == SCHEMA_VERSION:
                return
            logger.warning("semantic cache at %s has schema %s, expected %s; clearing it",
                           self.directory, meta.get("schema"), SCHEMA_VERSION)
            shutil.rmtree(self.directory / "entries", ignore_errors=True)
            for name in ("vectors.npy", "vectors.json", "stats.json"):
                (self.directory / name).unlink(missing_ok=True)
        _write_json(meta_path, {"schema": SCHEMA_VERSION, "created": time.time()})

    def _load_index(self) -> VectorIndex:
        assert self.embedder is not None and self._store is not None
        try:
            index = VectorIndex.load(self.directory, self.embedder.dim, self.embedder.fingerprint)
        except FileNotFoundError:
            index = VectorIndex(self.embedder.dim, self.embedder.fingerprint)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("cache vector index unusable (%s); rebuilding it from the entries", exc)
            index = VectorIndex(self.embedder.dim, self.embedder.fingerprint)
        missing = 0
        for entry in self._store.entries():  # entries the saved index lacks (lost, stale or new model)
            if entry["id"] not in index and entry.get("kind", PromptKind.CHAT) == PromptKind.CHAT:
                vec = self.embedder.embed(entry["prompt"])
                if vec is not None:
                    index.add(entry["id"], entry["scope"], vec)
                    missing += 1
        gone = index.retain(self._live_ids())  # rows of entries evicted or expired since it was saved
        if missing:
            logger.info("embedded %d cache entries missing from the vector index", missing)
        if missing or gone:
            try:
                index.save(self.directory)
            except OSError as exc:  # the entries are whole: the index is saved again later, never a reset
                logger.warning("cache vector index not saved (%s); it is saved again later", exc)
                self._unsaved = missing + gone
        return index

    # ------------------------------------------------------------ lookup

    def lookup(self, scope: CacheScope, prompt: str, judge: ReuseJudge | None = None,
               semantic: bool = True) -> CacheHit | None:
        """The cached answer for this prompt in this scope, or None. Never raises.

        With a `judge`, a semantic candidate is served only when the judge agrees too (see
        `localspec.cache.judge`); it is asked outside the cache's lock, at most MAX_JUDGED times.
        `semantic=False`: exact matches only (a caller that wants judged hits but has no judge).
        """
        if self._store is None:
            return None
        try:
            with self._lock:
                self._counts["lookups"] += 1
                hit, candidates = self._find(scope, prompt, semantic, judge)
                if hit is None and candidates and judge is None:
                    hit = self._hit(*candidates[0], "semantic")
            if hit is None and candidates and judge is not None:
                hit = self._judged(scope, prompt, candidates, judge)
            with self._lock:
                self._counts["misses" if hit is None else f"{hit.kind}_hits"] += 1
                self._maybe_flush()
            return hit
        except Exception as exc:
            self._counts["errors"] += 1
            logger.warning("cache lookup failed, answering without it: %s", exc)
            return None

    def _find(self, scope: CacheScope, prompt: str, semantic: bool = True,
              judge: ReuseJudge | None = None) -> tuple[CacheHit | None, list[tuple[dict[str, Any], float]]]:
        """An exact hit, or the semantic candidates (entry, similarity) that pass the guard, best first:
        the first one, or with a `judge` the best MAX_JUDGED (no more are checked than will be used).

        With a `judge`, which will read the candidates, the floor is the lower judged_threshold and
        the guard checks facts only (guard.conflict); otherwise its full rules (guard.compare). Its
        remembered yes for this very prompt comes before any search (`_remembered`).
        """
        judged = judge is not None
        assert self._store is not None
        eid = entry_id_for(scope, prompt)
        entry = self._store.get(eid)
        if entry is not None and (not self.guard or compare(entry["prompt"], prompt, 1.0) is None):
            return self._hit(entry, 1.0, "exact"), []
        # A raw completion is continued, not answered: a neighbour's continuation is not this prompt's.
        if not semantic or scope.kind == PromptKind.COMPLETION or self.embedder is None or self._index is None:
            return None, []
        if judge is not None and (hit := self._remembered(scope, eid, prompt, judge)) is not None:
            return hit, []
        vec = self.embedder.embed(prompt)
        if vec is None:
            self._counts["too_long"] += 1  # over the embedder's window: exact match only
            return None, []
        found = []
        for cand in self._index.search(scope.key, vec, self.judged_threshold if judged else self.threshold):
            entry = self._store.get(cand.entry_id)
            if entry is None:  # evicted or expired behind our back
                self._index.remove(cand.entry_id)
                self._counts["evicted_on_hit"] += 1
                continue
            verdict = conflict(entry["prompt"], prompt) if judged else compare(entry["prompt"], prompt, cand.similarity)
            if self.guard and verdict is not None:
                self._counts["guard_rejections"] += 1
                continue
            found.append((entry, cand.similarity))
            if len(found) == (MAX_JUDGED if judged else 1):
                break
        return None, found

    def _remembered(self, scope: CacheScope, pid: str, prompt: str, judge: ReuseJudge) -> CacheHit | None:
        """A judged hit for this same prompt (id `pid`) served before: the judge said yes to it, and was
        the same judge (model and threshold), so asking again would cost a prefill for the same answer."""
        assert self._store is not None
        verdict = self._store.get_verdict(pid)
        if verdict is None or verdict.get("judge_id") != _judge_id(judge):
            return None
        entry = self._store.get(verdict["entry"])
        if (entry is None or entry.get("scope") != scope.key  # evicted, expired or marked wrong since
                or (self.guard and conflict(entry["prompt"], prompt) is not None)):  # or a stricter guard now
            self._store.delete_verdict(pid)
            return None
        self._counts["remembered_verdicts"] += 1
        return dataclasses.replace(self._hit(entry, float(verdict["similarity"]), "semantic"),
                                   judge=verdict["judge"], remembered=True, judged_by=_judge_name(judge))

    def _judged(self, scope: CacheScope, prompt: str, candidates: list[tuple[dict[str, Any], float]],
                judge: ReuseJudge) -> CacheHit | None:
        for entry, similarity in candidates:
            try:
                ok, score = judge.agrees(entry["prompt"], prompt)
            except Exception as exc:  # a busy or broken judge: a miss, never a failed request
                with self._lock:
                    self._counts["judge_errors"] += 1
                logger.warning("reuse judge unavailable, not serving a semantic hit: %s", exc)
                return None
            with self._lock:
                self._counts["judged"] += 1
                if not ok:
                    self._counts["judge_rejections"] += 1
                    continue
                if self._store is not None and self._store.get(entry["id"]) is not None:  # still there
                    self._remember(scope, prompt, entry, similarity, score, judge)
                    return dataclasses.replace(self._hit(entry, similarity, "semantic"), judge=round(score, 3),
                                               judged_by=_judge_name(judge))
        return None

    def _remember(self, scope: CacheScope, prompt: str, entry: dict[str, Any], similarity: float, score: float,
                  judge: ReuseJudge) -> None:
        assert self._store is not None
        try:
            self._store.put_verdict(entry_id_for(scope, prompt), {
                "entry": entry["id"], "similarity": round(similarity, 4), "judge": round(score, 3),
                "judge_id": _judge_id(judge), "created": time.time(),
            }, entry.get("expires_at"))
        except Exception as exc:  # a full disk: the next lookup asks the judge again
            logger.warning("judge verdict not remembered: %s", exc)

    def _hit(self, entry: dict[str, Any], similarity: float, kind: str) -> CacheHit:
        return CacheHit(
            answer=entry["answer"], token_ids=list(entry.get("token_ids") or []), similarity=round(similarity, 4),
            matched_prompt=entry["prompt"], entry_id=entry["id"], kind=kind, stats=dict(entry.get("stats") or {}),
        )

    def probe(self, scope: CacheScope, prompt: str, floor: float = -1.0) -> Probe:
        """The best same-scope candidate regardless of the threshold, for `localspec cache eval`."""
        assert self._store is not None
        with self._lock:
            entry = self._store.get(entry_id_for(scope, prompt))
            if entry is not None:
                return Probe(True, 1.0, entry["prompt"], compare(entry["prompt"], prompt, 1.0),
                             conflict(entry["prompt"], prompt))
            index = self._index
            vec = self.embedder.embed(prompt) if self.embedder is not None and index is not None else None
            if vec is None or index is None:
                return Probe(False, None, None, None)
            for cand in index.search(scope.key, vec, floor, k=1):
                entry = self._store.get(cand.entry_id)
                if entry is not None:
                    return Probe(False, cand.similarity, entry["prompt"],
                                 compare(entry["prompt"], prompt, cand.similarity), conflict(entry["prompt"], prompt))
            return Probe(False, None, None, None)

    # ------------------------------------------------------------ writes

    def store(self, scope: CacheScope, prompt: str, answer: str, token_ids: list[int] | None = None,
              stats: dict[str, Any] | None = None) -> None:
        """Remember an answer. Never raises; a full disk or broken store skips caching with a warning."""
        if self._store is None:
            return
        try:
            with self._lock:
                eid = entry_id_for(scope, prompt)
                now = time.time()
                entry = {
                    "id": eid, "schema": SCHEMA_VERSION, "scope": scope.key, "kind": str(scope.kind),
                    "model_hash": scope.model_hash,
                    "prompt": prompt, "answer": answer, "token_ids": [int(t) for t in token_ids or []],
                    "stats": _jsonable(stats or {}), "created": now,
                    "expires_at": now + self.ttl_s if self.ttl_s else None,
                }
                self._store.put(entry)
                if self.embedder is not None and self._index is not None and scope.kind == PromptKind.CHAT:
                    vec = self.embedder.embed(prompt)
                    if vec is not None:
                        self._index.add(eid, scope.key, vec)
                        self._unsaved += 1
                self._counts["stores"] += 1
                if self._unsaved >= _SAVE_EVERY:
                    self._save_index()
                self._maybe_flush(force=True)
        except OSError as exc:
            self._counts["store_skipped"] += 1
            if exc.errno == errno.ENOSPC:
                logger.warning("disk full: answer not cached (%s)", self.directory)
            else:
                logger.warning("answer not cached: %s", exc)
        except Exception as exc:
            self._counts["store_skipped"] += 1
            logger.warning("answer not cached: %s", exc)

    @functools.cached_property
    def _verdict_key(self) -> bytes:
        """The secret behind verdict tokens, kept beside the entries (mode 0600) so tokens outlive a restart.
        Published whole (written under a name of its own, then linked into place): a key file created
        first and written after was read empty by a process starting meanwhile, and one left empty (a
        full disk, a kill in between) made every token computable by anyone."""
        path = self.directory / "verdict.key"
        try:
            key = path.read_bytes()
        except FileNotFoundError:
            key = b""
        except OSError as exc:
            logger.warning("cache verdict key unreadable, using one for this process only: %s", exc)
            return os.urandom(VERDICT_KEY_BYTES)
        if len(key) >= VERDICT_KEY_BYTES:
            return key
        key = os.urandom(VERDICT_KEY_BYTES)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".verdict.key.", suffix=".tmp", dir=self.directory)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(key)
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    theirs = path.read_bytes()
                    if len(theirs) >= VERDICT_KEY_BYTES:
                        return theirs  # another process made it first: use theirs
                    os.replace(tmp, path)  # a short one left behind: never a key
            finally:
                Path(tmp).unlink(missing_ok=True)
        except OSError as exc:
            logger.warning("cache verdict key not saved, tokens last for this process only: %s", exc)
        return key

    def verdict_token(self, entry_id: str, owner: str) -> str:
        """What a client must send to mark an entry wrong: only the owner it was served to can have it."""
        return hmac.new(self._verdict_key, f"{owner}\n{entry_id}".encode(), hashlib.sha256).hexdigest()[:32]

    def mark_wrong(self, entry_id: str) -> bool:
        """The user says a served answer was wrong: evict it and count a false hit."""
        if self._store is None:
            return False
        try:
            with self._lock:
                removed = self._store.delete(entry_id)
                if self._index is not None:
                    removed = self._index.remove(entry_id) or removed
                if removed:  # an entry already gone was not served wrongly again
                    self._counts["false_hits"] += 1
                self._maybe_flush(force=True)
                return removed
        except Exception as exc:
            logger.warning("could not evict cache entry %s: %s", entry_id, exc)
            return False

    def invalidate_model(self, keep_model_hash: str) -> int:
        """Drop entries made with any other model file; returns how many."""
        if self._store is None:
            return 0
        dropped = 0
        with self._lock:
            for entry in list(self._store.entries()):
                if entry.get("model_hash") != keep_model_hash:
                    self._store.delete(entry["id"])
                    if self._index is not None:
                        self._index.remove(entry["id"])
                    dropped += 1
            if dropped and self._index is not None:
                self._save_index()
        return dropped

    def clear(self) -> int:
        with self._lock:
            n = self._store.clear() if self._store is not None else 0
            if self.embedder is not None:
                self._index = VectorIndex(self.embedder.dim, self.embedder.fingerprint)
            for name in ("vectors.npy", "vectors.json", "stats.json"):
                (self.directory / name).unlink(missing_ok=True)
            self._counts = dict.fromkeys(_COUNTERS, 0)
            return n

    def export(self, path: Path) -> int:
        """Every live entry as one JSON object per line; returns the count."""
        n = 0
        with self._lock, open(path, "w", encoding="utf-8") as fh:
            for entry in self._store.entries() if self._store is not None else ():
                fh.write(json.dumps(entry, ensure_ascii=False) + "\n")
                n += 1
        return n

    def stats(self) -> dict[str, Any]:
        with self._lock:
            self._maybe_flush(force=True)
            counts = dict(self._counts)
            hits = counts["exact_hits"] + counts["semantic_hits"]
            return {
                "mode": self.mode, "description": self.describe(), "directory": str(self.directory),
                "entries": sum(1 for _ in self._store.ids()) if self._store is not None else 0,
                "indexed": len(self._index) if self._index is not None else 0,
                "bytes": self._store.volume() if self._store is not None else 0,
                "size_limit": self.size_limit, "ttl_s": self.ttl_s, "threshold": self.threshold,
                **counts, "hit_rate": round(hits / counts["lookups"], 4) if counts["lookups"] else 0.0,
            }

    def close(self) -> None:
        with self._lock:
            try:
                if self._index is not None and self._unsaved:
                    self._save_index()
                self._maybe_flush(force=True)
            except Exception as exc:
                logger.warning("cache not saved on close: %s", exc)
            self._close_store()

    def __enter__(self) -> SemanticCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ internals

    def _close_store(self) -> None:
        if self._store is not None:
            try:
                self._store.close()
            except Exception:
                pass
            self._store = None

    def _save_index(self) -> None:
        assert self._index is not None
        if self._store is not None:
            self._index.retain(self._live_ids())
        self._index.save(self.directory)
        self._unsaved = 0

    def _live_ids(self) -> set[str]:
        """The entries the store still holds, its expired ones dropped first (diskcache keeps those
        until it culls): what the vector index may keep rows for."""
        assert self._store is not None
        self._store.expire()
        return set(self._store.ids())

    def _load_counts(self) -> None:
        path = self.directory / "stats.json"
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            self._counts = {k: int(saved.get(k, 0)) for k in _COUNTERS}
        except FileNotFoundError:
            self._counts = dict.fromkeys(_COUNTERS, 0)
        except (OSError, ValueError, AttributeError) as exc:
            logger.warning("cache statistics unreadable (%s); starting them at zero", exc)
            self._counts = dict.fromkeys(_COUNTERS, 0)

    def _maybe_flush(self, force: bool = False) -> None:
        """Counters go to stats.json on writes and at most every few seconds on lookups."""
        if not force and time.monotonic() - self._last_flush < 5.0:
            return
        self._last_flush = time.monotonic()
        try:
            _write_json(self.directory / "stats.json", self._counts)
        except OSError as exc:
            logger.debug("cache statistics not saved: %s", exc)


def _write_json(path: Path, value: Any) -> None:
    replace_whole(path, lambda fh: fh.write(json.dumps(value).encode("utf-8")))


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda o: o.to_dict() if hasattr(o, "to_dict") else str(o)))


__all__ = ["DEFAULT_THRESHOLD", "CacheHit", "Probe", "ReuseJudge", "SemanticCache", "entry_id_for"]
