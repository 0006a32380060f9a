"""A bounded CPU hog for `localspec bench --noisy`: a busy developer machine, reproducibly.

The hog is a child process (it competes for cores as an editor or a build does, not for our GIL)
that keeps one core fully busy for its first `full_s` seconds, when any calibration runs, then
alternates `busy_ms` of spinning with `idle_ms` of sleep. It is bounded three ways: the bench stops
and reaps it (`CpuHog` is a context manager), it exits when its parent is gone, and it never
outlives `max_s`.

Run directly, it is the child: `python -m localspec.bench.hog --parent PID ...`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import psutil


def stop_process(proc: subprocess.Popen, *, timeout_s: float) -> None:
    """Terminate, wait, and kill what does not stop in time; always reaped."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass(frozen=True)
class HogSchedule:
    full_s: float = 60.0  # one core at 100% from the start, covering the models' calibration
    busy_ms: float = 50.0  # then a duty cycle: this much spinning ...
    idle_ms: float = 50.0  # ... then this much sleep
    max_s: float = 4 * 3600.0  # a safety bound: no bench plan runs this long

    @property
    def duty(self) -> float:
        """The share of one core the hog takes after its full phase."""
        return self.busy_ms / (self.busy_ms + self.idle_ms)

    def slice_at(self, elapsed: float) -> tuple[float, float]:
        """(seconds to spin, seconds to sleep) for the slice that starts `elapsed` seconds in.

        The full phase spins in slices of busy_ms too, so a stop or a lost parent is seen as
        quickly there as in the duty cycle."""
        busy = self.busy_ms / 1000
        if elapsed < self.full_s:
            return min(busy, self.full_s - elapsed), 0.0
        return busy, self.idle_ms / 1000

    def describe(self) -> str:
        return (f"one core at 100% for the first {self.full_s:g} s, then {self.busy_ms:g} ms busy / "
                f"{self.idle_ms:g} ms idle ({self.duty:.0%} of one core)")

    def to_json(self) -> dict:
        return {**asdict(self), "duty": self.duty, "description": self.describe()}


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF  # arithmetic, not a syscall: a core kept busy


def run(
    schedule: HogSchedule, *, alive: Callable[[], bool],
    clock: Callable[[], float] = time.monotonic,
    spin: Callable[[float], None] = _spin,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """The hog's loop, until `alive()` is false or max_s has passed; returns the seconds spun.

    The clock, spin and sleep are parameters so a test can check the schedule on a simulated clock."""
    start = clock()
    spun = 0.0
    while alive():
        elapsed = clock() - start
        if elapsed >= schedule.max_s:
            break
        busy, idle = schedule.slice_at(elapsed)
        spin(busy)
        spun += busy
        if idle:
            sleep(idle)
    return spun


@dataclass(frozen=True)
class HogUsage:
    """What the hog took, read just before it was stopped (the report's evidence that it ran)."""

    wall_s: float
    cpu_s: float

    def to_json(self) -> dict:
        return {"wall_s": round(self.wall_s, 1), "cpu_s": round(self.cpu_s, 1),
                "cores": round(self.cpu_s / self.wall_s, 2) if self.wall_s > 0 else None}


class CpuHog:
    """The hog as a child process; `with CpuHog(schedule) as hog:` stops and reaps it on any exit."""

    def __init__(self, schedule: HogSchedule) -> None:
        self.schedule = schedule
        self.proc: subprocess.Popen[bytes] | None = None
        self.usage: HogUsage | None = None
        self._started = 0.0

    def start(self) -> CpuHog:
        if self.proc is not None:
            raise RuntimeError("the hog is already running")
        s = self.schedule
        cmd = [sys.executable, "-m", "localspec.bench.hog", "--parent", str(os.getpid()), "--full-s", str(s.full_s),
               "--busy-ms", str(s.busy_ms), "--idle-ms", str(s.idle_ms), "--max-s", str(s.max_s)]
        self._started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        return self

    def stop(self) -> HogUsage | None:
        """Stop and reap the child (idempotent); returns its usage, or None if it never started."""
        proc, self.proc = self.proc, None
        if proc is None:
            return self.usage
        wall = time.monotonic() - self._started
        try:
            times = psutil.Process(proc.pid).cpu_times()
            cpu = times.user + times.system
        except psutil.Error:  # already gone (its own bound, or a signal): its time is unknown
            cpu = float("nan")
        stop_process(proc, timeout_s=10)
        self.usage = HogUsage(wall, cpu)
        return self.usage

    def __enter__(self) -> CpuHog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _parent_alive(parent: int) -> Callable[[], bool]:
    # Orphaned, a child is re-parented (to init or a subreaper): a changed parent id means the bench
    # died without stopping us (SIGKILL, or SIGTERM with no handler), and the hog must not outlive it.
    return lambda: os.getppid() == parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m localspec.bench.hog", description=__doc__)
    p.add_argument("--parent", type=int, required=True, help="exit when this process is no longer our parent")
    d = HogSchedule()
    p.add_argument("--full-s", type=float, default=d.full_s)
    p.add_argument("--busy-ms", type=float, default=d.busy_ms)
    p.add_argument("--idle-ms", type=float, default=d.idle_ms)
    p.add_argument("--max-s", type=float, default=d.max_s)
    a = p.parse_args(argv)
    schedule = HogSchedule(full_s=a.full_s, busy_ms=a.busy_ms, idle_ms=a.idle_ms, max_s=a.max_s)
    try:
        run(schedule, alive=_parent_alive(a.parent))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the bench reaps us
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
