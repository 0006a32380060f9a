"""`localspec bench`: speculative modes against target-only and the anchors, side by side.

Every ratio comes from one run: modes are interleaved per prompt (shuffled with a fixed seed) and
repeated, so machine noise hits all of them alike. Reported figures are medians with the
interquartile range.
"""

from __future__ import annotations

import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import resources

import psutil

from localspec.bench import goals as bench_goals
from localspec.bench.anchors import LlamaServerPool, rendered_prompt
from localspec.engine.chat import ChatMessage
from localspec.engine.config import GenerationRequest
from localspec.engine.events import Done, Generated, collect
from localspec.engine.scheduler import Engine

SCHEMA_VERSION = 1
SHUFFLE_SEED = 1234  # the modes' order per prompt: shuffled, but the same in every run


@dataclass(frozen=True)
class ModeSpec:
    name: str  # label in reports, e.g. "draft-k4"
    mode: str
    k: int | None = None
    prediction: bool = False  # sends the prompt's prediction (edit plans: the file being edited)


class Workload(StrEnum):
    """What a plan's suites hold: chat prompts (suites.json), or edit tasks whose reply is a whole file
    and whose prediction is that file (localspec.bench.edits)."""

    PROMPTS = "prompts"
    EDITS = "edits"


@dataclass
class BenchPlan:
    suites: list[str]
    modes: list[ModeSpec]
    prompts_per_suite: int
    repeats: int
    max_tokens: int
    n_ctx: int = 4096
    threads: int | None = None
    quick: bool = False
    anchors: bool = True
    llama_server_configs: list[dict] = field(default_factory=list)
    # llama-cpp-python's lookup anchor runs at about a third of our speed; None: every prompt.
    anchor_prompts_per_suite: int | None = None
    # Characters of the long prompt read for the prefix-reuse TTFT; None: all of it (~2k tokens).
    ttft_chars: int | None = None
    name: str = "full"
    # Prompts of a suite where it differs from prompts_per_suite; None: every shipped prompt.
    suite_prompts: dict[str, int | None] = field(default_factory=dict)
    # Keep one llama-server per configuration up and send it each prompt between our modes, so its
    # runs pair with ours in every repeat (else: each configuration after ours, each prompt once, except
    # those whose dict says "interleave": True; see `server_split`).
    interleave_servers: bool = False
    ttft: bool = True  # the prefix-reuse TTFT phase
    python_anchor: bool = True  # llama-cpp-python's lookup decoding
    workload: Workload = Workload.PROMPTS
    # Modes of a suite where they differ from `modes`.
    suite_modes: dict[str, list[ModeSpec]] = field(default_factory=dict)

    def prompt_count(self, suite: str) -> int | None:
        return self.suite_prompts[suite] if suite in self.suite_prompts else self.prompts_per_suite

    def modes_for(self, suite: str) -> list[ModeSpec]:
        return self.suite_modes.get(suite, self.modes)

    def prompts(self, suite: str, suites: dict[str, dict]) -> list[str]:
        return suites[suite]["prompts"][: self.prompt_count(suite)]

    def to_json(self) -> dict:
        return {"name": self.name, "suites": self.suites, "modes": [m.name for m in self.modes],
                "prompts_per_suite": self.prompts_per_suite, "suite_prompts": self.suite_prompts,
                "repeats": self.repeats, "max_tokens": self.max_tokens, "n_ctx": self.n_ctx, "threads": self.threads,
                "quick": self.quick, "anchor_prompts_per_suite": self.anchor_prompts_per_suite,
                "ttft_chars": self.ttft_chars, "llama_server_configs": [c["name"] for c in self.llama_server_configs],
                "interleave_servers": self.interleave_servers, "workload": str(self.workload),
                "suite_modes": {s: [m.name for m in ms] for s, ms in self.suite_modes.items()}}


def quick_plan(threads: int | None = None) -> BenchPlan:
    return BenchPlan(
        suites=["code", "chat", "editing"],
        modes=[ModeSpec("off", "off"), ModeSpec("lookup", "lookup"), ModeSpec("draft-k4", "draft", 4),
               ModeSpec("auto", "auto")],
        prompts_per_suite=2, repeats=1, max_tokens=64, threads=threads, quick=True, name="quick",
        # Keeps the smoke run well under 5 minutes on 2 cores: one slow-anchor prompt per suite and
        # a ~500-token first turn (its cold prefill alone is ~30 s at the full 2k).
        anchor_prompts_per_suite=1, ttft_chars=2000,
        llama_server_configs=[{"name": "draft-simple n=3 p=0.75", "draft": True,
                               "args": ["--spec-type", "draft-simple", "--spec-draft-n-max", "3",
                                        "--spec-draft-p-min", "0.75"]}],
    )


def full_plan(threads: int | None = None) -> BenchPlan:
    """Every mode, suite and anchor, sized to finish in about 70 minutes on a 2-core CPU.

    4 prompts per suite (the long suite has 2) and 2 repeats give 8 paired runs per suite and mode
    (4 on the long suite); the anchors run each prompt once. 6 prompts and 3 repeats would take
    three hours or more here: 3 suites at 6 prompts, 1 repeat and 96 tokens already took 34 minutes.
    """
    sweep = []
    for n in (3, 8):
        for p in ("0", "0.75"):
            args = ["--spec-type", "draft-simple", "--spec-draft-n-max", str(n), "--spec-draft-p-min", p]
            sweep.append({"name": f"draft-simple n={n} p={p}", "draft": True, "args": args})
    for t in ("ngram-simple", "ngram-mod", "ngram-map-k"):
        # Interleaved with our modes (see `server_split`): P3 weighs auto against these.
        sweep.append({"name": t, "args": ["--spec-type", t], "draft": False, "interleave": True})
    return BenchPlan(
        suites=["code", "chat", "editing", "long"],
        modes=[ModeSpec("off", "off"), ModeSpec("draft-k2", "draft", 2), ModeSpec("draft-k4", "draft", 4),
               ModeSpec("draft-k8", "draft", 8), ModeSpec("lookup", "lookup"), ModeSpec("auto", "auto")],
        prompts_per_suite=4, repeats=2, max_tokens=128, threads=threads, llama_server_configs=sweep,
    )


def server_split(plan: BenchPlan) -> tuple[list[dict], list[dict]]:
    """(interleaved, apart): the llama-server configurations that run between our modes in every repeat (with
    its target-only run, when any does), and those that run after ours, each prompt once.

    A configuration run apart is timed minutes after our modes, so its ratio to our `off` carries the box's
    drift: in the full run of 2026-12-03 llama-server's `off` read 0.88x ours on editing and its n-gram
    configurations 1.10-1.11x, while the goals runs, interleaved, read 0.93-0.99x and 0.96-0.99x on first
    asks, and the n-gram drafters priced on one verify curve (`replay_auto.py ceiling`) reach 0.93-0.96x of
    plain decoding there. So the n-gram configurations, which P3 weighs `auto` against, are interleaved in the
    full plan too; the draft-model sweep (0.4-0.7x here, 4 servers) still runs apart, to keep the run short."""
    interleaved = [c for c in plan.llama_server_configs if plan.interleave_servers or c.get("interleave")]
    return interleaved, [c for c in plan.llama_server_configs if c not in interleaved]


GOALS_CODE_PROMPTS = 4


def goals_plan(threads: int | None = None) -> BenchPlan:
    """Issue #31's goals in one run of at most ~30 minutes on a 2-core CPU.

    Every shipped editing prompt (P2 asks for all 6) and 4 of the 6 code prompts, 256 tokens,
    3 repeats; per prompt and repeat our off, lookup and auto and llama-server's off, ngram-simple
    and ngram-mod run interleaved in a shuffled order (the servers stay up, idle between requests).
    Estimate at ~37 tokens/s for `off` (256 tokens ~7 s; drafting modes are faster on editing, a
    ~200-token editing prefill adds ~1-2 s): editing 6 x 3 x 6 = 108 runs x <= 8 s ~ 14 min, code
    4 x 3 x 6 = 72 runs x <= 7.5 s ~ 9 min, plus loading, calibration and server start ~ 2 min:
    ~25 min (~16 min without a llama-server binary). All 6 code prompts would take ~30 min.
    No TTFT, memory or llama-cpp-python phases: they are not #31's goals.
    """
    servers = [{"name": t, "args": ["--spec-type", t], "draft": False} for t in ("ngram-simple", "ngram-mod")]
    return BenchPlan(
        suites=["editing", "code"],
        modes=[ModeSpec("off", "off"), ModeSpec("lookup", "lookup"), ModeSpec("auto", "auto")],
        prompts_per_suite=GOALS_CODE_PROMPTS, suite_prompts={"editing": None}, repeats=3, max_tokens=256,
        threads=threads, llama_server_configs=servers, name="goals", interleave_servers=True, ttft=False,
        python_anchor=False,
    )


PREDICTED_MODES = [ModeSpec("off", "off"), ModeSpec("lookup", "lookup"), ModeSpec("auto", "auto"),
                   ModeSpec("auto+prediction", "auto", prediction=True)]


def predicted_plan(threads: int | None = None) -> BenchPlan:
    """Issue #26's goals: the held-in edit tasks (data/predicted.json) as off, lookup, auto and auto
    with the file as the prediction, then the shipped editing prompts, untouched, with the code in each
    prompt as the prediction (off, auto, auto+prediction). Greedy, 2 repeats, each reply's budget as
    `localspec edit` sizes it (max_tokens 0; --max-tokens gives every reply that budget instead).

    Estimate at ~11 tokens/s for `off` on the 1.5B target and 2 cores: a task's file is ~350-450
    tokens, so ~40 s in `off` and ~90 s for its four modes; 6 tasks x 2 repeats ~ 18 min. The
    editing prompts' code is ~150-250 tokens: 6 x 2 x 3 modes ~ 8 min. With loading ~ 30 min.
    """
    return BenchPlan(
        suites=["predicted", "editing"], modes=PREDICTED_MODES,
        suite_modes={"editing": [m for m in PREDICTED_MODES if m.name != "lookup"]},
        # Every task and every editing prompt (another suite named by --suites: its first 8); --prompts N
        # takes the first N of each.
        prompts_per_suite=8, suite_prompts={"predicted": None, "editing": None}, repeats=2, max_tokens=0,
        threads=threads, anchors=False, name="predicted", ttft=False, python_anchor=False,
        workload=Workload.EDITS,
    )


PLANS: dict[str, Callable[[int | None], BenchPlan]] = {"quick": quick_plan, "full": full_plan, "goals": goals_plan,
                                                       "predicted": predicted_plan}


def load_suites() -> dict[str, dict]:
    return json.loads(resources.files("localspec.bench").joinpath("data/suites.json").read_text(encoding="utf-8"))


def _chat(prompt: str, max_tokens: int, spec: ModeSpec) -> GenerationRequest:
    # Each mode is its own client, as each llama-server configuration is its own server: a mode's
    # lookup may copy its own earlier answers, never another mode's from the same repeat.
    return GenerationRequest(messages=[ChatMessage(role="user", content=prompt)], max_tokens=max_tokens, mode=spec.mode,
                             k=spec.k, history_scope=f"bench:{spec.name}")


def run_request(engine: Engine, request: GenerationRequest) -> Generated:
    return collect(engine.generate(request))


def _run_one(engine: Engine, request: GenerationRequest) -> Done:
    return run_request(engine, request).done


def run_row(suite: str, prompt: int | str, rep: int, mode: str, done: Done) -> dict:
    """One run as bench.json records it."""
    s = done.stats
    return {
        "suite": suite, "prompt": prompt, "rep": rep, "mode": mode, "engine": "localspec",
        "tokens": s.completion_tokens, "tps": s.tokens_per_second, "ttft_ms": s.ttft_ms,
        "drafted": s.drafted, "accepted": s.accepted,
        "drafted_by_position": s.drafted_by_position, "accepted_by_position": s.accepted_by_position,
        "mean_accepted_length": s.mean_accepted_length, "finish": done.finish_reason,
        # auto's exploration steps, once the engine counts them (Stats.explored).
        "explored": getattr(s, "explored", None),
        "near_ties_settled": s.near_ties_settled,  # as an earlier answer to the same question settled them
    }


def run_modes(engine: Engine, plan: BenchPlan, tick: Callable[[str], None], *,
              servers: LlamaServerPool | None = None) -> list[dict]:
    """Each prompt and repeat runs every mode (and each of `servers`' configurations) in a shuffled order."""
    suites = load_suites()
    rng = random.Random(SHUFFLE_SEED)
    runs = []
    for rep in range(plan.repeats):
        for suite in plan.suites:
            for pid, prompt in enumerate(plan.prompts(suite, suites)):
                order: list[ModeSpec | str] = [*plan.modes, *(servers.modes if servers else [])]
                rng.shuffle(order)
                for spec in order:
                    if isinstance(spec, str):
                        assert servers is not None
                        tick(f"{suite} #{pid} {spec}")
                        rendered = rendered_prompt(engine.target.chat_template, prompt)
                        runs.append(servers.complete(spec, suite, pid, rep, rendered, plan.max_tokens))
                        continue
                    tick(f"{suite} #{pid} {spec.name}")
                    done = _run_one(engine, _chat(prompt, plan.max_tokens, spec))
                    runs.append(run_row(suite, pid, rep, spec.name, done))
    return runs


def second_turn_ttft(engine: Engine, tick: Callable[[str], None], max_chars: int | None = None) -> dict:
    """Cold prefill of a long first turn against the second turn, which reuses its KV prefix."""
    tick("prefix reuse: TTFT")
    text = load_suites()["long"]["prompts"][0][:max_chars]
    for slot in engine.slots:
        engine._reset_kv(slot)
    turn1 = [ChatMessage(role="user", content=text)]
    first = _run_one(engine, GenerationRequest(messages=turn1, max_tokens=32, mode="off"))
    turn2 = turn1 + [ChatMessage(role="assistant", content=first.text),
                     ChatMessage(role="user", content="Now in one sentence.")]
    second = _run_one(engine, GenerationRequest(messages=turn2, max_tokens=8, mode="off"))
    return {
        "cold_ttft_ms": first.stats.ttft_ms, "cold_prompt_tokens": first.stats.prompt_tokens,
        "second_turn_ttft_ms": second.stats.ttft_ms, "second_turn_prompt_tokens": second.stats.prompt_tokens,
        "second_turn_reused_tokens": second.stats.reused_prefix_tokens,
        "ratio": second.stats.ttft_ms / first.stats.ttft_ms if first.stats.ttft_ms else None,
    }


def memory_by_mode(plan: BenchPlan, tick: Callable[[str], None], *, calibration_dir: str | None = None) -> dict:
    """Peak RSS per mode, each in its own process (a process's peak cannot be reset); `calibration_dir`
    overrides where their `auto` finds its costs (a noisy run's fresh one)."""
    out = {}
    env = {**os.environ, "LOCALSPEC_CALIBRATION_DIR": calibration_dir} if calibration_dir else None
    prompt = load_suites()["code"]["prompts"][0]
    for mode in ("off", "lookup", "draft", "auto"):
        tick(f"memory: {mode}")
        cmd = [sys.executable, "-m", "localspec", "generate", "--chat", "--json", "--no-pull", "--mode", mode,
               "--max-tokens", "32", "--n-ctx", str(plan.n_ctx), prompt]
        if plan.threads:
            cmd += ["--threads", str(plan.threads)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        if res.returncode == 0:
            out[mode] = json.loads(res.stdout.strip().splitlines()[-1])["peak_rss_mb"]
        else:
            out[mode] = None
    return out


def summarize(runs: list[dict]) -> dict:
    """Per suite and mode: median tokens/s, quartiles, acceptance, the ratio to `off`, and each
    prompt's tokens/s by repeat (`by_prompt`, string keys as in JSON) for the goals' paired ratios."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["suite"], r["mode"]), []).append(r)
    summary: dict[str, dict] = {}
    for (suite, mode), rs in groups.items():
        tps = sorted(r["tps"] for r in rs if r["tps"])
        drafted = sum(r.get("drafted") or 0 for r in rs)
        acc = sum(r.get("accepted") or 0 for r in rs)
        tokens = sum(r.get("tokens") or 0 for r in rs)
        explored = [r["explored"] for r in rs if r.get("explored") is not None]
        q = statistics.quantiles(tps, n=4) if len(tps) >= 2 else [tps[0]] * 3 if tps else [0.0] * 3
        by_prompt: dict[str, dict[str, float]] = {}
        for r in rs:
            by_prompt.setdefault(str(r["prompt"]), {})[str(r["rep"])] = r["tps"]
        summary.setdefault(suite, {})[mode] = {
            "n": len(rs), "median_tps": statistics.median(tps) if tps else 0.0, "p25_tps": q[0], "p75_tps": q[2],
            "acceptance": acc / drafted if drafted else None,
            # Share of the generated tokens that were accepted drafts (P3's "drafts < 10% of its tokens").
            "drafted_share": acc / tokens if tokens else None,
            "explored_per_1k": 1000 * sum(explored) / tokens if explored and tokens else None,
            "mean_ttft_ms": statistics.mean(ttfts)
            if (ttfts := [r["ttft_ms"] for r in rs if r.get("ttft_ms") is not None]) else None,
            "by_prompt": by_prompt,
        }
    # A ratio is the median of paired ratios: each run against `off` on the same prompt in the same
    # repeat (anchors, run once, pair with repeat 0). Prompts differ in speed by ±15%, so a ratio
    # of two medians taken over different prompts is mostly noise at these sample sizes.
    off = {(r["suite"], r["prompt"], r["rep"]): r["tps"] for r in runs if r["mode"] == "off" and r["tps"]}
    for (suite, mode), rs in groups.items():
        m = summary[suite][mode]
        pairs = [r["tps"] / off[k] for r in rs if r["tps"] and (k := (suite, r["prompt"], r["rep"])) in off]
        base = summary[suite].get("off", {}).get("median_tps")
        m["ratio_of_medians"] = m["median_tps"] / base if base else None
        m["ratio_to_off"] = statistics.median(pairs) if pairs else m["ratio_of_medians"]
        m["paired_runs"] = len(pairs)
    return summary


def acceptance_by_position(runs: list[dict]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for mode in sorted({r["mode"] for r in runs}):
        d: list[int] = []  # drafted, then accepted, tokens at each draft position
        a: list[int] = []
        for r in runs:
            if r["mode"] != mode:
                continue
            pairs = zip(r.get("drafted_by_position", []), r.get("accepted_by_position", []), strict=True)
            for i, (x, y) in enumerate(pairs):
                while len(d) <= i:
                    d.append(0)
                    a.append(0)
                d[i] += x
                a[i] += y
        if d:
            out[mode] = [y / x if x else 0.0 for x, y in zip(d, a, strict=True)]
    return out


def machine() -> dict:
    return {
        "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
    }


def goals(summary: dict, ttft: dict | None, memory: dict | None, budget_mb: float | None) -> dict:
    """The issues' bars, computed from this run: #31's P1-P3 (localspec.bench.goals), the TTFT and
    memory bars where those phases ran (`met` None: not measured)."""
    out = bench_goals.goals(summary)
    r = ttft.get("ratio") if ttft else None
    out["P5"] = {"bar": "second-turn TTFT <= 0.25x cold prefill", "value": r, "met": None if r is None else r <= 0.25}
    peak = max((v for v in (memory or {}).values() if v), default=None)
    out["P7"] = {"bar": "peak RSS <= weights + KV + 300 MB", "value": peak, "budget_mb": budget_mb,
                 "met": None if peak is None or budget_mb is None else peak <= budget_mb}
    return out


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
