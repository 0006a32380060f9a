"""Where model files come from. Each source module exposes ``fetch(entry, source, store, emit)``.

A source that cannot serve (offline, 404, network error, pip failure) raises SourceUnavailable
with a short reason; the manager then tries the next source. IntegrityError and DiskFullError
propagate as themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localspec.models.store import ManifestFile


class SourceUnavailable(Exception):
    """This source cannot serve the model now; ``reason`` is one short line, ``fix`` what to do."""

    def __init__(self, reason: str, fix: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.fix = fix


@dataclass(frozen=True)
class FetchResult:
    files: list[ManifestFile]
    source: dict[str, Any]  # recorded in the manifest
    downloaded_bytes: int = 0
