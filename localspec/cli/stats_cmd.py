"""`localspec stats`: what the metrics log says about a period: summary, breakdowns, spend,
drift against the baseline, plots over time, and raw export."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
import time
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from localspec.cli.options import add_deprecated_option
from localspec.cli.output import print_json, print_table, writing_file
from localspec.errors import LocalspecError, UsageError

if TYPE_CHECKING:  # the metrics package (numpy, prometheus) loads when the verb runs
    from rich.console import JustifyMethod
    from rich.table import Table

    from localspec.metrics import MetricsSettings, Summary

_GROUPS = ("model", "mode", "route", "face", "day")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stats", help="summarise logged requests: speed, acceptance, cache, spend, drift",
                       description=__doc__)
    p.add_argument("--since", default="7d", help="start of the period: 7d, 24h, 30m, 2w or an ISO date (default 7d)")
    p.add_argument("--until", help="end of the period (default now), same forms as --since")
    p.add_argument("--by", choices=_GROUPS, help="one summary row per model, mode, route, face or day")
    p.add_argument("--drift", action="store_true",
                   help="compare the recent window with the baseline before it (windows and limits: "
                        "[metrics.drift] in settings.toml)")
    p.add_argument("--plot", action="store_true", help="plot tokens/s, acceptance and cache hit rate over time")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the summary (and --drift) as one JSON object")
    out.add_argument("--export", choices=("csv", "json"), help="write the period's raw request rows")
    p.add_argument("-o", "--out", type=Path, help="file for --export (default standard output)")
    add_deprecated_option(p, "--output", dest="out", replacement="--out", type=Path)
    p.add_argument("--db", type=Path, help="metrics database (default: metrics.sqlite in the data dir)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from localspec.metrics import default_db_path, drift_report, fetch_rows, group_rows, load_metrics_settings, \
        open_reader, summarize

    if args.json and args.plot:
        raise UsageError("--plot draws charts and --json prints data: not both.", "Drop one of them.")
    db = args.db or default_db_path()
    settings = load_metrics_settings()
    now = time.time()
    since, until = _period(args.since, now), (_period(args.until, now) if args.until else now)
    if not db.exists():
        return _say(args, f"No requests logged yet ({db}).", db, since, until)
    conn = open_reader(db)
    try:
        rows = fetch_rows(conn, since, until)
    finally:
        conn.close()
    if args.export:
        _export(rows, args.export, args.out)
        return 0
    period = f"{_when(since)} to {_when(until)}"
    if not rows and not args.drift:
        return _say(args, f"No requests logged from {period} ({db}).", db, since, until)
    groups = group_rows(rows, args.by) if args.by and rows else ({"all": rows} if rows else {})
    summaries = [summarize(g, settings, k) for k, g in groups.items()]
    comparisons = drift_report(db, settings.drift, now) if args.drift else None
    if args.json:
        print_json(_json_report(db, since, until, args.by, summaries, comparisons))
        return 0
    if summaries:
        print_table(_summary_table(summaries, settings, period, args.by))
    if args.plot and rows:
        _plot(rows, since, until)
    if comparisons is not None:
        _drift(comparisons, settings)
    return 0


def _period(text: str, now: float) -> float:
    from localspec.metrics import parse_period

    try:
        ts = parse_period(text, now)
        datetime.fromtimestamp(ts)  # the report shows it as a date: one before year 1 has none
    except LocalspecError as exc:  # a flag value that does not parse: a usage error
        raise UsageError(exc.cause, exc.fix) from None
    except (ValueError, OverflowError, OSError):
        raise UsageError(f"The period {text!r} reaches back before any date.",
                         "Use a shorter one, e.g. 365d, or an ISO date such as 2025-01-31.") from None
    return ts


def _say(args: argparse.Namespace, message: str, db: Path, since: float, until: float) -> int:
    if args.json:
        print_json(_json_report(db, since, until, args.by, [], [] if args.drift else None))
    else:
        print(message)
    return 0


def _json_report(db: Path, since: float, until: float, by: str | None, summaries: list[Summary],
                 comparisons: list | None) -> dict:
    report: dict = {"db": str(db), "since": _iso(since), "until": _iso(until), "by": by,
                    "groups": [s.to_dict() for s in summaries]}
    if comparisons is not None:
        report["drift"] = [{**asdict(c), "change": c.change, "enough_data": c.enough_data, "flagged": c.flagged}
                           for c in comparisons]
    return report


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts).astimezone().isoformat(timespec="seconds")


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _summary_table(rows: list[Summary], settings: MetricsSettings, period: str, by: str | None) -> Table:
    from rich.markup import escape
    from rich.table import Table

    from localspec.cli.output import printable

    t = Table(title=f"localspec requests, {period}", title_justify="left")
    cols: list[tuple[str, JustifyMethod]] = [
        (by or "period", "left"), ("requests", "right"), ("errors", "right"), ("prompt tok", "right"),
        ("reused", "right"), ("completion tok", "right"), ("tok/s (med)", "right"),
        ("TTFT ms (med)", "right"), ("e2e ms (med)", "right"), ("accept", "right"),
        ("tok/pass", "right"), ("cache hit", "right"), ("feedback", "right"), ("compute s", "right"),
    ]
    if settings.cost_per_hour is not None:
        cols.append(("local cost", "right"))
    if settings.reference_price_per_mtok is not None:
        cols += [("API cost", "right"), ("saved", "right")]
    for name, justify in cols:
        t.add_column(name, justify=justify)
    for s in rows:
        cells = [escape(printable(s.group)), str(s.requests), str(s.errors), str(s.prompt_tokens), str(s.reused_tokens),
                 str(s.completion_tokens), _fmt(s.tokens_per_second, ".1f"), _fmt(s.ttft_ms, ".0f"),
                 _fmt(s.e2e_ms, ".0f"), _fmt(s.acceptance_rate, ".1%"), _fmt(s.mean_accepted_length, ".2f"),
                 _fmt(s.cache_hit_rate, ".1%"), _fmt(s.feedback_score, "+.2f"), f"{s.compute_s:.1f}"]
        if settings.cost_per_hour is not None:
            cells.append(_fmt(s.local_cost, ".4f"))
        if settings.reference_price_per_mtok is not None:
            cells += [_fmt(s.api_cost, ".4f"), _fmt(s.savings, ".4f")]
        t.add_row(*cells)
    return t


def _drift(comps: list, settings: MetricsSettings) -> None:
    from rich.markup import escape
    from rich.table import Table

    lim = settings.drift
    t = Table(title=f"drift: last {lim.recent_days:g} d vs the {lim.baseline_days:g} d before "
                    f"(min {lim.min_samples} samples each)", title_justify="left")
    for name in ("metric", "baseline", "recent", "change", "limit", "n base", "n recent", "status"):
        t.add_column(name, justify="left" if name in ("metric", "status") else "right")
    for c in comps:
        change = c.change
        status = "DRIFT" if c.flagged else ("ok" if c.enough_data and change is not None else "too few")
        t.add_row(escape(c.metric), _fmt(c.baseline, ".3g"), _fmt(c.recent, ".3g"),
                  "-" if change is None else (f"{change:+.1%}" if c.relative else f"{change:+.3f}"),
                  f"±{c.limit:.0%}" if c.relative else f"±{c.limit:.3f}", str(c.n_baseline), str(c.n_recent),
                  status)
    print_table(t)
    flags = [c for c in comps if c.flagged]
    # Plain lines after the table, so scripts can grep them.
    for c in flags:
        print(f"DRIFT {c.describe()}")
    if not flags:
        print("no drift beyond the limits")


def _plot(rows: list[dict], since: float, until: float) -> None:
    import plotext as plt
    from rich.console import Console

    from localspec.metrics import time_series

    span = until - max(since, rows[0]["ts"])
    bucket = 3600.0 if span <= 3 * 86400 else 86400.0
    points = time_series(rows, bucket)
    width = min(100, max(40, Console().width - 2))
    colour = sys.stdout.isatty()
    for title, attr in (("decode tokens/s (median)", "tokens_per_second"),
                        ("acceptance rate", "acceptance_rate"), ("cache hit rate", "cache_hit_rate")):
        pts = [(datetime.fromtimestamp(p.start), getattr(p, attr)) for p in points if getattr(p, attr) is not None]
        fig = plt.figure
        fig.clear()
        fig.theme("default" if colour else "colorless")
        fig.plot_size(width, 12)
        fig.title(f"{title}, per {'hour' if bucket == 3600 else 'day'}")
        if pts:
            fig.date().activate()
            fig.draw(fig.signal([x for x, _ in pts], [y for _, y in pts], marker="dot"))
        text = str(fig.build())
        print(text if colour else plt.uncolorize(text))
        if not pts:
            print(f"  (no data for {title})")


def _export(rows: list[dict], fmt: str, output: Path | None) -> None:
    if fmt == "json":
        text = json.dumps(rows, ensure_ascii=False, indent=1) + "\n"
    else:
        buf = io.StringIO()
        if rows:
            w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
        text = buf.getvalue()
    if output:
        with writing_file(output, "--out"):
            output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
