"""Measure what a target verify batch and a draft step cost on this machine.

The result feeds the `auto` controller. It is cached per (model files, llama.cpp build, threads,
GPU layers), because the same files cost very different amounts on a CPU and on a GPU.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import time
from pathlib import Path

import llama_cpp

from localspec.engine.controller import Costs
from localspec.engine.events import LoadStage, ProgressFn, StageReporter
from localspec.engine.runtime import ModelRuntime, Row

logger = logging.getLogger(__name__)

_CONTEXT_TOKENS = 48  # a short history, so attention cost is that of an early decode step


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _prime(rt: ModelRuntime, seq: int) -> None:
    rt.seq_rm(seq, 0, -1)
    rt.decode([Row((i * 7919) % rt.n_vocab, i, seq) for i in range(_CONTEXT_TOKENS)])


def _batch_cost(rt: ModelRuntime, seq: int, rows: int, repeats: int, warm_up: bool = True) -> float:
    def once() -> None:
        rt.decode([Row((13 * i + 1) % rt.n_vocab, _CONTEXT_TOKENS + i, seq, logits=True) for i in range(rows)])
        rt.seq_rm(seq, _CONTEXT_TOKENS, -1)

    if warm_up:
        once()  # first use of a batch shape allocates buffers and builds graphs
    return _median_seconds(once, repeats)


def _interpolate(points: dict[int, float], n_max: int) -> list[float]:
    """Costs for 1..n_max rows from the measured sizes (piecewise linear)."""
    xs = sorted(points)
    out = []
    for n in range(1, n_max + 1):
        lo = max((x for x in xs if x <= n), default=xs[0])
        hi = min((x for x in xs if x >= n), default=xs[-1])
        out.append(points[lo] if hi == lo else points[lo] + (points[hi] - points[lo]) * (n - lo) / (hi - lo))
    return out


def measure(target: ModelRuntime, draft: ModelRuntime | None, k_max: int, seq: int = 0, repeats: int = 2, *,
            progress: StageReporter | None = None) -> Costs:
    """Time target batches up to k_max+1 rows and a draft step. Uses (and clears) sequence `seq`.

    A few batch sizes are measured and the rest interpolated: cost grows piecewise-linearly with
    rows, and a short calibration matters more than the last percent of accuracy. `progress`
    hears the fraction of measuring rounds done (one per target batch size, two for the draft).
    """
    sizes = sorted({1, 2, 3, 5, k_max + 1} & set(range(1, k_max + 2)))
    rounds, done = len(sizes) + (2 if draft is not None else 0), 0

    def round_done() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress.report(done / rounds)

    if progress is not None:
        progress.report(0.0)
    _prime(target, seq)
    measured = {}
    for n in sizes:
        measured[n] = _batch_cost(target, seq, n, repeats, warm_up=(n == sizes[0]))
        round_done()
    verify = _interpolate(measured, k_max + 1)
    target.seq_rm(seq, 0, -1)
    draft_step, draft_row = 0.0, 0.0
    if draft is not None:
        _prime(draft, seq)
        draft_step = _batch_cost(draft, seq, 1, repeats)
        round_done()
        batch16 = _batch_cost(draft, seq, 16, repeats, warm_up=False)
        round_done()
        draft_row = max((batch16 - draft_step) / 15, 0.0)
        draft.seq_rm(seq, 0, -1)
    return Costs(verify=verify, draft_step=draft_step, draft_row=draft_row)


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


def load_or_measure(target: ModelRuntime, draft: ModelRuntime | None, k_max: int, cache_dir: Path | None, *,
                    on_progress: ProgressFn | None = None) -> Costs:
    """The cached costs for this machine, or a measurement (reported to `on_progress`) saved for next time."""
    path = cache_dir / f"calibration-{cache_key(target, draft, k_max)}.json" if cache_dir else None
    if path and path.exists():
        try:
            return Costs.from_json(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("ignoring unreadable calibration %s: %s", path, exc)
    logger.info("calibrating speculative costs (one-time per model, build and thread count)")
    progress = StageReporter(on_progress, LoadStage.CALIBRATE, target.path.stem) if on_progress else None
    t0 = time.perf_counter()
    costs = measure(target, draft, k_max, progress=progress)
    logger.info("calibrated in %.1f s", time.perf_counter() - t0)  # faces without on_progress (serve) log it
    if path:
        try:
            costs.save(path)
        except OSError as exc:  # a read-only or full disk only costs a re-measure next time
            logger.warning("could not save calibration to %s: %s", path, exc)
    return costs
