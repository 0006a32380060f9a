"""GPU cost check: what speculation would buy on this machine, from measured costs.

Runs on the borrowed GPU box (offline) after gpu-check.sh built llama.cpp; rehearsed on the CPU
with --small. Steps:
  1. write random-weight GGUF models with the exact shapes of Qwen2.5-Coder-7B and 0.5B
     (synth_gguf.py; --small: tiny shapes), their embedding and output rows a word chain: after a
     plain word the greedy next token is its successor by a wide margin (no near-ties to part the
     answers), the answer repeats every CHAIN_CYCLE words (something for prompt lookup), and the
     draft follows DRAFT_AGREES of the target's successors (its acceptance); --flat: all random;
  2. plan the product's own GPU split for them on free VRAM (engine.offload, as `serve` loads),
     load them with every layer offloaded (n_gpu_layers=-1; ignored by a CPU build), and hold the
     plan against the VRAM the load took; then run the engine's own calibration
     (localspec.engine.calibrate.measure), plus a full sweep of target verify batches 1..16 rows
     and draft batches 1..16 rows (the catch-up);
  3. feed those costs and the per-position acceptance measured with the real pair on the CPU
     (a localspec bench JSON) to the `auto` controller, and record the k it chooses and the
     speedup it predicts over plain decoding;
  4. for Predicted Outputs (a `bench --plan predicted` JSON, --predicted-bench): the CPU run's
     passes re-costed on this machine's curve, and the ceiling at its measured coverage;
  5. the engine end to end on these models, one greedy request per mode: `off`, then its own
     answer as a prediction (every draft kept: real 100%-acceptance timings on these kernels),
     `lookup`, `draft` and `auto` (on the swept costs), each answer compared with `off`'s.
Everything goes to --out: calibration.json, predictions.json, engine.json (rewritten after each
mode, so a timeout still leaves the modes done), summary.txt (also printed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import synth_gguf  # noqa: E402  (next to this file, in the repo and in the bundle)

CONTEXT = 48  # history before the measured batch, as in localspec.engine.calibrate
LONG_CONTEXT = 2048  # a second point (~2k tokens), to show how attention over a longer history adds cost
SWEEP_N_CTX = LONG_CONTEXT + 256  # room for the long context and the largest batch after it
PROFILE_K_MAX = 8  # EngineConfig.auto_k_max's default: the longest draft auto considers
FLIP_SIZES = (2, 5, 9, 16)  # verify passes of these many rows, read against one row a pass
FLIP_CONTEXT, FLIP_ROWS = 256, 64
SECOND_TARGET = "qwen2.5-coder-1.5b"  # measured last, if time allows
SECOND_TARGET_NEEDS_S = 60  # writing, loading and sweeping the 1.5B, and two requests (a GPU takes ~20 s)
CHAIN_CYCLE = 48  # words before an answer repeats
DRAFT_AGREES = 0.7  # the fraction of the target's successors the draft follows


# ---------------------------------------------------------------- acceptance profiles


def conditional_rates(drafted: list[float], accepted: list[float]) -> list[float]:
    """Per-position conditional acceptance a_i from a bench's by-position counts.

    The bench counts, per position i, how often a draft reached it and how often it survived
    (which needs every earlier position to survive too). So s_i = accepted_i / drafted_i is the
    survival up to i, and the controller's conditional rate is a_i = s_i / s_(i-1).
    """
    out, prev = [], 1.0
    for d, a in zip(drafted, accepted, strict=True):
        if d <= 0:
            break
        s = a / d
        out.append(min(1.0, s / prev) if prev > 0 else 0.0)
        prev = s
    return out


def profiles_from_bench(bench: dict) -> list[dict]:
    """One profile per (suite, speculative mode) in the bench runs, plus all suites together."""
    groups: dict[tuple[str, str], list[list[float]]] = {}
    for r in bench.get("runs", []):
        mode = r.get("mode", "")
        if r.get("engine", "localspec") != "localspec" or not r.get("drafted_by_position"):
            continue
        if not (mode.startswith("draft") or mode == "lookup"):
            continue  # auto's own runs mix drafters; off drafts nothing
        for suite in (r.get("suite", "?"), "all"):
            d, a = groups.setdefault((suite, mode), [[], []])
            for i, (x, y) in enumerate(zip(r["drafted_by_position"], r["accepted_by_position"], strict=True)):
                while len(d) <= i:
                    d.append(0.0)
                    a.append(0.0)
                d[i] += x
                a[i] += y
    out = []
    for (suite, mode), (d, a) in sorted(groups.items()):
        rates = conditional_rates(d, a)
        if rates:
            out.append({"suite": suite, "mode": mode, "drafter": "lookup" if mode == "lookup" else "draft",
                        "conditional_rates": rates, "drafted_by_position": d, "accepted_by_position": a})
    return out


def _acceptance(rates: list[float], k_max: int):
    from localspec.engine.controller import Acceptance

    # Positions past the measured ones reuse the last measured rate; large counts drown the prior.
    full = [rates[min(i, len(rates) - 1)] for i in range(k_max)]
    n = 1e6
    return Acceptance(accepted=[r * n for r in full], trials=[n] * k_max)


def predict(costs, profile: dict, k_max: int = PROFILE_K_MAX) -> dict:
    """The auto controller's choice and predicted speedup for one acceptance profile."""
    from localspec.engine.controller import Controller, expected_tokens

    acc = _acceptance(profile["conditional_rates"], k_max)
    base = 1.0 / costs.verify_cost(1)
    out: dict = {"suite": profile["suite"], "mode": profile["mode"], "drafter": profile["drafter"],
                 "conditional_rates": [round(r, 4) for r in profile["conditional_rates"]]}
    if profile["drafter"] == "draft":
        for lag in (0, 1):  # 0: draft caught up; 1: it must first read the last bonus/correction token
            ctl = Controller(costs, k_max=k_max, has_draft_model=True)
            ctl.draft = acc
            choice = ctl.choose(draft_lag=lag, lookup_match=0, lookup_available=0, k_cap=k_max)
            out[f"lag{lag}"] = {"drafter": choice.drafter, "k": choice.k,
                                "speedup": round(choice.expected_rate / base, 3)}
        curve = []
        for k in range(1, k_max + 1):
            cost = k * costs.draft_step + costs.verify_cost(k + 1)
            curve.append(round(expected_tokens([acc.rate(i) for i in range(k)]) / cost / base, 3))
        out["speedup_by_k"] = curve
    else:
        ctl = Controller(costs, k_max=k_max, has_draft_model=False)
        ctl.lookup[3] = acc
        choice = ctl.choose(draft_lag=0, lookup_match=3, lookup_available=k_max, k_cap=k_max)
        out["lag0"] = {"drafter": choice.drafter, "k": choice.k, "speedup": round(choice.expected_rate / base, 3)}
        out["speedup_by_k"] = [
            round(expected_tokens([acc.rate(i) for i in range(k)]) / costs.verify_cost(k + 1) / base, 3)
            for k in range(1, k_max + 1)
        ]
    return out


def _passes_cost(costs, passes: int, drafted_by_position: list[int]) -> float:
    """What a run's target passes cost on `costs`: drafted_by_position[k - 1] drafts reached position k,
    so dbp[k - 1] - dbp[k] passes verified exactly k drafted tokens (k + 1 rows), and the rest were plain."""
    dbp = [*drafted_by_position, 0]
    cost = (passes - dbp[0]) * costs.verify_cost(1)
    for k in range(1, len(dbp)):
        cost += (dbp[k - 1] - dbp[k]) * costs.verify_cost(k + 1)
    return cost


def prediction_estimates(bench: dict, costs) -> list[dict]:
    """Predicted Outputs on these costs at the acceptance a CPU run of `bench --plan predicted`
    measured, per suite. `recosted`: each auto+prediction run's passes (each at its own row count,
    from the run's drafts by position) priced on this curve, against the plain passes its answer
    needs after the prefill's token (tokens - 1 of one row), the median over runs. The CPU's choices are kept, so on a flatter curve this
    understates what `auto` would draft. `ceiling`: the bench's own upper bound at the suite's
    measured coverage (localspec.bench.ceiling.ceiling) on this curve."""
    from localspec.bench.ceiling import PREDICTED, ceiling, coverage

    runs = [r for r in bench.get("runs", []) if r.get("mode") == PREDICTED and r.get("target_passes")]
    out = []
    for suite in sorted({r["suite"] for r in runs}):
        ratios = []
        for r in (r for r in runs if r["suite"] == suite):
            cost = _passes_cost(costs, r["target_passes"], r.get("drafted_by_position") or [])
            ratios.append((r["tokens"] - 1) * costs.verify_cost(1) / cost)
        covered = coverage(bench["runs"], suite)
        best = ceiling(covered[0], costs.verify_cost) if covered else None
        out.append({"suite": suite, "runs": len(ratios), "recosted_speedup": round(statistics.median(ratios), 3),
                    "covered": round(covered[0], 3) if covered else None,
                    "ceiling": {"k": best.k, "speedup": round(best.speedup, 3)} if best else None})
    return out


# ---------------------------------------------------------------- the engine end to end

# Each mode's request, in the order: plain decoding first (its answer is the prediction and
# the reference), then the prediction at 100% acceptance, then the drafters.
ENGINE_MODES = ("off", "prediction", "lookup", "draft", "auto")
# Code-like text with repeats, so prompt lookup has matches even where random weights write noise.
ENGINE_PROMPT = "".join(f"def f{i}(x):\n    return x * {i} + f{i - 1}(x)\n\n" for i in range(1, 24))


def drive_engine(models: dict, costs, *, n_gpu_layers: int, threads: int | None, max_tokens: int,
                 write=lambda result: None, modes: tuple[str, ...] = ENGINE_MODES) -> dict:
    """One greedy request per mode (ENGINE_MODES, `off` first) through a real `Engine` on the
    synthetic models; `write` hears the result after each mode. `prediction` is mode `lookup` with
    `off`'s answer as the prediction (a prediction takes precedence there); `auto` runs on `costs`
    (no calibration)."""
    from localspec.engine.config import EngineConfig, GenerationRequest
    from localspec.engine.events import collect
    from localspec.engine.scheduler import Engine

    # No lookup history: a request asked again would copy the earlier answer, not test its drafter.
    # draft_p_min 0: a flat random-weight draft (--flat) is never confident, and would otherwise never draft.
    config = EngineConfig(n_ctx=2048, parallel=1, mode="off", n_gpu_layers=n_gpu_layers, n_threads=threads,
                          pinned_prefix_cells=0, lookup_history_tokens=0, draft_p_min=0.0)
    engine = Engine.load(models["target"]["path"], models["draft"]["path"], config)
    # Pinned: the modes before `auto` would otherwise teach it their passes, and `auto` is to run on
    # the swept curve itself.
    engine.costs = replace(costs, pinned=True)
    result: dict = {"max_tokens": max_tokens, "runs": {}}
    reference: tuple[list[int], str] | None = None
    try:
        for mode in modes:
            request = GenerationRequest(prompt=ENGINE_PROMPT, max_tokens=max_tokens,
                                        mode="lookup" if mode == "prediction" else mode,
                                        prediction=(reference[1] or None) if mode == "prediction" and reference else None)
            try:
                answer = collect(engine.generate(request))
            except Exception as exc:  # one mode's failure is a finding, not the end of the check
                result["runs"][mode] = {"finish": "error", "error": f"{type(exc).__name__}: {exc}"}
                write(result)
                continue
            done, ids = answer.done, list(answer.ids)
            st = done.stats
            run = {"finish": done.finish_reason, "error": done.error, "tokens": st.completion_tokens,
                   "decode_ms": round(st.decode_ms, 2), "target_passes": st.target_passes,
                   "tokens_per_s": round((st.completion_tokens - 1) / st.decode_ms * 1000, 2) if st.decode_ms else None,
                   "drafted": st.drafted, "accepted": st.accepted, "prediction_accepted": st.prediction_accepted}
            if mode == "off":
                reference = (ids, done.text)
            elif reference is not None:
                same = next((i for i, (a, b) in enumerate(zip(ids, reference[0], strict=False)) if a != b), None)
                if same is None and len(ids) != len(reference[0]):
                    same = min(len(ids), len(reference[0]))
                run["first_difference"] = same  # None: the same answer as `off`
            result["runs"][mode] = run
            write(result)
    finally:
        engine.close()
    return result


# ---------------------------------------------------------------- the product's own GPU split


def offload_plan(paths: dict[str, str], cfg, *, offload_supported: bool, probe) -> dict:
    """The split the product itself makes for these models (engine.offload: `serve`, the app and
    `generate` load with n_gpu_layers -1 through it), planned on free VRAM read by `probe` before
    the check loads them; the check's own load leaves -1 to llama.cpp, as a GPU this size fits all."""
    from localspec.engine.loading import offloaded
    from localspec.engine.offload import ALL_LAYERS, VramBudget
    from localspec.models.fit import model_layers

    if not offload_supported:
        return {"skipped": "llama.cpp offloads to no GPU here (a CPU build, or no GPU it can use): nothing to plan"}
    if cfg.n_gpu_layers != ALL_LAYERS:
        return {"skipped": f"--n-gpu-layers {cfg.n_gpu_layers}: the product plans only for -1 (a count given is kept)"}
    free, how = probe()
    if free is None:
        return {"skipped": "free VRAM could not be read (no NVML; nvidia-smi absent or no number from it): "
                           "the product leaves -1 to llama.cpp"}
    budget = VramBudget(free, model_layers)  # the target plans first, the draft gets what is left
    plans: dict[str, dict | None] = {}
    for role, path in paths.items():
        _, plan = offloaded(path, cfg, budget)
        plans[role] = None if plan is None else {
            "n_gpu_layers": plan.n_gpu_layers, "offloaded": plan.offloaded, "n_layers": plan.n_layers,
            "gpu_bytes": plan.gpu_bytes, "total_bytes": plan.total_bytes, "message": plan.message}
    return {"probe": how, "free_before": free, "plans": plans, "used": {},
            "planned_bytes": sum(p["gpu_bytes"] for p in plans.values() if p)}


def offload_used(plan: dict, *, probe, n_gpu_layers: int, when: str) -> dict:
    """`plan` with free VRAM read again `when` ("load": both models loaded, the CUDA context with
    them; "sweeps": after the sweeps and the engine's calibration, with what decoding adds: cuBLAS's
    workspace, ggml's pool, CUDA graphs). The plan is held against the most used, and only where it put every layer
    on the GPU, as the check's load did. The planner takes any GPU with free VRAM >= planned /
    (1 - VRAM_SPARE), so under that ratio a GPU it says just fits runs out of memory."""
    from localspec.engine.offload import ALL_LAYERS

    if "free_before" not in plan:
        return plan
    free, how = probe()
    if free is None:
        return {**plan, "error": f"free VRAM could not be read after the {when}"}
    used = {**plan["used"], when: plan["free_before"] - free}
    most = max(used.values())
    whole = n_gpu_layers == ALL_LAYERS and all(p and p["n_gpu_layers"] == ALL_LAYERS for p in plan["plans"].values())
    return {**plan, "used": used, "probe_after": how,
            "planned_over_used": round(plan["planned_bytes"] / most, 3) if whole and most > 0 else None}


def read_vram() -> tuple[int | None, str]:
    """Free VRAM as the product reads it, read now (either side of the load; imported here, so that a
    module missing on the box costs this step only)."""
    from localspec.models.fit import free_vram

    return free_vram(max_age_s=0)


def offload_line(offload: dict) -> str:
    """One line on the product's split against what the load used (summary.txt and the report)."""
    if "plans" not in offload:
        reason = offload.get("error") or offload.get("skipped") or "not planned"
        return f"the product's GPU split: {'failed: ' if offload.get('error') else ''}{reason}"
    from localspec.engine.offload import VRAM_SPARE

    gib = lambda n: f"{n / 2**30:.2f} GiB"  # noqa: E731
    plans = "; ".join(f"{role}: {p['message'] if p else 'no plan (its header cannot tell its layers)'}"
                      for role, p in offload["plans"].items())
    line = f"the product's GPU split (free VRAM by {offload['probe']}): {plans}; planned {gib(offload['planned_bytes'])}"
    used = offload.get("used") or {}
    if used:
        line += "; used " + ", ".join(f"{gib(n)} after the {when}" for when, n in used.items())
        if max(used.values()) <= 0:
            line += " (no more than before: another program freed memory meanwhile, so no comparison)"
        elif (ratio := offload.get("planned_over_used")) is not None:
            line += f" (planned / most used {ratio:.3f}" + (
                "" if ratio >= 1 else f": within the {VRAM_SPARE:.0%} of free VRAM the plan keeps spare"
                if ratio >= 1 - VRAM_SPARE else
                f": short by more than the {VRAM_SPARE:.0%} kept spare, so a GPU the planner says just fits "
                "runs out of memory") + ")"
    return line + (f"; then {offload['error']}" if offload.get("error") else "")


# ---------------------------------------------------------------- measuring


def _prefill(rt, tokens: list[int], seq: int = 0) -> None:
    """Sequence `seq` holds exactly `tokens`, read 256 a pass (within n_batch)."""
    from localspec.engine.runtime import Row

    rt.seq_rm(seq, 0, -1)
    for start in range(0, len(tokens), 256):
        rt.decode([Row(t, start + i, seq) for i, t in enumerate(tokens[start : start + 256])])


def _sweep(rt, rows_max: int, context: int, repeats: int, seq: int = 0) -> list[float]:
    """Median seconds of a decode of n rows (all with logits) after `context` tokens, n = 1..rows_max.

    The sizes are timed round-robin (1..rows_max, then again), so a burst of load from elsewhere
    spreads over all sizes instead of inflating one of them.
    """
    from localspec.engine.runtime import Row

    _prefill(rt, [(i * 7919) % rt.n_vocab for i in range(context)], seq)

    def once(n: int) -> float:
        t0 = time.perf_counter()
        rt.decode([Row((13 * i + 1) % rt.n_vocab, context + i, seq, logits=True) for i in range(n)])
        seconds = time.perf_counter() - t0
        rt.seq_rm(seq, context, -1)
        return seconds

    sizes = range(1, rows_max + 1)
    for n in sizes:
        once(n)  # first use of a batch shape allocates buffers / builds graphs
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats):
        for n in sizes:
            times[n].append(once(n))
    rt.seq_rm(seq, 0, -1)
    return [statistics.median(times[n]) for n in sizes]


def batch_flips(rt, tokens: list[int], *, context: int = FLIP_CONTEXT, rows: int = FLIP_ROWS,
                sizes: tuple[int, ...] = FLIP_SIZES) -> dict:
    """How often a verify pass's size changes a row's argmax on this backend, and by how much.

    Reads `rows` tokens after the first `context` of `tokens` one row a pass (as plain decoding
    does), then in passes of each size (as a verify does). A flip is a row whose argmax differs; its
    gap is how far the one-row pass put the batched pass's pick below its own. Flips within
    verify.TIE_MARGIN are the near-ties an answer asked again settles (the lossless tests allow 0.5).
    `one_row_lead_under` counts rows whose top two are closer than each bound: how many rows are
    near-ties at all (flat logits give many, far more than a real model's: an upper bound for it)."""
    import numpy as np

    from localspec.engine.calibrate import logits_in_passes
    from localspec.engine.verify import TIE_MARGIN

    ctx, read_rows = tokens[:context], tokens[context : context + rows]
    _prefill(rt, ctx)
    one = logits_in_passes(rt, ctx, read_rows, 1)
    best = one.argmax(axis=1)
    top_two = np.partition(one, -2, axis=1)[:, -2:]
    lead = top_two[:, 1] - top_two[:, 0]
    result: dict = {"context": len(ctx), "rows": len(read_rows), "tie_margin": TIE_MARGIN,
                    "one_row_lead_under": {str(b): int((lead < b).sum()) for b in (0.01, 0.05, 0.1, TIE_MARGIN, 0.5)},
                    "by_rows": {}}
    for size in sizes:
        other = logits_in_passes(rt, ctx, read_rows, size)
        picked = other.argmax(axis=1)
        gaps = sorted(round(float(one[i, best[i]] - one[i, picked[i]]), 4) for i in np.flatnonzero(picked != best))
        result["by_rows"][str(size)] = {"flips": len(gaps), "within_margin": sum(g <= TIE_MARGIN for g in gaps),
                                        "gaps": gaps, "max_abs_logit_diff": round(float(np.abs(other - one).max()), 4)}
    rt.seq_rm(0, 0, -1)
    return result


def _gpu_names() -> list[str]:
    """name, memory, compute capability and driver of each GPU, as nvidia-smi says."""
    try:
        import subprocess

        res = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,compute_cap,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        return [line.strip() for line in res.stdout.splitlines() if line.strip()] if res.returncode == 0 else []
    except (OSError, subprocess.SubprocessError):
        return []


def _swept_costs(verify: list[float], draft_rows: list[float]):
    """The controller's costs from a full sweep: verify[n-1] for n rows; the draft's step and the
    per-row slope of a catch-up batch (as calibrate.measure derives them from 1 and 16 rows)."""
    from localspec.engine.controller import Costs

    return Costs(verify=verify, draft_step=draft_rows[0],
                 draft_row=max((draft_rows[-1] - draft_rows[0]) / max(len(draft_rows) - 1, 1), 0.0))


def run(args: argparse.Namespace) -> dict:
    """Measure in the issue's order, writing the JSON after each step so that a timeout still
    returns what was done: verify 1..16 rows at context 48 and ~2k plus the draft step; the engine's
    own calibration; the predictions; the engine in each mode (`off`, the prediction at 100%
    acceptance, lookup, draft, auto) with greedy equality against `off`; how often batch size
    flips an argmax; then the 1.5B target's shape."""
    import llama_cpp

    from localspec.engine import calibrate
    from localspec.engine.runtime import ModelRuntime, RuntimeConfig

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    names = ("small-target", "small-draft") if args.small else ("qwen2.5-coder-7b", "qwen2.5-coder-0.5b")
    chain = None if args.flat else word_chain(args.vocab)
    models = {role: _synth(args, name, role, chain) for role, name in zip(("target", "draft"), names, strict=True)}
    offload = bool(llama_cpp.llama_supports_gpu_offload())
    cfg = RuntimeConfig(n_ctx=SWEEP_N_CTX, n_batch=512, n_ubatch=512, n_outputs_max=64, n_threads=args.threads,
                        n_gpu_layers=args.n_gpu_layers, flash_attn="auto")
    paths = {role: m["path"] for role, m in models.items()}
    planned = _guarded("the offload plan", lambda: offload_plan(paths, cfg, offload_supported=offload, probe=read_vram))
    t0 = time.perf_counter()
    target = ModelRuntime(models["target"]["path"], cfg)
    draft = ModelRuntime(models["draft"]["path"], cfg)
    load_s = time.perf_counter() - t0
    offload_record = _guarded("the offload plan", lambda: offload_used(planned, probe=read_vram,
                                                                        n_gpu_layers=args.n_gpu_layers, when="load"))
    print(f"loaded both in {load_s:.1f} s; GPU offload supported: {offload}", flush=True)
    print(offload_line(offload_record), flush=True)  # in check.log, should a sweep crash the process
    calibration: dict = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "gpus": _gpu_names(), "nvcc": os.environ.get("LOCALSPEC_NVCC_VERSION"),
                    "gpu_offload": offload, "n_gpu_layers": args.n_gpu_layers, "threads": args.threads,
                    "llama_cpp_python": llama_cpp.__version__,
                    "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip()},
        "models": models,
        "word_chain": None if chain is None else {
            "words": int((chain["target"] >= 0).sum()), "cycle": CHAIN_CYCLE, "draft_agrees": DRAFT_AGREES,
            "note": "after a word, the target's greedy next token is its successor by a wide margin (synth_gguf.py)"},
        "load_seconds": round(load_s, 2),
        "offload": offload_record,
    }

    def save(name: str, obj: dict | str) -> None:
        # Whole or not at all: the check may be killed at its budget in the middle of a write.
        tmp = out / f"{name}.tmp"
        tmp.write_text(obj if isinstance(obj, str) else json.dumps(obj, indent=1))
        os.replace(tmp, out / name)

    save("calibration.json", calibration)  # the machine, the models and the split, before the first pass

    rows = args.k_max + 1
    verify = _sweep(target, rows, CONTEXT, args.repeats)
    draft_rows = _sweep(draft, 16, CONTEXT, args.repeats)
    swept = _swept_costs(verify, draft_rows)
    calibration["sweep"] = {"context": CONTEXT, "repeats": args.repeats, "verify_by_rows": verify,
                            "draft_by_rows": draft_rows, "catch_up_by_tokens": [swept.catch_up(n) for n in range(1, 17)]}
    calibration["verify_ratio_to_one_row"] = [round(v / verify[0], 3) for v in verify]
    calibration["sweep_long_context"] = {"context": LONG_CONTEXT, "verify_by_rows": [], "draft_by_rows": []}
    save("calibration.json", calibration)
    print(f"swept at context {CONTEXT} ({time.perf_counter() - t_start:.0f} s)", flush=True)
    if not args.quick:
        calibration["sweep_long_context"] = {"context": LONG_CONTEXT,
                                             "verify_by_rows": _sweep(target, rows, LONG_CONTEXT, args.repeats),
                                             "draft_by_rows": _sweep(draft, 2, LONG_CONTEXT, args.repeats)}
        save("calibration.json", calibration)
    t0 = time.perf_counter()
    engine_costs = calibrate.measure(target, draft, args.k_max)  # what `auto` itself measures at start-up
    calibration["engine_calibration"] = {"seconds": round(time.perf_counter() - t0, 2), "k_max": args.k_max,
                                         **engine_costs.to_json()}
    calibration["offload"] = {**offload_record, **_guarded("the offload plan", lambda: offload_used(  # an error keeps the load's
        offload_record, probe=read_vram, n_gpu_layers=args.n_gpu_layers, when="sweeps"))}
    save("calibration.json", calibration)
    draft.close()

    bench = json.loads(args.bench.read_text()) if args.bench and args.bench.is_file() else {}
    profiles = profiles_from_bench(bench)
    preds = {
        "note": ("Acceptance profiles were measured with the real Qwen2.5-Coder 1.5B/0.5B pair on a CPU; "
                 "costs are measured here with random weights of the shapes in 'models'. "
                 "speedup = the controller's expected tokens/s over plain decoding (1 / verify(1 row))."),
        "bench": {"path": str(args.bench), "command": bench.get("command"), "started": bench.get("started")},
        "costs": {"engine_calibration": predict_all(engine_costs, profiles), "sweep": predict_all(swept, profiles)},
    }
    predicted = json.loads(args.predicted_bench.read_text()) if args.predicted_bench and args.predicted_bench.is_file() else {}
    preds["predicted_outputs"] = {"bench": {"path": str(args.predicted_bench), "started": predicted.get("started")},
                                  "sweep": prediction_estimates(predicted, swept)}
    save("predictions.json", preds)
    # From here each step is on its own: one that raises is recorded, and the next still runs.
    engine: dict = {}
    preds["engine"] = engine
    if args.engine_tokens > 0:
        def write(result: dict) -> None:
            engine.update(result)
            save("engine.json", engine)

        engine.update(_guarded("the engine", lambda: drive_engine(
            models, swept, n_gpu_layers=args.n_gpu_layers, threads=args.threads, max_tokens=args.engine_tokens,
            write=write)))
    # Rows after words are decided by wide margins (the chain): read the rows after other tokens,
    # whose logits are flat over the words' rows at a real model's spread (std ~2): near-ties.
    flip_tokens = [t for t in target.tokenize(ENGINE_PROMPT * 2) if chain is None or chain["target"][t] < 0]
    engine["batch_flips"] = _guarded("batch flips", lambda: batch_flips(target, flip_tokens))
    save("engine.json", engine)
    target.close()

    def summarise() -> None:
        summary = render_summary(calibration, preds, time.perf_counter() - t_start)
        save("summary.txt", summary)
        print(summary, flush=True)

    summarise()  # now, in case the last step runs past the budget
    left = args.deadline_s - (time.perf_counter() - t_start)
    if args.no_second_target:
        return preds
    needs = 0 if args.small else SECOND_TARGET_NEEDS_S
    if left < needs or left <= 0:
        engine["second_target"] = {"skipped": f"{max(left, 0):.0f} s left of the budget, under {needs} s"}
    else:
        second: dict = {}
        engine["second_target"] = second
        second.update(_guarded("the second target", lambda: second_target(
            args, second, swept_draft=draft_rows, draft=models["draft"], cfg=cfg, chain=chain,
            write=lambda: save("engine.json", engine))))
    save("engine.json", engine)
    summarise()
    return preds


def _guarded(what: str, step) -> dict:
    """step(), or {"error": ...} if it raised: one step's failure is a finding, not the end of the check."""
    try:
        return step()
    except Exception as exc:  # noqa: BLE001
        print(f"{what} failed: {type(exc).__name__}: {exc}", flush=True)
        return {"error": f"{type(exc).__name__}: {exc}"}


def word_chain(vocab: Path) -> dict:
    """The target's and the draft's successor arrays (synth_gguf.successors) over the vocab's plain words."""
    tokens: list[str] = synth_gguf.read_kv(vocab)["tokenizer.ggml.tokens"][2]  # type: ignore[assignment]
    n_vocab = max(shape.n_vocab for shape in synth_gguf.SHAPES.values())
    target = synth_gguf.successors(synth_gguf.word_ids(tokens), n_vocab, cycle=CHAIN_CYCLE)
    return {"target": target, "draft": synth_gguf.disagree(target, 1 - DRAFT_AGREES)}


def _synth(args: argparse.Namespace, name: str, role: str, chain: dict | None) -> dict:
    info = synth_gguf.write_random_gguf(args.work / f"{name}-{args.recipe}.gguf", synth_gguf.SHAPES[name],
                                        args.vocab, args.recipe, successor=None if chain is None else chain[role])
    print(f"wrote {role} {info['path']}: {info['bytes'] / 2**20:.0f} MiB in {info['seconds']} s {info['types']}",
          flush=True)
    return info


def second_target(args: argparse.Namespace, result: dict, *, swept_draft: list[float], draft: dict, cfg,
                  chain: dict | None, write) -> dict:
    """The 1.5B target's shape with the same draft, into `result`: its verify sweep at both contexts,
    then `off` and `off`'s answer as the prediction through the engine. `write` is called after each part."""
    from localspec.engine.runtime import ModelRuntime

    model = _synth(args, "small-second" if args.small else SECOND_TARGET, "target", chain)
    result["model"] = model
    rt = ModelRuntime(model["path"], cfg)
    try:
        result["verify_by_rows"] = _sweep(rt, args.k_max + 1, CONTEXT, args.repeats)
        write()
        result["verify_by_rows_long_context"] = [] if args.quick else _sweep(rt, args.k_max + 1, LONG_CONTEXT,
                                                                              args.repeats)
    finally:
        rt.close()
    write()
    costs = _swept_costs(result["verify_by_rows"], swept_draft)

    def on_mode(engine: dict) -> None:
        result["engine"] = engine
        write()

    if args.engine_tokens > 0:
        drive_engine({"target": model, "draft": draft}, costs, n_gpu_layers=args.n_gpu_layers, threads=args.threads,
                     max_tokens=args.engine_tokens, modes=("off", "prediction"), write=on_mode)
    return result


def predict_all(costs, profiles: list[dict]) -> list[dict]:
    return [predict(costs, p) for p in profiles]


def render_summary(cal: dict, preds: dict, seconds: float) -> str:
    m = cal["machine"]
    sw = cal["sweep"]
    ms = lambda xs: " ".join(f"{x * 1000:.1f}" for x in xs)  # noqa: E731
    lines = [
        f"localspec GPU cost check ({seconds:.0f} s): target {cal['models']['target']['shape']}, "
        f"draft {cal['models']['draft']['shape']} ({cal['models']['target']['recipe']})",
        f"GPUs: {', '.join(m['gpus']) or 'none'}; GPU offload: {m['gpu_offload']}; llama-cpp-python {m['llama_cpp_python']}",
        offload_line(cal.get("offload") or {}),
        (f"weights: a word chain of {chain['words']} words in cycles of {chain['cycle']}, the draft following "
         f"{chain['draft_agrees']:.0%} of it" if (chain := cal.get("word_chain")) else "weights: all random (flat logits)"),
        f"target verify, ms by rows 1..{len(sw['verify_by_rows'])} (context {sw['context']}): {ms(sw['verify_by_rows'])}",
        f"  ratio to 1 row: {' '.join(str(r) for r in cal['verify_ratio_to_one_row'])}",
        f"draft, ms by rows 1..16 (a catch-up of n tokens is one n-row batch): {ms(sw['draft_by_rows'])}",
    ]
    if cal["sweep_long_context"]["verify_by_rows"]:
        lc = cal["sweep_long_context"]
        lines.append(f"at context {lc['context']}: target verify ms by rows: {ms(lc['verify_by_rows'])}; "
                     f"draft step {lc['draft_by_rows'][0] * 1000:.1f} ms")
    ec = cal["engine_calibration"]
    lines.append(f"engine calibration ({ec['seconds']} s): verify ms {ms(ec['verify'])}; draft step "
                 f"{ec['draft_step'] * 1000:.1f} ms, catch-up row {ec['draft_row'] * 1000:.2f} ms")
    lines.append("")
    lines.append("auto controller, from the swept costs (k_max 8): chosen drafter/k and predicted speedup over plain decoding")
    lines.append(f"{'suite':8} {'mode':9} {'lag0: k  speedup':18} {'lag1: k  speedup':18} speedup by k=1..8")
    for p in preds["costs"]["sweep"]:
        cells = []
        for lag in ("lag0", "lag1"):
            c = p.get(lag)
            cells.append(f"{c['drafter'][:6]:6} {c['k']:2} {c['speedup']:6.2f}x" if c else "-")
        lines.append(f"{p['suite']:8} {p['mode']:9} {cells[0]:18} {cells[1]:18} {' '.join(f'{s:.2f}' for s in p['speedup_by_k'])}")
    if not preds["costs"]["sweep"]:
        lines.append("(no acceptance profiles: no bench JSON given)")
    lines.append("")
    lines.append("Predicted Outputs (auto+prediction) at the CPU bench's acceptance, on the swept costs:")
    for e in preds.get("predicted_outputs", {}).get("sweep", []):
        c = e["ceiling"]
        lines.append(f"{e['suite']:10} CPU passes re-costed {e['recosted_speedup']:.2f}x; drafts gave {e['covered']:.0%}, "
                     f"ceiling {c['speedup']:.2f}x at k={c['k']}" if c else f"{e['suite']:10} {e['recosted_speedup']:.2f}x")
    if not preds.get("predicted_outputs", {}).get("sweep"):
        lines.append("(none: no predicted bench JSON given)")
    engine = preds.get("engine", {})
    for what, part in (("the engine", engine), ("batch flips", engine.get("batch_flips") or {}),
                       ("the second target", engine.get("second_target") or {})):
        if part.get("error") or part.get("skipped"):
            lines.append(f"{what}: {'failed: ' + part['error'] if part.get('error') else 'skipped: ' + part['skipped']}")
    if engine.get("runs"):
        lines.append("")
        lines.append("the engine end to end (greedy; tokens/s after the first token; kept/drafted; same answer as off)")
        lines.extend(_engine_lines(engine["runs"]))
    flips = engine.get("batch_flips")
    if flips and "by_rows" in flips:
        lines.append("")
        lead = flips["one_row_lead_under"]
        lines.append(f"batch size and the argmax: {flips['rows']} rows after {flips['context']} tokens, one row a pass "
                     f"against passes of n rows; top two closer than 0.1 / {flips['tie_margin']} in "
                     f"{lead['0.1']} / {lead[str(flips['tie_margin'])]} rows")
        for size, f in flips["by_rows"].items():
            lines.append(f"  {size:>2} rows: {f['flips']} flips ({f['within_margin']} within the margin), gaps "
                         f"{' '.join(str(g) for g in f['gaps'][:8]) or '-'}; largest logit difference {f['max_abs_logit_diff']}")
    second = engine.get("second_target")
    if second and second.get("verify_by_rows"):
        lines.append("")
        v = second["verify_by_rows"]
        lines.append(f"{second['model']['shape']}: verify ms by rows 1..{len(v)}: {ms(v)}")
        if second.get("verify_by_rows_long_context"):
            lines.append(f"  at context {LONG_CONTEXT}: {ms(second['verify_by_rows_long_context'])}")
        lines.extend(_engine_lines(second.get("engine", {}).get("runs", {})))
    return "\n".join(lines) + "\n"


def same_as_off(mode: str, run: dict) -> str:
    """Whether a mode's answer was `off`'s: "yes", "from <token index>", or "-" (`off` itself, or
    `off` failed and there was nothing to compare with)."""
    diff = run.get("first_difference", "-")
    return "-" if mode == "off" or diff == "-" else "yes" if diff is None else f"from {diff}"


def _engine_lines(runs: dict) -> list[str]:
    lines = []
    for mode, r in runs.items():
        if "tokens" not in r:
            lines.append(f"{mode:10} failed: {r['error']}")
            continue
        lines.append(f"{mode:10} {r['tokens_per_s'] or 0:8.1f} tok/s  {r['accepted']}/{r['drafted']}  {same_as_off(mode, r)}"
                     + (f"  error: {r['error']}" if r["error"] else ""))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Measure speculative-decoding costs and predict auto's speedup.")
    ap.add_argument("--out", type=Path, required=True, help="directory for calibration/predictions/summary")
    ap.add_argument("--work", type=Path, default=Path("/tmp/localspec-gpu-check-models"),
                    help="where the synthetic models go (GBs for the real shapes; not the output dir)")
    ap.add_argument("--vocab", type=Path, required=True, help="ggml-vocab-qwen2.gguf")
    ap.add_argument("--bench", type=Path, help="localspec bench JSON with by-position acceptance")
    ap.add_argument("--predicted-bench", type=Path, help="a `localspec bench --plan predicted` JSON")
    ap.add_argument("--small", action="store_true", help="tiny shapes (CPU rehearsal)")
    ap.add_argument("--recipe", choices=("q4_k_m", "q8_0"), default="q4_k_m")
    ap.add_argument("--flat", action="store_true",
                    help="all-random weights (flat logits), without the word chain that makes greedy answers decisive")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--n-gpu-layers", type=int, default=-1)
    ap.add_argument("--k-max", type=int, default=15, help="verify batches up to k_max+1 rows (default 16)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="skip the long-context sweeps")
    ap.add_argument("--no-second-target", action="store_true", help="skip the 1.5B target's shape at the end")
    ap.add_argument("--deadline-s", type=float, default=float("inf"),
                    help="seconds this run may take (gpu-check.sh passes what is left of its budget): the "
                         "1.5B target is skipped when too little is left for it")
    ap.add_argument("--engine-tokens", type=int, default=128,
                    help="tokens per request when driving the engine in each mode (0: skip)")
    args = ap.parse_args(argv)
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
