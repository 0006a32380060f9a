"""Measure what a target verify batch and a draft step cost on this machine.

The result feeds the `auto` controller. It is cached per (model files, llama.cpp build, threads,
GPU layers), because the same files cost very different amounts on a CPU and on a GPU.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

from localspec.engine import costs
from localspec.engine.costs import Costs, Obtained
from localspec.engine.events import LoadStage, ProgressFn, StageReporter
from localspec.engine.runtime import ModelRuntime, Row

logger = logging.getLogger(__name__)

_CONTEXT_TOKENS = 48  # a short history, so attention cost is that of an early decode step


ROUNDS = 4  # each batch size this many times, sizes interleaved, so a burst of load hits all alike
SPREAD_LIMIT = 0.5  # a size whose timings spread more than this (max − min, over the median) is noise
STEP_DRIFT_LIMIT = 0.3  # single steps timed before and after must agree within this, and with verify(1)
ATTEMPTS = 2
SAVE_EVERY = 200  # learned passes between saves of the cost curve (at a request's end)
BUDGET_S = 20.0  # an attempt past this stops after the round in flight: on a box this busy the passes
# that follow teach more than more rounds would, and the user is waiting for the model to load


def _seconds(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _prime(rt: ModelRuntime, seq: int) -> None:
    rt.seq_rm(seq, 0, -1)
    rt.decode([Row((i * 7919) % rt.n_vocab, i, seq) for i in range(_CONTEXT_TOKENS)])


def _batch(rt: ModelRuntime, seq: int, rows: int) -> Callable[[], None]:
    def once() -> None:
        rt.decode([Row((13 * i + 1) % rt.n_vocab, _CONTEXT_TOKENS + i, seq, logits=True) for i in range(rows)])
        rt.seq_rm(seq, _CONTEXT_TOKENS, -1)

    return once


def logits_in_passes(rt: ModelRuntime, context: list[int], rows: list[int], size: int) -> np.ndarray:
    """`rows`' logits after `context` (already in sequence 0), read `size` rows a pass: how a row's
    logits depend on the batch it is read in (scripts/batch_invariance.py, packaging/gpu_check.py)."""
    return logits_in_plan(rt, context, rows, [size] * -(-len(rows) // size))


def logits_in_plan(rt: ModelRuntime, context: list[int], rows: list[int], plan: list[int]) -> np.ndarray:
    """`rows`' logits after `context`, read in passes of plan[0], plan[1], ... rows (the KV past the
    context is cleared first)."""
    rt.seq_rm(0, len(context), -1)
    out, s = [], 0
    for size in plan:
        chunk = rows[s : s + size]
        got = rt.decode([Row(token=t, pos=len(context) + s + i, seq=0, logits=True) for i, t in enumerate(chunk)])
        out.append(np.array(got[: len(chunk)], dtype=np.float64))
        s += size
    return np.concatenate(out)


def _interpolate(points: dict[int, float], n_max: int) -> list[float]:
    """Costs for 1..n_max rows from the measured sizes (piecewise linear)."""
    xs = sorted(points)
    out = []
    for n in range(1, n_max + 1):
        lo = max((x for x in xs if x <= n), default=xs[0])
        hi = min((x for x in xs if x >= n), default=xs[-1])
        out.append(points[lo] if hi == lo else points[lo] + (points[hi] - points[lo]) * (n - lo) / (hi - lo))
    return out


@dataclass(frozen=True)
class Measurement:
    """One calibration attempt: the median per batch size, and whether the box held still."""

    medians: dict[int, float]
    problems: list[str]
    over_budget: bool = False  # stopped early: the box is too busy for another attempt to do better

    @property
    def settled(self) -> bool:
        return not self.problems


def measure_verify(rt: ModelRuntime, sizes: list[int], seq: int = 0, rounds: int = ROUNDS,
                   tick: Callable[[], None] = lambda: None, budget_s: float = BUDGET_S) -> Measurement:
    """Time each batch size `rounds` times, interleaved, bracketed by single steps; judge the result.

    The checks catch a calibration taken while something else ran: timings of one size that
    disagree, single steps before and after that disagree (the load changed), or a verify(1)
    unlike a plain step. A curve that is not monotone is not a failure: the isotonic fit in
    `Costs` handles a GPU's kernel bumps. An attempt that runs past `budget_s` stops early and
    says so (measured: single steps of 4-6 s, not 40 ms, with a CPU hog beside llama.cpp's threads)."""
    t_start = time.perf_counter()
    _prime(rt, seq)
    for n in sizes:
        _batch(rt, seq, n)()  # first use of a batch shape allocates buffers and builds graphs
    step = _batch(rt, seq, 1)
    before = statistics.median(_seconds(step) for _ in range(3))
    times: dict[int, list[float]] = {n: [] for n in sizes}
    over_budget = False
    for r in range(rounds):
        for n in sizes[r % len(sizes):] + sizes[: r % len(sizes)]:  # a rotated order each round
            times[n].append(_seconds(_batch(rt, seq, n)))
        tick()
        if time.perf_counter() - t_start > budget_s:
            over_budget = r + 1 < rounds
            break
    after = _seconds(step) if over_budget else statistics.median(_seconds(step) for _ in range(3))
    rt.seq_rm(seq, 0, -1)
    medians = {n: statistics.median(ts) for n, ts in times.items()}
    problems = [f"{n} rows: timings spread {(max(ts) - min(ts)) / medians[n]:.0%} of their median"
                for n, ts in times.items() if (max(ts) - min(ts)) / medians[n] > SPREAD_LIMIT]
    if over_budget:
        problems.append(f"stopped after {time.perf_counter() - t_start:.0f} s, past its {budget_s:.0f} s budget")
    if abs(after - before) / min(before, after) > STEP_DRIFT_LIMIT:
        problems.append(f"a single step took {before * 1000:.0f} ms before and {after * 1000:.0f} ms after")
    if abs(medians[1] - (before + after) / 2) / min(medians[1], before, after) > STEP_DRIFT_LIMIT:
        problems.append(f"verify(1) = {medians[1] * 1000:.0f} ms against single steps of "
                        f"{before * 1000:.0f}/{after * 1000:.0f} ms")
    return Measurement(medians, problems, over_budget)


def measure(target: ModelRuntime, draft: ModelRuntime | None, k_max: int, seq: int = 0, *,
            progress: StageReporter | None = None, attempts: int = ATTEMPTS, rounds: int = ROUNDS) -> Costs:
    """Time target batches up to k_max+1 rows and a draft step. Uses (and clears) sequence `seq`.

    A few batch sizes are measured and the rest interpolated. An attempt that fails its checks is
    retried; if every attempt fails, the last is used but marked UNSETTLED (so `doctor --calibration`
    says so): the passes that follow correct it, exploration included (see `Costs`).
    `progress` hears the fraction of measuring rounds done (a retry's rounds pause it).
    """
    sizes = sorted({1, 2, 3, 5, 9, 17, 33, k_max + 1} & set(range(1, k_max + 2)))
    total, done = rounds + (2 if draft is not None else 0), 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None and done <= total:
            progress.report(done / total)

    if progress is not None:
        progress.report(0.0)
    for attempt in range(1, attempts + 1):
        m = measure_verify(target, sizes, seq, rounds, tick=tick if attempt == 1 else lambda: None)
        if m.settled:
            break
        last = attempt == attempts or m.over_budget  # too busy to finish once: a second try won't do better
        logger.warning("calibration attempt %d of %d was disturbed (%s)%s", attempt, attempts, "; ".join(m.problems),
                       "; using it, marked unsettled, while real passes correct it" if last else "; retrying")
        if last:
            break
    done = max(done, rounds)  # progress skips what a retry or an early stop left out, never back
    verify = _interpolate(m.medians, k_max + 1)
    draft_step, draft_row = 0.0, 0.0
    if draft is not None:
        _prime(draft, seq)
        _batch(draft, seq, 1)()
        draft_step = statistics.median(_seconds(_batch(draft, seq, 1)) for _ in range(3))
        tick()
        _batch(draft, seq, 16)()
        batch16 = statistics.median(_seconds(_batch(draft, seq, 16)) for _ in range(2))
        tick()
        draft_row = max((batch16 - draft_step) / 15, 0.0)
        draft.seq_rm(seq, 0, -1)
    return Costs(verify=verify, draft_step=draft_step, draft_row=draft_row,
                 obtained=Obtained.CALIBRATED if m.settled else Obtained.UNSETTLED,
                 calibration_context=_CONTEXT_TOKENS)


def cache_key(target: ModelRuntime, draft: ModelRuntime | None, k_max: int) -> str:
    parts = []
    for rt in (target, draft):
        if rt is None:
            parts.append("none")
            continue
        st = rt.path.stat()
        parts.append(f"{rt.path.name}:{st.st_size}:{int(st.st_mtime)}:{rt.config.n_gpu_layers}")
    parts += [
        llama_cpp.__version__,
        llama_cpp.llama_print_system_info().decode(errors="replace"),
        f"threads={target.n_threads}",
        f"k={k_max}",
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


# This process's cost curves, by calibration directory and cache key: a reload (an idle unload,
# keep_alive 0, `stop`) starts from the one its last engine of these models reported. Without it every
# reload on a busy box measured again: 20-26 s before each answer with keep_alive 0 (field test). A
# disturbed calibration is saved too, marked unsettled: kept back until 200 passes had corrected it,
# every `generate` shorter than that on a busy box measured again, 45 s before its answer (field test),
# and a wrong start heals by the passes and exploration anyway. Each is a snapshot no engine learns in:
# an engine reports copies from its own thread (CostFile.save), and a load copies the snapshot. Copying
# a curve an engine is still learning in from another thread (two engines of the same models at once)
# read it half-updated: a shape longer than its weights, which broke every later pass of the engine
# that started from it.
_MemoKey = tuple[str, str]  # (the calibration directory, or "" for none; the cache key)
_LEARNED: dict[_MemoKey, Costs] = {}
_LEARNED_LOCK = threading.Lock()


@dataclass
class CostFile:
    """Where an engine's learned costs go: this process's snapshot of them (`memo`, for a reload), and the
    file the next process starts from (`path`: none without a calibration directory, nor once the disk
    refused), with how many of their passes each holds."""

    path: Path | None
    passes_saved: int = 0
    memo: _MemoKey | None = None
    passes_remembered: int = -1

    def save(self, learned: Costs, *, every: int = 0) -> bool:
        """Report what the passes taught to this process's memo, and persist it (atomically) once more
        than `every` passes were learned since the last save; call it from the engine's thread. False when the disk
        refused: a read-only or full disk only costs re-learning next time (the memo still follows)."""
        if self.memo is not None and learned.passes != self.passes_remembered:
            _remember(self.memo, learned)
            self.passes_remembered = learned.passes
        if self.path is None or learned.passes - self.passes_saved <= every:
            return True
        try:
            learned.save(self.path)
        except OSError as exc:
            logger.warning("could not save speculative costs to %s: %s", self.path, exc)
            self.path = None
            return False
        self.passes_saved = learned.passes
        return True


def load_or_measure(target: ModelRuntime, draft: ModelRuntime | None, k_max: int, cache_dir: Path | None, *,
                    on_progress: ProgressFn | None = None) -> tuple[Costs, CostFile]:
    """This machine's costs as this process's last engine of these models (with this calibration
    directory) reported them, else as the last process saved them, else a fresh measurement (reported to
    `on_progress`); and where the engine reports and persists what it learns from here on."""
    key = cache_key(target, draft, k_max)
    path = cache_dir / f"calibration-{key}.json" if cache_dir else None
    memo: _MemoKey = (str(cache_dir) if cache_dir else "", key)
    with _LEARNED_LOCK:
        held = _LEARNED.get(memo)
        if held is not None:  # the engine learns in its own copy
            learned = copy.deepcopy(held)
            return learned, CostFile(path, memo=memo, passes_remembered=learned.passes)
    if path is not None and (known := costs.load(path)) is not None:
        _remember(memo, known)
        return known, CostFile(path, passes_saved=known.passes, memo=memo, passes_remembered=known.passes)
    logger.info("calibrating speculative costs (one-time per model, build and thread count)")
    progress = StageReporter(on_progress, LoadStage.CALIBRATE, target.path.stem) if on_progress else None
    t0 = time.perf_counter()
    measured = measure(target, draft, k_max, progress=progress)
    measured.about = f"{target.path.name} + {draft.path.name if draft else 'no draft'}, {target.n_threads} threads"
    logger.info("calibrated in %.1f s", time.perf_counter() - t0)  # faces without on_progress (serve) log it
    if path:  # unsettled too (see _LEARNED): the next process starts from it instead of measuring again
        try:
            measured.save(path)
        except OSError as exc:  # a read-only or full disk only costs a re-measure next time
            logger.warning("could not save calibration to %s: %s", path, exc)
    _remember(memo, measured)
    return measured, CostFile(path, passes_saved=measured.passes, memo=memo, passes_remembered=measured.passes)


def _remember(memo: _MemoKey, learned: Costs) -> None:
    """Keep a copy of `learned` as this process's latest curve of these models (the caller's thread is
    the only one changing `learned`)."""
    snapshot = copy.deepcopy(learned)
    with _LEARNED_LOCK:
        _LEARNED[memo] = snapshot


def forget_learned() -> None:
    """Drop this process's curves (`doctor --calibration --reset`, tests): the next load reads the disk."""
    with _LEARNED_LOCK:
        _LEARNED.clear()
