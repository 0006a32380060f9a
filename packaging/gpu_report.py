"""Write docs/gpu/README.md, and the README's GPU lines, from a collected GPU run (issue #30).

    python packaging/gpu_report.py docs/gpu/h200-2026-12-07.json                    # -> docs/gpu/README.md
    python packaging/gpu_report.py docs/gpu/h200-2026-12-07.json --readme README.md # and the README's lines

The input is gpu_collect.py's JSON. The report keeps two kinds of figure apart: what the GPU
measured (verify and draft costs, the engine's tokens/s in each mode, batch-size argmax flips) and
what is predicted from them with the acceptance measured on the CPU bench (the `auto` controller's
choices and speed-ups per suite, Predicted Outputs re-costed). A run whose libraries did not
offload, or that names no GPU, is a rehearsal: it gets a report that says so and never the README.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_check import LONG_CONTEXT, offload_line, same_as_off  # noqa: E402  (next to this file)
from gpu_collect import STEPS  # noqa: E402

README_START = "<!-- gpu-summary:start -->"
README_END = "<!-- gpu-summary:end -->"
README_AFTER = "<!-- bench-summary:end -->"  # where the lines go the first time
ALL_STEPS = tuple(STEPS)  # what gpu_collect looks for, in the order the check measures


@dataclass(frozen=True, kw_only=True)
class RunFacts:
    """What ran: the header of the report and of the README's lines."""

    gpu: str | None  # nvidia-smi's name, None for a CPU rehearsal
    offloaded: bool  # the libraries offload and the check asked for layers on the GPU
    word_chain: bool
    date: str
    driver: str | None
    nvcc: str | None
    prebuilt: str | None
    libraries: str | None  # prebuilt and offloaded, or built there (gpu_collect.libraries_used)
    llama_cpp_python: str
    target: str
    draft: str
    recipe: str

    @property
    def on_gpu(self) -> bool:
        return self.gpu is not None and self.offloaded


def _part(run: dict, name: str) -> dict:
    """One part of the run, {} when it is missing or null (a run cut short)."""
    value = run.get(name)
    return value if isinstance(value, dict) else {}


def facts(run: dict, source: Path) -> RunFacts:
    env = run.get("environment") or []
    cal = _part(run, "calibration")
    machine = _part(cal, "machine")
    models = _part(cal, "models")
    gpu = _part(run, "gpu")
    return RunFacts(
        gpu=gpu.get("name"), offloaded=bool(machine.get("gpu_offload")) and machine.get("n_gpu_layers", -1) != 0,
        word_chain=bool(cal.get("word_chain")),
        date=_run_date(env, source), driver=gpu.get("driver"),
        nvcc=next((line.split("release", 1)[1].strip(" ,") for line in env if "compilation tools, release" in line), None),
        prebuilt=next((line.removeprefix("prebuilt: ") for line in env if line.startswith("prebuilt: ")), None),
        libraries=run.get("libraries"),
        llama_cpp_python=machine.get("llama_cpp_python", "?"),
        target=models.get("target", {}).get("shape", "?"), draft=models.get("draft", {}).get("shape", "?"),
        recipe=models.get("target", {}).get("recipe", "?"))


def _run_date(environment: list[str], source: Path) -> str:
    """The day the check ran: environment.txt starts with `date`'s line; else the file's name."""
    if environment:
        try:
            return datetime.strptime(" ".join(environment[0].split()), "%a %b %d %H:%M:%S %Z %Y").date().isoformat()
        except ValueError:
            pass
    match = re.search(r"\d{4}-\d{2}-\d{2}", source.name)
    return match.group(0) if match else "undated"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def _ratio(values: list[float], rows: int) -> float | None:
    """verify(rows) / verify(1): how many single steps a batch of `rows` costs."""
    return values[rows - 1] / values[0] if len(values) >= rows and values[0] > 0 else None


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows)]


def cost_section(cal: dict) -> list[str]:
    sweep = _part(cal, "sweep")
    verify = sweep.get("verify_by_rows") or []
    if not verify:
        return ["No cost was measured (the run stopped before its first sweep)."]
    long_ctx = _part(cal, "sweep_long_context")
    long_verify = long_ctx.get("verify_by_rows") or []
    draft = sweep.get("draft_by_rows") or []
    rows = []
    for n in range(1, len(verify) + 1):
        row = [str(n), _ms(verify[n - 1]), _fmt(_ratio(verify, n))]
        row += [_ms(long_verify[n - 1]), _fmt(_ratio(long_verify, n))] if n <= len(long_verify) else ["-", "-"]
        row.append(_ms(draft[n - 1]) if n <= len(draft) else "-")
        rows.append(row)
    lines = _table(["rows", f"target verify ms (context {sweep.get('context', '?')})", "x 1 row",
                    f"at context {long_ctx.get('context', '?')}", "x 1 row", "draft ms (a catch-up of n rows)"], rows)
    if long_ctx.get("draft_by_rows"):
        lines.append(f"\nThe draft's step at context {long_ctx.get('context', '?')}: {_ms(long_ctx['draft_by_rows'][0])} ms.")
    engine_cal = _part(cal, "engine_calibration")
    if engine_cal.get("verify"):
        lines.append(f"The engine's own calibration ({engine_cal.get('seconds', '?')} s) measured verify "
                     f"{' '.join(_ms(v) for v in engine_cal['verify'])} ms by rows, a draft step of "
                     f"{_ms(engine_cal['draft_step'])} ms and a catch-up row of {_ms(engine_cal['draft_row'])} ms.")
    return lines


def offload_section(offload: dict) -> str:
    """engine.offload's plan for these models on the free VRAM read before the load, and what the load took."""
    if not offload:
        return "Not measured: a run from before the check planned the split."
    line = offload_line(offload)
    return line[0].upper() + line[1:] + "."


def engine_section(runs: dict) -> list[str]:
    off = _part(runs, "off").get("tokens_per_s")
    rows = []
    for mode, r in runs.items():
        r = r if isinstance(r, dict) else {}
        if "tokens" not in r:
            rows.append([f"`{mode}`", "-", "-", "-", f"failed: {r.get('error')}"])
            continue
        speed = r.get("tokens_per_s")
        same = {"yes": "yes", "-": "-"}.get(verdict := same_as_off(mode, r), f"no, {verdict}")
        rows.append([f"`{mode}`", f"{speed:.1f}" if speed else "-", f"{speed / off:.2f}" if speed and off else "-",
                     f"{r.get('accepted')}/{r.get('drafted')}",
                     same + (f" (error: {r['error']})" if r.get("error") else "")])
    return _table(["mode", "tokens/s", "x off", "kept/drafted", "same answer as `off`"], rows)


def _stop_reason(part: dict) -> str | None:
    """Why gpu_check.py stopped a part (its `error` or `skipped`), or None."""
    if part.get("error"):
        return f"failed: {part['error']}"
    return f"skipped: {part['skipped']}" if part.get("skipped") else None


def _not_measured(part: dict) -> str:
    return f"Not measured: {_stop_reason(part) or 'the run stopped before it'}."


def _failure(part: dict) -> list[str]:
    """A part that measured something and then stopped says why."""
    reason = _stop_reason(part)
    return [f"Then it {reason}."] if reason else []


def flips_section(flips: dict) -> list[str]:
    if "by_rows" not in flips:
        return [_not_measured(flips)]
    lead = flips["one_row_lead_under"]
    margin = flips["tie_margin"]
    lines = [f"{flips['rows']} rows after {flips['context']} tokens, each read one row a pass and in passes of n rows; "
             f"the one-row pass put its top two closer than 0.1 in {lead['0.1']} rows and closer than the engine's "
             f"tie margin ({margin}) in {lead[str(margin)]}: far more near-ties than real weights give, so the flips "
             "are an upper bound.", ""]
    rows = [[size, str(f["flips"]), str(f["within_margin"]), " ".join(str(g) for g in f["gaps"][:8]) or "-",
             str(f["max_abs_logit_diff"])] for size, f in flips["by_rows"].items()]
    return lines + _table(["pass of n rows", "argmax flips", "within the margin", "gaps", "largest logit difference"],
                          rows)


def second_target_section(second: dict) -> list[str]:
    if not second.get("verify_by_rows"):
        return [_not_measured(second)]
    verify = second["verify_by_rows"]
    model = _part(second, "model")
    lines = [f"`{model.get('shape', '?')}` ({model.get('recipe', '?')}): verify ms by rows 1..{len(verify)}: "
             f"{' '.join(_ms(v) for v in verify)} (9 rows: {_fmt(_ratio(verify, 9))}x one row)."]
    if second.get("verify_by_rows_long_context"):
        lines.append(f"At context {LONG_CONTEXT}: {' '.join(_ms(v) for v in second['verify_by_rows_long_context'])}.")
    runs = _part(_part(second, "engine"), "runs")
    return lines + ([""] + engine_section(runs) if runs else []) + _failure(second)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def predicted_section(preds: dict) -> list[str]:
    if not preds:
        return ["Nothing predicted: the run stopped before the predictions."]
    bench = _part(preds, "bench")
    lines = [(f"Acceptance from the CPU bench (`{bench.get('command', '?')}`, {bench.get('started', '?')}); costs from "
              f"the sweep above. {preds.get('note', '')}") if bench else "No bench JSON was given: no acceptance profile.", ""]
    sweep = _part(preds, "costs").get("sweep") or []
    if sweep:
        rows = []
        for p in sweep:
            cells = [f"{c['drafter']} k={c['k']}: {c['speedup']:.2f}x" if (c := p.get(lag)) else "-"
                     for lag in ("lag0", "lag1")]
            rows.append([p["suite"], p["mode"], *cells, " ".join(f"{s:.2f}" for s in p["speedup_by_k"])])
        lines += _table(["suite", "CPU bench mode", "auto's choice (lag 0)", "lag 1", "speed-up by k=1..8"], rows)
    elif bench:
        lines.append("No acceptance profile in the bench JSON.")
    outputs = _part(preds, "predicted_outputs").get("sweep") or []
    if outputs:
        lines += ["", "Predicted Outputs, the CPU bench's passes re-costed:", ""]
        lines += _table(["suite", "re-costed speed-up", "drafted tokens kept", "best k (ceiling)"],
                        [[e["suite"], f"{e['recosted_speedup']:.2f}x",
                          f"{e['covered']:.0%}" if e.get("covered") is not None else "-",
                          f"{c['speedup']:.2f}x at k={c['k']}" if (c := e.get("ceiling")) else "-"] for e in outputs])
    return lines


def render_report(run: dict, source: Path) -> str:
    f = facts(run, source)
    cal = _part(run, "calibration")
    engine = _part(run, "engine")
    reached = run.get("steps_present") or []
    missing = [step for step in ALL_STEPS if step not in reached]
    unreadable = _part(run, "unreadable")
    where = f"{f.gpu} (driver {f.driver}; nvcc there: {f.nvcc or 'none'})" if f.gpu else "no GPU (a CPU rehearsal)"
    weights = ("with a word chain so that greedy answers are decided by wide margins (packaging/synth_gguf.py)"
               if f.word_chain else "all random (`--flat`: flat logits, answers part on near-ties)")
    lines = [
        "# GPU runs",
        "",
        "Written by `packaging/gpu_report.py` from the run's JSON; how the check works and how to run it:",
        "[packaging/README.md](../../packaging/README.md#gpu-cost-check-offline-gpu-box-nvidia-h200).",
        "",
        f"Latest: [{source.name}]({source.name}), {f.date}, on {where}; llama-cpp-python {f.llama_cpp_python}"
        + (f"; the bundle's prebuilt libraries: {f.prebuilt}" if f.prebuilt else "")
        + (f"; {f.libraries}" if f.libraries else "") + ".",
        f"Models: random weights of the `{f.target}` (target) and `{f.draft}` (draft) shapes, {f.recipe}, {weights}.",
        "Steps reached: " + (", ".join(reached) or "none")
        + (f"; not reached: {', '.join(missing)}" if missing else "; all of them") + ".",
    ]
    if unreadable:
        lines.append("Unreadable (cut off mid-write): " + "; ".join(f"{k}: {v}" for k, v in unreadable.items()) + ".")
    if not f.on_gpu:
        lines += ["", "**Not a GPU measurement**: " + ("no GPU was seen" if f.gpu is None else
                  "the libraries did not offload to the GPU") + ". Every figure below is from the CPU."]
    lines += ["", "## Measured" + (" on the GPU" if f.on_gpu else ""), "", "### Verify and draft costs", ""]
    lines += cost_section(cal)
    lines += ["", "### The product's GPU split", "", offload_section(_part(cal, "offload"))]
    lines += ["", f"### The engine end to end (greedy, {engine.get('max_tokens', '?')} tokens, one request per mode)", ""]
    runs = _part(engine, "runs")
    if runs:
        lines += ["`prediction` sends `off`'s own answer back as the prediction: every drafted token is kept, so its "
                  "row is the engine at 100% acceptance on these kernels.", ""]
        lines += engine_section(runs) + _failure(engine)
    else:
        lines.append(_not_measured(engine))
    lines += ["", "### Batch size and the argmax", ""] + flips_section(_part(engine, "batch_flips"))
    lines += ["", "### The 1.5B target's shape", ""] + second_target_section(_part(engine, "second_target"))
    lines += ["", "## Predicted, not measured: the CPU bench's acceptance on these costs", ""]
    lines += predicted_section(_part(run, "predictions"))
    return "\n".join(lines) + "\n"


def readme_lines(run: dict, source: Path) -> list[str]:
    """The README's few lines on the GPU: what was measured, then (marked) what is predicted."""
    f = facts(run, source)
    verify = _part(_part(run, "calibration"), "sweep").get("verify_by_rows") or []
    rows = min(9, len(verify))
    lines = [f"On one {f.gpu}, {f.date}, with random-weight models of the `{f.target}`/`{f.draft}` shapes "
             f"([docs/gpu/](docs/gpu/README.md), `{source.name}`):"]
    if verify:
        lines.append(f"- measured: a verify of {rows} rows costs {_fmt(_ratio(verify, rows))} single steps; one step "
                     f"{_ms(verify[0])} ms")
    runs = _part(_part(run, "engine"), "runs")
    off = _part(runs, "off").get("tokens_per_s")
    if off:
        others = [f"`{mode}` " + (f"{r['tokens_per_s'] / off:.2f}x" if r.get("tokens_per_s") else "failed")
                  for mode, r in runs.items() if mode != "off"]
        same = all(same_as_off(mode, r) == "yes" for mode, r in runs.items() if mode != "off")
        lines.append(f"- measured: `off` {off:.1f} tokens/s; {', '.join(others)} (`prediction` at 100% acceptance)"
                     + ("; every mode gave `off`'s answer" if same else "; a mode failed or parted from `off`'s answer"))
    best: dict[str, float] = {}
    for p in _part(_part(run, "predictions"), "costs").get("sweep") or []:
        if p.get("lag0"):
            best[p["suite"]] = max(best.get(p["suite"], 0.0), p["lag0"]["speedup"])
    if best:
        lines.append("- predicted from the CPU bench's acceptance on these costs, `auto`'s best speed-up per suite "
                     "(lag 0): " + ", ".join(f"{suite} {s:.2f}x" for suite, s in best.items()))
    return lines


def update_readme(text: str, lines: list[str]) -> str:
    """The README with its GPU lines replaced, or put after the bench summary the first time. Markers
    that are not one pair in order are refused: replacing between them could eat other text."""
    block = "\n".join([README_START, *lines, README_END])
    starts, ends = text.count(README_START), text.count(README_END)
    if starts == ends == 1 and text.index(README_START) < text.index(README_END):
        head, rest = text.split(README_START, 1)
        return head + block + rest.split(README_END, 1)[1]
    if starts or ends:
        raise ValueError(f"the README has {starts} {README_START} and {ends} {README_END} (one of each, in that "
                         "order, or neither)")
    if text.count(README_AFTER) != 1:
        raise ValueError(f"the README has no single {README_AFTER} to put the GPU lines after")
    head, rest = text.split(README_AFTER, 1)
    return head + README_AFTER + "\n\n" + block + rest


def main(argv: list[str] | None = None) -> int:
    import json

    ap = argparse.ArgumentParser(description="Write docs/gpu/README.md (and the README's GPU lines) from a collected run.")
    ap.add_argument("run", type=Path, help="gpu_collect.py's JSON, e.g. docs/gpu/h200-2026-12-07.json")
    ap.add_argument("--out", type=Path, help="the report (default: README.md beside the run's JSON)")
    ap.add_argument("--readme", type=Path, help="also put the GPU lines into this README (a GPU run only)")
    args = ap.parse_args(argv)
    try:
        run = json.loads(args.run.read_text())
    except (OSError, ValueError) as exc:
        print(f"error: cannot read {args.run} ({exc}); fix: give the JSON gpu_collect.py wrote", file=sys.stderr)
        return 2
    if not isinstance(run, dict) or "steps_present" not in run:
        print(f"error: {args.run} is not a collected run (no steps_present); fix: run packaging/gpu_collect.py first",
              file=sys.stderr)
        return 2
    try:
        f = facts(run, args.run)
        report = render_report(run, args.run)
        lines = readme_lines(run, args.run) if args.readme else []
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        print(f"error: {args.run} is malformed ({type(exc).__name__}: {exc}); fix: collect it again with "
              "packaging/gpu_collect.py", file=sys.stderr)
        return 2
    if args.readme and not f.on_gpu:
        print(f"error: {args.run.name} is not a GPU measurement ({'no GPU seen' if f.gpu is None else 'no offload'}); "
              "fix: quote only a run whose libraries offloaded to a GPU", file=sys.stderr)
        return 1
    if args.readme and "sweep" not in run["steps_present"]:
        print(f"error: {args.run.name} stopped before its first sweep: no cost to quote; fix: write the report "
              "without --readme, fix what stopped it (check.log) and run the check again", file=sys.stderr)
        return 1
    out = args.out or args.run.parent / "README.md"
    out.write_text(report)
    print(f"wrote {out}")
    if args.readme:
        try:
            args.readme.write_text(update_readme(args.readme.read_text(), lines))
        except (OSError, ValueError) as exc:
            print(f"error: {exc}; fix: leave one {README_START} ... {README_END} pair where the lines belong",
                  file=sys.stderr)
            return 1
        print(f"updated {args.readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
