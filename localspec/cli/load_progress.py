"""The set-up work before the first token, on stderr: model loads and the one-time calibration.

On a terminal it is a rich progress line per stage that gives way to a one-line summary
("calibrated in 12.3 s"); otherwise (a pipe, a log file) a start line and an end line per stage.
Model names are shown as plain text, never parsed as markup. stdout is never written.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from rich.text import Text

from localspec.engine.events import LoadProgress, LoadStage


def stage_label(p: LoadProgress) -> str:
    if p.stage is LoadStage.CALIBRATE:
        return "calibrating speculative costs (one-time)"
    return f"loading {p.model}"


def stage_summary(p: LoadProgress) -> str:
    if p.stage is LoadStage.CALIBRATE:
        return f"calibrated in {p.elapsed_s:.1f} s"
    return f"loaded {p.model} in {p.elapsed_s:.1f} s"


class LoadProgressDisplay:
    """A `ProgressFn` for the CLI; use it as a context manager around the load."""

    def __init__(self, stream: TextIO | None = None, tty: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self._seen: dict[tuple[LoadStage, str], Any] = {}  # running stage -> its rich task (None without a tty)
        self._progress = None
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("{task.description}", markup=False), BarColumn(bar_width=30), TaskProgressColumn(),
                TimeElapsedColumn(), console=Console(file=self.stream), transient=True,
            )

    def __enter__(self) -> LoadProgressDisplay:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def __call__(self, p: LoadProgress) -> None:
        key = (p.stage, p.model)
        if key not in self._seen:
            self._seen[key] = self._begin(p)
        if self._progress is not None:
            self._progress.update(self._seen[key], completed=p.fraction)
        if p.finished:
            self._end(key, p)

    def _begin(self, p: LoadProgress) -> Any:
        if self._progress is not None:
            return self._progress.add_task(stage_label(p), total=1.0)
        self._line(f"{stage_label(p)}…")
        return None

    def _end(self, key: tuple[LoadStage, str], p: LoadProgress) -> None:
        task = self._seen.pop(key)  # the same file loaded again (target as its own draft) starts afresh
        if self._progress is not None:
            self._progress.remove_task(task)
            self._progress.console.print(Text(stage_summary(p)))
        else:
            self._line(stage_summary(p))

    def _line(self, text: str) -> None:
        try:
            print(text, file=self.stream, flush=True)
        except (OSError, ValueError):  # a closed stderr must not stop the load
            pass
