"""How a pull shows its progress: bars on a terminal, a line a second in a log, NDJSON for tools.

Every view shows the same figures per model and phase (download, assemble, verify): bytes so far,
the total, the rate over the last few seconds and the time left, as Ollama's pull does. Model ids
and source messages come from registry files and servers, so they are never parsed as markup.
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Protocol

from localspec.models.progress import ProgressEvent
from localspec.models.units import human_bytes

_BYTE_PHASES = ("download", "assemble", "verify")
_WINDOW_S = 5.0  # the rate is measured over this much recent time
LINE_EVERY_S = 1.0  # a plain or JSON view reports a running task at most this often


@dataclass
class Throughput:
    """Bytes per second over a sliding window, and the time left at that rate."""

    samples: deque[tuple[float, int]] = field(default_factory=deque)

    def add(self, t: float, done: int) -> None:
        if self.samples and done < self.samples[-1][1]:
            self.samples.clear()  # a new file or package restarted the count
        self.samples.append((t, done))
        while len(self.samples) > 2 and t - self.samples[1][0] >= _WINDOW_S:
            self.samples.popleft()

    @property
    def rate(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else None

    def eta(self, done: int, total: int | None) -> float | None:
        rate = self.rate
        if total is None or not rate or rate <= 0:
            return None
        return max(0.0, (total - done) / rate)


@dataclass(frozen=True)
class Snapshot:
    """One progress report, as every view renders it."""

    model_id: str
    source: str
    phase: str
    bytes_done: int
    bytes_total: int | None
    rate: float | None  # bytes per second
    eta_s: float | None
    message: str

    def line(self) -> str:
        done = human_bytes(self.bytes_done)
        of = f" / {human_bytes(self.bytes_total)}" if self.bytes_total else ""
        pct = f" ({self.bytes_done / self.bytes_total:.0%})" if self.bytes_total else ""
        rate = f", {self.rate / 1e6:.1f} MB/s" if self.rate else ""
        eta = f", {_clock(self.eta_s)} left" if self.eta_s is not None else ""
        note = f"  {self.message}" if self.message else ""
        return f"{self.model_id}: {self.phase} {done}{of}{pct}{rate}{eta}{note}"

    def to_json(self) -> dict[str, object]:
        return {"event": "progress", "model": self.model_id, "source": self.source, "phase": self.phase,
                "bytes_done": self.bytes_done, "bytes_total": self.bytes_total,
                "bytes_per_second": round(self.rate) if self.rate else None,
                "eta_s": round(self.eta_s, 1) if self.eta_s is not None else None, "message": self.message}


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class PullView(Protocol):
    def __call__(self, event: ProgressEvent, /) -> None: ...  # positional: views name it `e`
    def note(self, text: str) -> None: ...
    def close(self) -> None: ...


class _Tracker:
    """Turns events into snapshots and says when a throttled view should report one."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.rates: dict[tuple[str, str], Throughput] = {}
        self.last_report: dict[tuple[str, str], float] = {}

    def snapshot(self, e: ProgressEvent) -> Snapshot:
        key = (e.model_id, e.phase)
        rate = self.rates.setdefault(key, Throughput())
        rate.add(self.clock(), e.bytes_done)
        return Snapshot(e.model_id, e.source, e.phase, e.bytes_done, e.bytes_total, rate.rate,
                        rate.eta(e.bytes_done, e.bytes_total), e.message)

    def due(self, s: Snapshot) -> bool:
        """Report the first and the last figure of a phase, and at most one a second between."""
        key = (s.model_id, s.phase)
        now = self.clock()
        finished = s.bytes_total is not None and s.bytes_done >= s.bytes_total
        if key in self.last_report and not finished and now - self.last_report[key] < LINE_EVERY_S:
            return False
        self.last_report[key] = now
        return True


class _ThrottledView:
    """A view that reports each running phase at most once a second: `report` a figure, `event` the rest."""

    def __init__(self, out: IO[str], clock: Callable[[], float] = time.monotonic) -> None:
        self.out = out
        self.tracker = _Tracker(clock)

    def __call__(self, e: ProgressEvent) -> None:
        if e.phase in _BYTE_PHASES:
            s = self.tracker.snapshot(e)
            if self.tracker.due(s):
                self.report(s)
        else:
            self.event(e)

    def report(self, s: Snapshot) -> None:
        raise NotImplementedError

    def event(self, e: ProgressEvent) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class LinesView(_ThrottledView):
    """Plain lines for logs and pipes (CI, `2> file`): a line a second per running phase."""

    def report(self, s: Snapshot) -> None:
        self.note(s.line())

    def event(self, e: ProgressEvent) -> None:
        if e.phase == "start":
            self.note(f"{e.model_id}: {e.message}")
        elif e.phase == "failed":
            self.note(f"  source failed {e.source}: {e.message}")

    def note(self, text: str) -> None:
        print(text, file=self.out, flush=True)


class JsonView(_ThrottledView):
    """NDJSON on stdout for tools: progress events (throttled like the lines), then the results."""

    def report(self, s: Snapshot) -> None:
        self.emit(s.to_json())

    def event(self, e: ProgressEvent) -> None:
        if e.phase in ("start", "failed", "done", "skip"):
            self.emit({"event": e.phase, "model": e.model_id, "source": e.source, "message": e.message})

    def emit(self, record: dict[str, object]) -> None:
        print(json.dumps(record, ensure_ascii=False), file=self.out, flush=True)

    def note(self, text: str) -> None:
        self.emit({"event": "note", "message": text})


class BarsView:
    """Rich bars on a terminal: bytes, rate and time left per model and phase."""

    def __init__(self, out: IO[str]) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                   TransferSpeedColumn)

        self.progress = Progress(
            TextColumn("{task.description}", markup=False), BarColumn(bar_width=30), DownloadColumn(),
            TransferSpeedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[note]}", markup=False),
            console=Console(file=out), transient=False,
        )
        self.tasks: dict[tuple[str, str], object] = {}
        self.progress.start()

    def __call__(self, e: ProgressEvent) -> None:
        if e.phase in _BYTE_PHASES:
            key = (e.model_id, e.phase)
            if key not in self.tasks:
                self.tasks[key] = self.progress.add_task(f"{e.model_id} {e.phase}", total=e.bytes_total, note="")
            update: dict[str, object] = {"completed": e.bytes_done}
            if e.message:
                update["note"] = e.message if len(e.message) <= 40 else e.message[:39] + "…"
            if e.bytes_total is not None:
                update["total"] = e.bytes_total
            self.progress.update(self.tasks[key], **update)  # type: ignore[arg-type]
        elif e.phase == "start":
            self.note(f"{e.model_id}: {e.message}")
        elif e.phase == "failed":
            self.note(f"  source failed {e.source}: {e.message}")
        elif e.phase in ("done", "skip"):
            for (mid, _), task in self.tasks.items():
                found = [t for t in self.progress.tasks if t.id == task and t.total is not None]
                if mid == e.model_id and found:
                    self.progress.update(task, completed=found[0].total)  # type: ignore[arg-type]

    def note(self, text: str) -> None:
        from rich.text import Text

        self.progress.console.print(Text(text))

    def close(self) -> None:
        self.progress.stop()


def pull_view(*, json_lines: bool = False, out: IO[str] | None = None) -> PullView:
    """The view for this output: NDJSON when asked, bars on a terminal, plain lines otherwise."""
    if json_lines:
        return JsonView(out or sys.stdout)
    stream = out or sys.stderr
    return BarsView(stream) if stream.isatty() else LinesView(stream)
