"""The vector index: unit vectors in one float32 matrix, searched by brute-force dot product.

100k entries x 384 dims is 150 MB and one matrix-vector product of a few milliseconds, which is
plenty for one workstation. Rows carry the entry id and a small integer for the entry's scope, so
a search only ranks rows of the request's scope. Deleted rows are marked dead and dropped when the
index is saved. Persisted as `vectors.npy` (loaded with allow_pickle=False) plus `vectors.json`,
which names the matrix it belongs to by its digest: every face (serve, chat, generate) saves into the
same directory, and two saves at once can leave one's matrix beside the other's ids.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Container
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

_DEAD = -1
_COMPACT_MIN_DEAD = 64  # fewer dead rows than this are not worth a rebuild


@dataclass(frozen=True)
class Candidate:
    entry_id: str
    similarity: float


class VectorIndex:
    def __init__(self, dim: int, fingerprint: str) -> None:
        self.dim = dim
        self.fingerprint = fingerprint  # the embedder's; vectors from another model are meaningless
        self._m = np.zeros((0, dim), dtype=np.float32)
        self._scope_codes = np.zeros(0, dtype=np.int32)
        self._n = 0
        self._ids: list[str] = []
        self._scopes: list[str] = []  # code -> scope key
        self._code: dict[str, int] = {}
        self._row: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._row)

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._row

    def ids(self) -> set[str]:
        return set(self._row)

    def add(self, entry_id: str, scope_key: str, vector: np.ndarray) -> None:
        if entry_id in self._row:
            self.remove(entry_id)
        if self._n == self._m.shape[0]:
            grow = max(64, self._m.shape[0])
            self._m = np.vstack([self._m, np.zeros((grow, self.dim), dtype=np.float32)])
            self._scope_codes = np.concatenate([self._scope_codes, np.full(grow, _DEAD, dtype=np.int32)])
        code = self._code.get(scope_key)
        if code is None:
            code = self._code[scope_key] = len(self._scopes)
            self._scopes.append(scope_key)
        self._m[self._n] = vector
        self._scope_codes[self._n] = code
        self._ids.append(entry_id)
        self._row[entry_id] = self._n
        self._n += 1

    def remove(self, entry_id: str) -> bool:
        row = self._row.pop(entry_id, None)
        if row is None:
            return False
        self._scope_codes[row] = _DEAD
        return True

    def retain(self, entry_ids: Container[str]) -> int:
        """Forget the rows of entries not in `entry_ids`: the store evicts (size limit) and expires (TTL)
        entries without telling the index, which otherwise kept every row it was ever given, in memory
        and in vectors.npy. Dead rows leave memory once they outnumber the live. Returns the rows forgotten."""
        gone = [entry_id for entry_id in self._row if entry_id not in entry_ids]
        for entry_id in gone:
            self.remove(entry_id)
        if self._n - len(self._row) > max(len(self._row), _COMPACT_MIN_DEAD):
            self._compact()
        return len(gone)

    def _compact(self) -> None:
        """Rebuild from the live rows alone: dead rows, and scopes no live row uses, are dropped."""
        fresh = VectorIndex(self.dim, self.fingerprint)
        for i in np.flatnonzero(self._scope_codes[: self._n] != _DEAD):
            fresh.add(self._ids[i], self._scopes[self._scope_codes[i]], self._m[i])
        vars(self).update(vars(fresh))

    def search(self, scope_key: str, vector: np.ndarray, threshold: float, k: int = 5) -> list[Candidate]:
        """The best `k` rows of this scope at or above `threshold`, most similar first."""
        code = self._code.get(scope_key)
        if code is None or self._n == 0:
            return []
        sims = self._m[: self._n] @ vector
        sims = np.where(self._scope_codes[: self._n] == code, sims, -np.inf)
        above = np.flatnonzero(sims >= threshold)
        if above.size == 0:
            return []
        best = above[np.argsort(-sims[above], kind="stable")[:k]]
        return [Candidate(self._ids[i], float(sims[i])) for i in best]

    # ------------------------------------------------------------ persistence

    def save(self, directory: Path) -> None:
        live = [i for i in range(self._n) if self._scope_codes[i] != _DEAD]
        matrix = self._m[live] if live else np.zeros((0, self.dim), dtype=np.float32)
        matrix = np.ascontiguousarray(matrix)
        meta = {
            "fingerprint": self.fingerprint, "dim": self.dim,
            "ids": [self._ids[i] for i in live],
            "scopes": [self._scopes[self._scope_codes[i]] for i in live],
            "matrix_sha256": _digest(matrix),
        }
        replace_whole(directory / "vectors.npy", lambda fh: np.save(fh, matrix, allow_pickle=False))
        replace_whole(directory / "vectors.json", lambda fh: fh.write(json.dumps(meta).encode("utf-8")))

    @classmethod
    def load(cls, directory: Path, dim: int, fingerprint: str) -> VectorIndex:
        """The saved index; raises ValueError (or OSError) when it is missing, corrupt or foreign."""
        meta = json.loads((directory / "vectors.json").read_text(encoding="utf-8"))
        matrix = np.load(directory / "vectors.npy", allow_pickle=False)
        ids, scopes = meta["ids"], meta["scopes"]
        if meta.get("fingerprint") != fingerprint or meta.get("dim") != dim:
            raise ValueError("the index was built with another embedding model")
        if matrix.dtype != np.float32 or matrix.shape != (len(ids), dim) or len(scopes) != len(ids):
            raise ValueError("the index files disagree")
        if not np.all(np.isfinite(matrix)):
            raise ValueError("the index holds non-finite values")
        digest = meta.get("matrix_sha256")  # absent from an index saved before it was written
        if digest is not None and digest != _digest(matrix):
            raise ValueError("the index files disagree (saved by two processes at once)")
        index = cls(dim, fingerprint)
        for entry_id, scope_key, row in zip(ids, scopes, matrix, strict=True):
            index.add(str(entry_id), str(scope_key), row)
        return index


def _digest(matrix: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(matrix, dtype=np.float32).tobytes()).hexdigest()


def replace_whole(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write `path` whole through a temporary file of its own beside it, then rename it over `path`.
    Every face saves into the same cache directory: with one fixed temporary name, one process's
    rename took another's half-written file and the other's rename failed."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
