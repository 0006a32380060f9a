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

README_START = "<!-- gpu-summary:start -->"
README_END = "<!-- gpu-summary:end -->"
README_AFTER = "<!-- bench-summary:end -->"  # where the lines go the first time
ALL_STEPS = ("sweep", "sweep_long_context", "engine_calibration", "predictions", "engine", "batch_flips",
             "second_target")


@dataclass(frozen=True, kw_only=True)
class RunFacts:
    """What ran: the header of the report and of the README's lines."""

    gpu: str | None  # nvidia-smi's name, None for a CPU rehearsal
    offloaded: bool
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


def facts(run: dict, source: Path) -> RunFacts:
    env = run.get("environment", [])
    cal = run.get("calibration", {})
    models = cal.get("models", {})
    gpu = run.get("gpu") or {}
    return RunFacts(
        gpu=gpu.get("name"), offloaded=bool(cal.get("machine", {}).get("gpu_offload")),
        date=_run_date(env, source), driver=gpu.get("driver"),
        nvcc=next((line.split("release", 1)[1].strip(" ,") for line in env if "compilation tools, release" in line), None),
        prebuilt=next((line.removeprefix("prebuilt: ") for line in env if line.startswith("prebuilt: ")), None),
        libraries=run.get("libraries"),
        llama_cpp_python=cal.get("machine", {}).get("llama_cpp_python", "?"),
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
    sweep = cal.get("sweep", {})
    verify = sweep.get("verify_by_rows", [])
    if not verify:
        return ["No cost was measured (the run stopped before its first sweep)."]
    long_ctx = cal.get("sweep_long_context", {})
    long_verify = long_ctx.get("verify_by_rows", [])
    draft = sweep.get("draft_by_rows", [])
    rows = []
    for n in range(1, len(verify) + 1):
        row = [str(n), _ms(verify[n - 1]), f"{_ratio(verify, n):.2f}"]
        row += [_ms(long_verify[n - 1]), f"{_ratio(long_verify, n):.2f}"] if n <= len(long_verify) else ["-", "-"]
        row.append(_ms(draft[n - 1]) if n <= len(draft) else "-")
        rows.append(row)
    lines = _table(["rows", f"target verify ms (context {sweep.get('context', '?')})", "x 1 row",
                    f"at context {long_ctx.get('context', '?')}", "x 1 row", "draft ms (a catch-up of n rows)"], rows)
    if long_ctx.get("draft_by_rows"):
        lines.append(f"\nThe draft's step at context {long_ctx.get('context', '?')}: {_ms(long_ctx['draft_by_rows'][0])} ms.")
    engine_cal = cal.get("engine_calibration") or {}
    if engine_cal.get("verify"):
        lines.append(f"The engine's own calibration ({engine_cal.get('seconds', '?')} s) measured verify "
                     f"{' '.join(_ms(v) for v in engine_cal['verify'])} ms by rows, a draft step of "
                     f"{_ms(engine_cal['draft_step'])} ms and a catch-up row of {_ms(engine_cal['draft_row'])} ms.")
    return lines


def engine_section(runs: dict) -> list[str]:
    off = runs.get("off", {}).get("tokens_per_s") or 0
    rows = []
    for mode, r in runs.items():
        if "tokens" not in r:
            rows.append([f"`{mode}`", "failed", "-", "-", str(r.get("error"))])
            continue
        speed = r.get("tokens_per_s") or 0
        diff = r.get("first_difference", "-")
        same = "-" if mode == "off" else "yes" if diff is None else f"no, from token {diff}"
        rows.append([f"`{mode}`", f"{speed:.1f}", f"{speed / off:.2f}" if off else "-",
                     f"{r['accepted']}/{r['drafted']}", same + (f" (error: {r['error']})" if r.get("error") else "")])
    return _table(["mode", "tokens/s", "x off", "kept/drafted", "same answer as `off`"], rows)


def flips_section(flips: dict) -> list[str]:
    if "by_rows" not in flips:
        return [f"Not measured: {flips.get('error') or flips.get('skipped') or 'the run stopped before it'}."]
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
        return [f"Not measured: {second.get('error') or second.get('skipped') or 'the run stopped before it'}."]
    verify = second["verify_by_rows"]
    lines = [f"`{second['model']['shape']}` ({second['model']['recipe']}): verify ms by rows 1..{len(verify)}: "
             f"{' '.join(_ms(v) for v in verify)} (9 rows: {_fmt(_ratio(verify, 9))}x one row)."]
    if second.get("verify_by_rows_long_context"):
        lines.append(f"At context 2048: {' '.join(_ms(v) for v in second['verify_by_rows_long_context'])}.")
    runs = second.get("engine", {}).get("runs", {})
    return lines + ([""] + engine_section(runs) if runs else [])


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def predicted_section(preds: dict) -> list[str]:
    note = preds.get("note", "")
    bench = preds.get("bench", {})
    lines = [f"Acceptance from the CPU bench (`{bench.get('command', '?')}`, {bench.get('started', '?')}); costs from the "
             f"sweep above. {note}", ""]
    sweep = preds.get("costs", {}).get("sweep", [])
    if sweep:
        rows = []
        for p in sweep:
            cells = [f"{c['drafter']} k={c['k']}: {c['speedup']:.2f}x" if (c := p.get(lag)) else "-"
                     for lag in ("lag0", "lag1")]
            rows.append([p["suite"], p["mode"], *cells, " ".join(f"{s:.2f}" for s in p["speedup_by_k"])])
        lines += _table(["suite", "CPU bench mode", "auto's choice (lag 0)", "lag 1", "speed-up by k=1..8"], rows)
    else:
        lines.append("No acceptance profile (the run stopped before the predictions, or had no bench JSON).")
    outputs = preds.get("predicted_outputs", {}).get("sweep", [])
    if outputs:
        lines += ["", "Predicted Outputs, the CPU bench's passes re-costed:", ""]
        lines += _table(["suite", "re-costed speed-up", "drafted tokens kept", "best k (ceiling)"],
                        [[e["suite"], f"{e['recosted_speedup']:.2f}x", f"{e['covered']:.0%}",
                          f"{c['speedup']:.2f}x at k={c['k']}" if (c := e.get("ceiling")) else "-"] for e in outputs])
    return lines


def render_report(run: dict, source: Path) -> str:
    f = facts(run, source)
    cal = run.get("calibration", {})
    engine = run.get("engine", {})
    missing = [step for step in ALL_STEPS if step not in run.get("steps_present", [])]
    where = (f"{f.gpu} (driver {f.driver}; nvcc there: {f.nvcc or 'none'})" if f.gpu
             else "no GPU (a CPU rehearsal)")
    lines = [
        "# GPU runs",
        "",
        "Written by `packaging/gpu_report.py` from the run's JSON; how the check works and how to run it:",
        "[packaging/README.md](../../packaging/README.md#gpu-cost-check-offline-gpu-box-nvidia-h200).",
        "",
        f"Latest: [{source.name}]({source.name}), {f.date}, on {where}; llama-cpp-python {f.llama_cpp_python}"
        + (f"; the bundle's prebuilt libraries: {f.prebuilt}" if f.prebuilt else "")
        + (f"; {f.libraries}" if f.libraries else "") + ".",
        f"Models: random weights of the `{f.target}` (target) and `{f.draft}` (draft) shapes, {f.recipe}, with a word "
        "chain so that greedy answers are decided by wide margins (packaging/synth_gguf.py).",
        "Steps measured: " + (", ".join(run.get("steps_present", [])) or "none")
        + (f"; not reached: {', '.join(missing)}" if missing else "; all of them") + ".",
    ]
    if not f.on_gpu:
        lines += ["", "**Not a GPU measurement**: " + ("no GPU was seen" if f.gpu is None else
                  "the libraries did not offload to the GPU") + ". Every figure below is from the CPU."]
    lines += ["", "## Measured" + (" on the GPU" if f.on_gpu else ""), "", "### Verify and draft costs", ""]
    lines += cost_section(cal)
    if engine.get("runs"):
        lines += ["", f"### The engine end to end (greedy, {engine.get('max_tokens', '?')} tokens, one request per mode)", "",
                  "`prediction` sends `off`'s own answer back as the prediction: every drafted token is kept, so its "
                  "row is the engine at 100% acceptance on these kernels.", ""]
        lines += engine_section(engine["runs"])
    lines += ["", "### Batch size and the argmax", ""] + flips_section(engine.get("batch_flips") or {})
    lines += ["", "### The 1.5B target's shape", ""] + second_target_section(engine.get("second_target") or {})
    lines += ["", "## Predicted, not measured: the CPU bench's acceptance on these costs", ""]
    lines += predicted_section(run.get("predictions", {}))
    return "\n".join(lines) + "\n"


def readme_lines(run: dict, source: Path) -> list[str]:
    """The README's few lines on the GPU: measured figures first, then what is predicted."""
    f = facts(run, source)
    verify = run.get("calibration", {}).get("sweep", {}).get("verify_by_rows", [])
    rows = min(9, len(verify))
    lines = [f"Measured on one {f.gpu} on {f.date} with random-weight models of the `{f.target}`/`{f.draft}` shapes "
             f"([docs/gpu/](docs/gpu/README.md), `{source.name}`):"]
    if verify:
        lines.append(f"- a verify of {rows} rows costs {_fmt(_ratio(verify, rows))} single steps; one step "
                     f"{_ms(verify[0])} ms")
    runs = run.get("engine", {}).get("runs", {})
    off = runs.get("off", {}).get("tokens_per_s")
    if off:
        others = [f"`{mode}` {r['tokens_per_s'] / off:.2f}x" for mode, r in runs.items()
                  if mode != "off" and r.get("tokens_per_s")]
        same = all(r.get("first_difference", 0) is None for mode, r in runs.items() if mode != "off")
        lines.append(f"- `off` {off:.1f} tokens/s; {', '.join(others)} (`prediction` at 100% acceptance)"
                     + ("; every mode gave `off`'s answer" if same else "; a mode failed or parted from `off`'s answer"))
    sweep = run.get("predictions", {}).get("costs", {}).get("sweep", [])
    best: dict[str, float] = {}
    for p in sweep:
        if p.get("lag0"):
            best[p["suite"]] = max(best.get(p["suite"], 0.0), p["lag0"]["speedup"])
    if best:
        lines.append("- predicted from the CPU bench's acceptance, `auto`'s speed-up: "
                     + ", ".join(f"{suite} {s:.2f}x" for suite, s in best.items()))
    return lines


def update_readme(text: str, lines: list[str]) -> str:
    """The README with its GPU lines replaced, or put after the bench summary the first time."""
    block = "\n".join([README_START, *lines, README_END])
    if README_START in text and README_END in text:
        head, rest = text.split(README_START, 1)
        return head + block + rest.split(README_END, 1)[1]
    if README_AFTER not in text:
        raise ValueError(f"the README has neither {README_START} nor {README_AFTER} to put the GPU lines after")
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
    f = facts(run, args.run)
    if args.readme and not f.on_gpu:
        print(f"error: {args.run.name} is not a GPU measurement ({'no GPU seen' if f.gpu is None else 'no offload'}); "
              "fix: quote only a run whose libraries offloaded to a GPU", file=sys.stderr)
        return 1
    out = args.out or args.run.parent / "README.md"
    out.write_text(render_report(run, args.run))
    print(f"wrote {out}")
    if args.readme:
        try:
            args.readme.write_text(update_readme(args.readme.read_text(), readme_lines(run, args.run)))
        except (OSError, ValueError) as exc:
            print(f"error: {exc}; fix: add {README_START} and {README_END} where the lines belong", file=sys.stderr)
            return 1
        print(f"updated {args.readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
