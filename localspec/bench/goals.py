"""Issue #31's goals (P1, P2, P3), computed from one bench run's summary.

Every figure is a ratio of tokens/s on the same prompt in the same repeat (the modes of one repeat
run interleaved, so machine noise hits both sides alike). A prompt's ratio is the median over its
repeats; a suite's is the median of its prompts' ratios. The issue asks for at least 3 paired
repeats: a goal computed from fewer is marked indicative.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

SERVER_PREFIX = "llama-server:"
MIN_PAIRS = 3
PLAIN_SHARE = 0.10  # llama-server "drafts < 10% of its tokens": its plain decoding, in practice


@dataclass(frozen=True)
class Ratio:
    value: float
    pairs: int  # paired repeats behind the value (the fewest, for a suite)


@dataclass(frozen=True)
class Check:
    """One bar of a goal: `value >= bar`, or information only when there is no bar."""

    what: str
    value: float | None
    bar: float | None
    pairs: int

    @property
    def met(self) -> bool | None:
        if self.value is None or self.bar is None:
            return None
        return self.value >= self.bar

    def to_json(self) -> dict:
        return {"what": self.what, "value": self.value, "bar": self.bar, "pairs": self.pairs, "met": self.met}


def _tps(summary: dict, suite: str, mode: str) -> dict[str, dict[str, float]]:
    return summary.get(suite, {}).get(mode, {}).get("by_prompt", {})


def prompt_ratios(summary: dict, suite: str, mode: str, base: str) -> dict[str, Ratio]:
    """Per prompt: the median over repeats of `mode`'s tokens/s over `base`'s in the same repeat."""
    num, den = _tps(summary, suite, mode), _tps(summary, suite, base)
    out = {}
    for pid, reps in num.items():
        pairs = [t / den[pid][rep] for rep, t in reps.items() if t and den.get(pid, {}).get(rep)]
        if pairs:
            out[pid] = Ratio(statistics.median(pairs), len(pairs))
    return out


def suite_ratio(ratios: dict[str, Ratio]) -> Ratio | None:
    if not ratios:
        return None
    return Ratio(statistics.median(r.value for r in ratios.values()), min(r.pairs for r in ratios.values()))


def suite_checks(suite: str, suite_bar: float | None, prompt_bar: float | None, ratios: dict[str, Ratio],
            label: str = "") -> list[Check]:
    whole = suite_ratio(ratios)
    out = [Check(f"{suite} suite{label}", whole.value if whole else None, suite_bar, whole.pairs if whole else 0)]
    if prompt_bar is not None:
        out += [Check(f"{suite} #{pid}{label}", r.value, prompt_bar, r.pairs) for pid, r in sorted(ratios.items())]
    return out


def goal_result(bar: str, value: object, checks: list[Check], *, wanted_pairs: int = MIN_PAIRS) -> dict:
    """A goal as bench.json records it: met when every check with a bar is (None: none measured);
    indicative when a value stands on fewer than `wanted_pairs` paired repeats."""
    verdicts = [c.met for c in checks if c.bar is not None]
    met = False if False in verdicts else (True if verdicts and all(verdicts) else None)
    pairs = [c.pairs for c in checks if c.value is not None]
    fewest = min(pairs) if pairs else 0
    return {"bar": bar, "value": value, "met": met, "min_pairs": fewest, "wanted_pairs": wanted_pairs,
            "indicative": fewest < wanted_pairs, "checks": [c.to_json() for c in checks]}


def _our_suites(summary: dict) -> list[str]:
    return [s for s, modes in summary.items() if "off" in modes and "auto" in modes and not s.startswith("anchor")]


def p1(summary: dict) -> dict:
    checks: list[Check] = []
    for suite in _our_suites(summary):
        checks += suite_checks(suite, 0.97, 0.95, prompt_ratios(summary, suite, "auto", "off"))
    suites = [c.value for c in checks if c.what.endswith("suite") and c.value is not None]
    return goal_result("auto >= 0.97x off on every suite (median of prompts) and >= 0.95x on every prompt",
                 min(suites, default=None), checks)


def p2(summary: dict) -> dict:
    if "editing" not in _our_suites(summary):
        return goal_result("auto >= 1.5x off on editing (median) and >= 0.9x lookup on each editing prompt", None, [])
    to_off = prompt_ratios(summary, "editing", "auto", "off")
    checks = suite_checks("editing", 1.5, None, to_off)
    checks += [Check(f"editing #{pid} vs lookup", r.value, 0.9, r.pairs)
               for pid, r in sorted(prompt_ratios(summary, "editing", "auto", "lookup").items())]
    return goal_result("auto >= 1.5x off on editing (median) and >= 0.9x lookup on each editing prompt",
                 checks[0].value, checks)


def server_configs(summary: dict, suite: str) -> list[str]:
    return [m for m in summary.get(suite, {}) if m.startswith(SERVER_PREFIX)]


def best_server(summary: dict, suite: str) -> str | None:
    """llama-server's fastest configuration on a suite: the highest median of per-prompt ratios to
    our `off` (the same prompts and repeats), or of tokens/s when `off` did not run."""
    def rank(mode: str) -> float:
        whole = suite_ratio(prompt_ratios(summary, suite, mode, "off"))
        return whole.value if whole else summary[suite][mode].get("median_tps", 0.0)

    configs = server_configs(summary, suite)
    return max(configs, key=rank) if configs else None


def p3(summary: dict) -> dict:
    """Editing: auto >= 1.1x llama-server's best configuration (median) and >= 1.0x on each prompt,
    where each prompt is held against the configuration fastest on that prompt. Other suites: where
    the best configuration drafts (accepted drafts) < 10% of its tokens, auto >= 0.97x of it."""
    checks: list[Check] = []
    value: dict[str, float] = {}
    for suite in summary:
        best = best_server(summary, suite)
        if best is None or "auto" not in summary[suite]:
            continue
        ratios = prompt_ratios(summary, suite, "auto", best)
        whole = suite_ratio(ratios)
        if whole is None:
            continue
        value[suite] = whole.value
        name = best.removeprefix(SERVER_PREFIX)
        if suite == "editing":
            checks.append(Check(f"editing suite vs {name}", whole.value, 1.1, whole.pairs))
            per_config = [prompt_ratios(summary, suite, "auto", m) for m in server_configs(summary, suite)]
            for pid in sorted(ratios):
                # Against the configuration that is best on this prompt: the lowest of auto's ratios.
                worst = min((r[pid] for r in per_config if pid in r), key=lambda r: r.value)
                checks.append(Check(f"editing #{pid} vs its best config", worst.value, 1.0, worst.pairs))
            continue
        share = summary[suite][best].get("drafted_share") or 0.0
        plain = share < PLAIN_SHARE
        label = f"{suite} suite vs {name} (drafts {share:.0%} of its tokens{'' if plain else ': no bar'})"
        checks.append(Check(label, whole.value, 0.97 if plain else None, whole.pairs))
    return goal_result("editing: auto >= 1.1x llama-server's best config (median), >= 1.0x its best on each prompt; "
                 "suites where its best drafts < 10% of its tokens: auto >= 0.97x it", value or None, checks)


def goals(summary: dict) -> dict:
    return {"P1": p1(summary), "P2": p2(summary), "P3": p3(summary)}


def exploration(summary: dict) -> dict[str, float]:
    """auto's explored steps per 1k generated tokens, per suite, where the engine counts them."""
    out = {}
    for suite, modes in summary.items():
        v = modes.get("auto", {}).get("explored_per_1k")
        if v is not None:
            out[suite] = v
    return out


def first_repeat(runs: list[dict]) -> dict[str, dict[str, float]]:
    """Per suite and mode, the median over prompts of repeat 0's ratio to our `off` on the same prompt.

    Repeat 0 is the cold case: ngram-mod's pool (llama-server's, shared by that server's requests)
    and our lookup history (per mode in the bench, as if per client) hold no earlier answer to the
    same prompt yet. Later repeats can copy the earlier answer, so their figures say how fast a
    request asked again runs, not how fast a new one does."""
    off = {(r["suite"], r["prompt"]): r["tps"] for r in runs if r["mode"] == "off" and r["rep"] == 0 and r["tps"]}
    ratios: dict[str, dict[str, list[float]]] = {}
    for r in runs:
        base = off.get((r["suite"], r["prompt"]))
        if r["rep"] == 0 and r["mode"] != "off" and r["tps"] and base:
            ratios.setdefault(r["suite"], {}).setdefault(r["mode"], []).append(r["tps"] / base)
    return {suite: {mode: statistics.median(v) for mode, v in sorted(by_mode.items())}
            for suite, by_mode in ratios.items()}
