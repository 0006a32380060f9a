"""Bench output, all read from the bench JSON: the full markdown tables (docs/performance.md), the
README's short summary, and a PNG chart."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REQUIRED_KEYS = ("schema", "machine", "command", "plan", "runs", "summary", "acceptance_by_position", "goals")


def check_schema(result: dict) -> None:
    """What the report needs; the tests check bench output against this."""
    missing = [k for k in REQUIRED_KEYS if k not in result]
    if missing:
        raise ValueError(f"bench JSON lacks {missing}")
    for suite, modes in result["summary"].items():
        for mode, m in modes.items():
            for key in ("median_tps", "p25_tps", "p75_tps", "ratio_to_off", "n"):
                if key not in m:
                    raise ValueError(f"summary[{suite}][{mode}] lacks {key}")


def markdown(result: dict) -> str:
    check_schema(result)
    summary = result["summary"]
    modes = sorted({m for s in summary.values() for m in s},
                   key=lambda m: (m != "off", m.startswith(("llama", "anchor")), m))
    lines = [
        *head_lines(result),
        "",
        "tokens/s (median; in brackets, the median of per-run ratios to our target-only `off` on the same prompt "
        "and repeat):",
        "",
        "| suite | " + " | ".join(modes) + " |",
        "|---|" + "---|" * len(modes),
    ]
    for suite, by_mode in summary.items():
        cells = []
        for mode in modes:
            m = by_mode.get(mode)
            if not m:
                cells.append("–")
                continue
            ratio = f" ({m['ratio_to_off']:.2f}x)" if m.get("ratio_to_off") else ""
            acc = f", acc {m['acceptance']:.0%}" if m.get("acceptance") is not None else ""
            cells.append(f"{m['median_tps']:.1f}{ratio}{acc}")
        lines.append(f"| {suite} | " + " | ".join(cells) + " |")
    lines += goal_lines(result["goals"])
    if result.get("exploration"):
        per_suite = ", ".join(f"{s} {v:.1f}" for s, v in result["exploration"].items())
        lines.append(f"- auto's explored steps per 1k tokens: {per_suite}")
    for suite, by_mode in (result.get("first_repeat") or {}).items():
        ratios = ", ".join(f"{mode} {v:.2f}x" for mode, v in by_mode.items())
        lines.append(f"- first repeat only, {suite} (no earlier answer to copy; ratio to `off`): {ratios}")
    if result.get("ttft"):
        t = result["ttft"]
        lines.append(
            f"- prefix reuse: cold TTFT {t['cold_ttft_ms']:.0f} ms ({t['cold_prompt_tokens']} tokens), "
            f"second turn {t['second_turn_ttft_ms']:.0f} ms ({t['second_turn_reused_tokens']} reused)"
        )
    if result.get("memory"):
        lines.append(f"- peak RSS by mode (MB): {result['memory']}; budget {result.get('memory_budget_mb')}")
    return "\n".join(lines) + "\n"


def head_lines(result: dict) -> list[str]:
    """The machine, the command and, for a noisy run, what ran beside the engine."""
    m = result["machine"]
    return [f"Machine: {m.get('processor')} · {m.get('cpus')} CPUs · {m.get('memory_gb')} GB · {m.get('platform')}",
            f"Command: `{result['command']}`", *_noisy_lines(result.get("noisy"))]


def goal_lines(goals: dict) -> list[str]:
    """Each goal's bar, value and verdict, then every check of every goal in one table."""
    lines = ["", "Goals:", ""]
    for name, g in goals.items():
        indicative = g.get("indicative") and g.get("checks")
        note = f" (fewer than {g.get('wanted_pairs', 3)} paired repeats: indicative)" if indicative else ""
        lines.append(f"- {name}: {g['bar']}: {_goal_value(g.get('value'))} → {verdict(g['met'])}{note}")
    checks = [(name, c) for name, g in goals.items() for c in g.get("checks", [])]
    if checks:
        lines += ["", "| goal | check | value | bar | paired repeats | |", "|---|---|---|---|---|---|"]
        for name, c in checks:
            bar = f">= {c['bar']:.2f}x" if c.get("bar") is not None else "–"
            value = f"{c['value']:.3f}x" if c.get("value") is not None else "–"
            lines.append(f"| {name} | {c['what']} | {value} | {bar} | {c['pairs']} | {verdict(c['met'])} |")
        lines.append("")
    return lines


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table's lines."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def verdict(met: bool | None) -> str:
    return "not measured" if met is None else "met" if met else "not met"


def _noisy_lines(noisy: dict | None) -> list[str]:
    """What a --noisy run ran beside the engine, and the hog's own CPU time as evidence it ran."""
    if not noisy:
        return []
    line = f"Noisy run: a CPU hog beside the engine, {noisy['schedule']['description']}; {noisy.get('calibration')}"
    usage = noisy.get("usage")
    if usage:
        line += f"; the hog used {usage['cpu_s']} CPU-s over {usage['wall_s']} s"
    return [line + "."]


def _goal_value(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, dict):  # per suite (P3)
        return ", ".join(f"{k} {_goal_value(v)}" for k, v in value.items())
    return str(value)


@dataclass(frozen=True)
class Markers:
    """The comment lines that fence a generated section inside a hand-written markdown file."""

    start: str
    end: str

    def replace(self, text: str, body: str) -> str | None:
        """`text` with what stands between the markers replaced by `body`; None if a marker is missing."""
        if self.start not in text or self.end not in text.split(self.start, 1)[1]:
            return None
        head, rest = text.split(self.start, 1)
        _, tail = rest.split(self.end, 1)
        return f"{head}{self.start}\n{body.rstrip()}\n{self.end}{tail}"


# docs/performance.md holds the full tables; README.md a summary that links to them.
TABLES = Markers("<!-- bench:start -->", "<!-- bench:end -->")
SUMMARY = Markers("<!-- bench-summary:start -->", "<!-- bench-summary:end -->")
SUMMARY_MAX_LINES = 10
SUMMARY_MAX_SUITES = SUMMARY_MAX_LINES - 3  # a head line, the goals line and the link line


def _best_anchor(by_mode: dict) -> tuple[str, float] | None:
    """llama-server's fastest configuration on a suite, as (name, ratio to our `off`)."""
    rated = [(m.split(":", 1)[1], v["ratio_to_off"]) for m, v in by_mode.items()
             if m.startswith("llama-server:") and v.get("ratio_to_off")]
    return max(rated, key=lambda r: r[1]) if rated else None


def _suite_line(suite: str, by_mode: dict) -> str:
    parts = [f"- {suite}:"]
    if "off" in by_mode:
        parts.append(f"`off` {by_mode['off']['median_tps']:.1f} tok/s,")
    auto = by_mode.get("auto", {}).get("ratio_to_off")
    parts.append(f"`auto` {auto:.2f}x" if auto else "`auto` not run")
    best = _best_anchor(by_mode)
    if best:
        parts.append(f"(llama-server's best: {best[1]:.2f}x, {best[0]})")
    return " ".join(parts)


def summary(result: dict, page: str = "docs/performance.md") -> str:
    """At most SUMMARY_MAX_LINES lines for the README: per suite, our target alone and `auto`; the goals."""
    check_schema(result)
    machine = result["machine"]
    suites = list(result["summary"].items())
    lines = [
        f"Latest run: `{result['command']}` on {machine.get('processor')} · {machine.get('cpus')} CPUs · "
        f"{machine.get('memory_gb')} GB. Tokens/s of the target alone (`off`); other modes as the median of "
        "per-prompt ratios to it:",
        *(_suite_line(s, m) for s, m in suites[:SUMMARY_MAX_SUITES]),
    ]
    if len(suites) > SUMMARY_MAX_SUITES:
        lines[-1] += f" (and {len(suites) - SUMMARY_MAX_SUITES} more suites)"
    goals = ", ".join(f"{name} {verdict(g['met'])}" for name, g in result["goals"].items())
    # Bullets, not lines of text: a plain line after a list would join its last item.
    lines += [f"- goals: {goals or 'none recorded'}",
              f"- every mode, acceptance, the goals' bars and values, machine and command: [{page}]({page})"]
    return "\n".join(lines) + "\n"


def chart(result: dict, path: Path) -> Path:
    """Tokens/s by mode and suite, and acceptance by draft position."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = result["summary"]
    suites = list(summary)
    found = {m for s in summary.values() for m in s}
    # Ours first (off, then auto), anchors after; 15 bars need more than the default 10 colours.
    modes = sorted(found, key=lambda m: (":" in m, m != "off", m != "auto", m))
    cmap = plt.get_cmap("tab20")
    colours = [cmap(i) for i in range(cmap.N)]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5.6), gridspec_kw={"width_ratios": [1.6, 1]})
    width = 0.8 / max(len(modes), 1)
    for i, mode in enumerate(modes):
        xs = [j + i * width for j in range(len(suites))]
        ys = [summary[s].get(mode, {}).get("median_tps", 0.0) for s in suites]
        ax1.bar(xs, ys, width, label=mode, color=colours[i % len(colours)], hatch="//" if ":" in mode else None,
                edgecolor="white", linewidth=0.3)
    ax1.set_xticks([j + 0.4 - width / 2 for j in range(len(suites))], suites)
    ax1.set_ylabel("tokens/s (median)")
    ax1.set_title("Decode speed by mode and suite (hatched: anchors)")
    ax1.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.08), frameon=False)
    for mode, rates in result["acceptance_by_position"].items():
        ax2.plot(range(1, len(rates) + 1), rates, marker="o", label=mode)
    ax2.set_xlabel("draft position")
    ax2.set_ylabel("acceptance (conditional on reaching it)")
    ax2.set_ylim(0, 1.05)
    ax2.set_title("Acceptance by draft position")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
