"""Progress events: one small dataclass that the CLI, TUI and server can all render."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ProgressEvent:
    model_id: str
    source: str  # "hf", "pypi", "file", or "" before a source is chosen
    # start | download | assemble | verify | done | skip | failed
    phase: str
    bytes_done: int = 0
    bytes_total: int | None = None
    message: str = ""


ProgressCallback = Callable[[ProgressEvent], None]


def _ignore(_: ProgressEvent) -> None:
    pass


class Emitter:
    """Binds model id and source so sources report with one short call."""

    def __init__(self, callback: ProgressCallback | None, model_id: str, source: str = "") -> None:
        self.callback = callback or _ignore
        self.model_id = model_id
        self.source = source

    def __call__(self, phase: str, bytes_done: int = 0, bytes_total: int | None = None, message: str = "") -> None:
        self.callback(ProgressEvent(self.model_id, self.source, phase, bytes_done, bytes_total, message))

    def for_source(self, source: str) -> Emitter:
        return Emitter(self.callback, self.model_id, source)
