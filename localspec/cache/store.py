"""Entries on disk: diskcache with a JSON-only disk, so nothing is ever unpickled.

diskcache's default `Disk` pickles any value that is not a number, string or bytes, and unpickles
whatever a row says is a pickle. `JSONOnlyDisk` serialises values to JSON itself, accepts only
string keys, and refuses to read a row marked as pickled (a tampered or foreign cache file).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import diskcache
from diskcache.core import MODE_PICKLE, UNKNOWN

ENTRY_PREFIX = "e:"
VERDICT_PREFIX = "v:"  # a judge's yes, remembered: the new prompt's id -> the entry it may reuse


class JSONOnlyDisk(diskcache.Disk):
    def put(self, key: Any) -> tuple[Any, bool]:
        if not isinstance(key, str):
            raise TypeError(f"cache keys are strings, not {type(key).__name__}")
        return super().put(key)

    def get(self, key: Any, raw: bool) -> Any:
        if not raw:
            raise ValueError("refusing to unpickle a cache key")
        return super().get(key, raw)

    def store(self, value: Any, read: bool, key: Any = UNKNOWN) -> tuple[int, int, str | None, Any]:
        if read:
            raise TypeError("file-like values are not stored")
        blob = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        return super().store(blob, False, key=key)

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        if mode == MODE_PICKLE:
            raise ValueError("refusing to unpickle a cache value")
        data = super().fetch(mode, filename, value, False)
        return json.loads(data)


class EntryStore:
    """Cache entries by id, with LRU eviction over `size_limit` bytes and a per-entry TTL."""

    def __init__(self, directory: Path, size_limit: int, ttl_s: float | None) -> None:
        self.directory = directory
        self.ttl_s = ttl_s
        self._dc = diskcache.Cache(
            str(directory), disk=JSONOnlyDisk, size_limit=size_limit,
            eviction_policy="least-recently-used", cull_limit=4, timeout=2,
        )

        len(self._dc)  # touch the database so a corrupt file fails now, not mid-request

    def get(self, entry_id: str) -> dict[str, Any] | None:
        value = self._dc.get(ENTRY_PREFIX + entry_id)
        return value if isinstance(value, dict) else None

    def put(self, entry: dict[str, Any]) -> None:
        expire = None
        if entry.get("expires_at"):
            expire = max(0.001, entry["expires_at"] - time.time())
        self._dc.set(ENTRY_PREFIX + entry["id"], entry, expire=expire)

    def delete(self, entry_id: str) -> bool:
        return bool(self._dc.delete(ENTRY_PREFIX + entry_id))

    def get_verdict(self, prompt_id: str) -> dict[str, Any] | None:
        value = self._dc.get(VERDICT_PREFIX + prompt_id)
        return value if isinstance(value, dict) else None

    def put_verdict(self, prompt_id: str, verdict: dict[str, Any], expires_at: float | None) -> None:
        """Verdicts live no longer than the entry they point to; a dangling one is dropped when read."""
        expire = None if not expires_at else max(0.001, expires_at - time.time())
        self._dc.set(VERDICT_PREFIX + prompt_id, verdict, expire=expire)

    def delete_verdict(self, prompt_id: str) -> None:
        self._dc.delete(VERDICT_PREFIX + prompt_id)

    def ids(self) -> Iterator[str]:
        for key in self._dc.iterkeys():
            if isinstance(key, str) and key.startswith(ENTRY_PREFIX):
                yield key[len(ENTRY_PREFIX):]

    def entries(self) -> Iterator[dict[str, Any]]:
        for entry_id in list(self.ids()):
            entry = self.get(entry_id)
            if entry is not None:
                yield entry

    def expire(self) -> int:
        return int(self._dc.expire())

    def __len__(self) -> int:
        return len(self._dc)

    def volume(self) -> int:
        return int(self._dc.volume())

    @property
    def size_limit(self) -> int:
        return int(self._dc.size_limit)

    @property
    def disk(self) -> diskcache.Disk:
        return self._dc.disk

    def clear(self) -> int:
        return int(self._dc.clear())

    def close(self) -> None:
        self._dc.close()
