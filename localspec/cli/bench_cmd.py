"""`localspec bench`: every speculative mode against target-only and the anchors, in one run."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure modes side by side (tokens/s, acceptance, TTFT, RSS)", description=__doc__)
    p.add_argument("--quick", action="store_true", help="a smoke run: a few prompts, 4 modes, no long-context suite (< 5 min)")
    p.add_argument("--out", default="bench-out", help="directory for bench.json, bench.md and bench.png")
    p.add_argument("--threads", type=int, help="llama.cpp threads (also used for the anchors)")
    p.add_argument("--profile", help="model profile")
    p.add_argument("--no-anchors", action="store_true", help="skip llama-cpp-python and llama-server")
    p.add_argument("--no-memory", action="store_true", help="skip the per-mode peak-RSS subprocesses")
    p.add_argument("--suites", help="comma-separated subset of code,chat,editing,long")
    p.add_argument("--repeats", type=int)
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--readme", metavar="PATH", help="rewrite the Performance section of this README from the result")
    p.add_argument("--from-json", metavar="PATH", help="skip measuring: rebuild table, chart and README from a bench.json")
    p.set_defaults(func=run)


README_START = "<!-- bench:start -->"
README_END = "<!-- bench:end -->"


def update_readme(readme: Path, markdown: str) -> None:
    """Replace what stands between the bench markers (generated text only, never hand edits)."""
    text = readme.read_text(encoding="utf-8")
    if README_START not in text or README_END not in text:
        from localspec.errors import ConfigError

        raise ConfigError(f"{readme} has no {README_START} ... {README_END} markers.", "Add them where the table goes.")
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    readme.write_text(f"{head}{README_START}\n{markdown}{README_END}{tail}", encoding="utf-8")


def _publish(result: dict, out: Path, readme: str | None) -> None:
    from localspec.bench import report

    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    md = report.markdown(result)
    (out / "bench.md").write_text(md)
    report.chart(result, out / "bench.png")
    if readme:
        update_readme(Path(readme), md)
    print(md)
    print(f"wrote {out / 'bench.json'}, {out / 'bench.md'}, {out / 'bench.png'}")


def run(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from localspec.bench import anchors, runner
    from localspec.cli.models_cmd import ensure_models
    from localspec.engine.config import EngineConfig
    from localspec.engine.scheduler import Engine
    from localspec.models import ModelManager
    from localspec.models.gguf_info import read_gguf_info
    from localspec.service import calibration_dir

    if args.from_json:
        _publish(json.loads(Path(args.from_json).read_text()), Path(args.out), args.readme)
        return 0
    plan = runner.quick_plan(args.threads) if args.quick else runner.full_plan(args.threads)
    if args.suites:
        plan.suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    if args.repeats:
        plan.repeats = args.repeats
    if args.max_tokens:
        plan.max_tokens = args.max_tokens
    ensure_models(args.profile)
    mm = ModelManager()
    prof = mm.profile(args.profile)
    target, draft = mm.require_path(prof.target), mm.require_path(prof.draft)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    suites = runner.load_suites()
    prompts = [(s, i, t) for s in plan.suites for i, t in enumerate(suites[s]["prompts"][: plan.prompts_per_suite])]
    n_anchor = plan.anchor_prompts_per_suite
    anchor_prompts = [(s, i, t) for s, i, t in prompts if n_anchor is None or i < n_anchor]
    server_bin = None if args.no_anchors else anchors.find_llama_server()
    total = len(prompts) * len(plan.modes) * plan.repeats + 1
    if not args.no_anchors:
        total += len(anchor_prompts) + (len(prompts) * (1 + len(plan.llama_server_configs)) if server_bin else 0)
    if not args.no_memory:
        total += 4

    result: dict = {
        "schema": runner.SCHEMA_VERSION, "started": runner.now(), "machine": runner.machine(),
        "command": "localspec " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else "localspec bench",
        "plan": {"suites": plan.suites, "modes": [m.name for m in plan.modes], "prompts_per_suite": plan.prompts_per_suite,
                 "repeats": plan.repeats, "max_tokens": plan.max_tokens, "n_ctx": plan.n_ctx, "threads": plan.threads,
                 "quick": plan.quick, "anchor_prompts_per_suite": plan.anchor_prompts_per_suite,
                 "ttft_chars": plan.ttft_chars},
        "models": {"target": str(target), "draft": str(draft)},
        "llama_server": server_bin,
    }
    with Progress(TextColumn("{task.description:<42}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as bar:
        task = bar.add_task("loading models", total=total)

        def tick(label: str) -> None:
            bar.update(task, advance=1, description=label[:42])

        def checkpoint(runs: list[dict]) -> None:
            # An hour of measurements must survive a later phase failing: keep what is done.
            (out / "runs.partial.json").write_text(json.dumps({**result, "runs": runs}))

        engine = Engine.load(str(target), str(draft),
                             EngineConfig(n_ctx=plan.n_ctx, n_threads=plan.threads, mode="auto"),
                             calibration_dir=calibration_dir())
        template = engine.target.chat_template
        try:
            result["calibration"] = engine.costs.to_json() if engine.costs else None
            runs = runner.run_modes(engine, plan, tick)
            checkpoint(runs)
            result["ttft"] = runner.second_turn_ttft(engine, tick, plan.ttft_chars)
        finally:
            engine.close()
        if not args.no_anchors:
            runs += anchors.llama_cpp_python_lookup(target, anchor_prompts, plan.max_tokens, plan.n_ctx, plan.threads, template, tick)
            checkpoint(runs)
            if server_bin:
                runs += anchors.llama_server(server_bin, target, draft, plan.llama_server_configs, prompts,
                                             plan.max_tokens, plan.n_ctx, plan.threads, template, tick)
        if not args.no_memory:
            result["memory"] = runner.memory_by_mode(plan, tick)
    t_info, d_info = read_gguf_info(target), read_gguf_info(draft)
    weights_mb = (target.stat().st_size + draft.stat().st_size) / 2**20
    # Every KV cell the engines allocate: a slot's context on both models, and the target's cells for
    # a pinned prompt prefix (EngineConfig.pinned_prefix_cells).
    pinned = EngineConfig().pinned_prefix_cells
    kv_mb = (t_info.kv_bytes_per_token() * (plan.n_ctx + pinned) + d_info.kv_bytes_per_token() * plan.n_ctx) / 2**20
    result.update(weights_mb=round(weights_mb, 1), kv_mb=round(kv_mb, 1), memory_budget_mb=round(weights_mb + kv_mb + 300, 1))
    result["runs"] = [r for r in runs if r.get("suite") != "error"]
    result["anchor_errors"] = [r for r in runs if r.get("suite") == "error"]
    result["summary"] = runner.summarize(result["runs"])
    result["acceptance_by_position"] = runner.acceptance_by_position([r for r in runs if r.get("engine") == "localspec"])
    result["goals"] = runner.goals(result["summary"], result.get("ttft"), result.get("memory"), result["memory_budget_mb"])
    result["finished"] = runner.now()
    _publish(result, out, args.readme)
    return 0
