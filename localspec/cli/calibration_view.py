"""`localspec doctor --calibration`: the cost curves `auto` works from, their age and origin; reset."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.engine import costs as cost_model
from localspec.engine.costs import Costs

ROWS = (1, 2, 3, 5, 9, 17, 33)
_BARS = " ▁▂▃▄▅▆▇█"


@dataclass(frozen=True)
class CurveFile:
    path: Path
    costs: Costs | None  # None: unreadable (it is ignored and re-measured)


def curve_files(directory: Path) -> list[CurveFile]:
    return [CurveFile(p, cost_model.load(p)) for p in sorted(directory.glob("calibration-*.json"))]


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def _bars(values: list[float]) -> str:
    top = max(values)
    return "".join(_BARS[max(1, round(v / top * (len(_BARS) - 1)))] for v in values)


def describe(f: CurveFile, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    c = f.costs
    if c is None:
        return {"file": str(f.path), "readable": False}
    rows = [n for n in ROWS if n <= max(len(c.shape), 2)]
    return {
        "file": str(f.path), "readable": True, "about": c.about, "obtained": str(c.obtained),
        "age_s": round(now - c.created), "updated_s_ago": round(now - c.updated) if c.updated else None,
        "passes_learned": c.passes, "single_step_ms": round(c.verify_cost(1) * 1000, 1),
        "steps_by_rows": {n: round(c.steps(n), 2) for n in rows},
        "level_ms_by_context": {f"<{2 ** (b + 8)}": round(v * 1000, 1) for b, v in sorted(c.level.items())},
        "draft_step_ms": round(c.draft_step * 1000, 1),
    }


def render(info: dict[str, Any]) -> str:
    if not info["readable"]:
        return f"{info['file']}\n  unreadable: ignored, re-measured at the next load (--reset removes it)"
    steps = info["steps_by_rows"]
    updated = f", learned from {info['passes_learned']} passes"
    if info["updated_s_ago"] is not None:
        updated += f", last {_age(info['updated_s_ago'])} ago"
    lines = [
        info["file"],
        f"  {info['about'] or 'models unknown'}: {info['obtained']} {_age(info['age_s'])} ago{updated}",
        f"  single step {info['single_step_ms']} ms; draft step {info['draft_step_ms']} ms",
        "  verify(n) in single steps: " + "  ".join(f"{n}:{v:g}" for n, v in steps.items())
        + f"   {_bars(list(steps.values()))}",
        "  single step by context: " + "  ".join(f"{k}: {v} ms" for k, v in info["level_ms_by_context"].items()),
    ]
    return "\n".join(lines)
