"""Bench output: a markdown table and a PNG chart, both read from the bench JSON."""

from __future__ import annotations

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
    modes = sorted({m for s in summary.values() for m in s}, key=lambda m: (m != "off", m.startswith(("llama", "anchor")), m))
    lines = [
        f"Machine: {result['machine'].get('processor')} · {result['machine'].get('cpus')} CPUs · "
        f"{result['machine'].get('memory_gb')} GB · {result['machine'].get('platform')}",
        f"Command: `{result['command']}`",
        "",
        "tokens/s (median; in brackets, the median of per-run ratios to our target-only `off` on the same prompt and repeat):",
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
    lines += ["", "Goals:", ""]
    for name, g in result["goals"].items():
        value = g.get("value")
        if isinstance(value, float):
            value = f"{value:.3f}"
        lines.append(f"- {name}: {g['bar']}: {value} → {'met' if g['met'] else 'not met'}")
    if result.get("ttft"):
        t = result["ttft"]
        lines.append(
            f"- prefix reuse: cold TTFT {t['cold_ttft_ms']:.0f} ms ({t['cold_prompt_tokens']} tokens), "
            f"second turn {t['second_turn_ttft_ms']:.0f} ms ({t['second_turn_reused_tokens']} reused)"
        )
    if result.get("memory"):
        lines.append(f"- peak RSS by mode (MB): {result['memory']}; budget {result.get('memory_budget_mb')}")
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
    colours = plt.get_cmap("tab20").colors
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
