"""`localspec router`: evaluate, train and inspect the router between model sizes.

  router eval    run each local tier on the task set (cached), train on one half, report
                 quality against large-tier share, PGR, APGR and CPT(50%) on the other half
  router train   fit the learned policy from a labelled JSON-lines file; weights saved as JSON
  router show    the tiers, the policy in use, and the decision for a prompt
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from localspec.cli.options import add_deprecated_option
from localspec.cli.output import print_json, print_table
from localspec.errors import ConfigError, LocalspecError


class _JsonFlag(argparse.Action):
    """`--json` prints the report; the old `--json PATH` (which wrote a file) still works as
    `--out PATH`, with a one-line deprecation note."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if values is True:
            namespace.json = True
            return
        print(f"localspec: --json {values} is deprecated; use --out {values}", file=sys.stderr)
        namespace.out = Path(values)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("router", help="evaluate, train and inspect the model-size router", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="router_command", metavar="VERB")

    e = verbs.add_parser("eval", help="measure the router on held-out tasks (APGR, CPT, curve)")
    e.add_argument("--profile", help="profile whose small and large tiers are measured")
    e.add_argument("--tasks", type=Path, help="task file (JSON lines); default: the shipped set")
    e.add_argument("--limit", type=int, help="use only the first N tasks (half code, half math)")
    e.add_argument("--max-tokens", type=int, default=512,
                   help="cap on each answer (default 512: at 256, the 1.5B's worked math answers were "
                        "cut off 75 times in 142)")
    e.add_argument("--threads", type=int, help="llama.cpp threads")
    e.add_argument("--parallel", type=int, default=1,
                   help="sequences decoded together (faster on a busy CPU; latencies then include the sharing)")
    e.add_argument("--outcomes", type=Path, help="outcome cache file (default: in the cache dir)")
    e.add_argument("--from-outcomes", type=Path, nargs="?", const=_SHIPPED, metavar="PATH",
                   help="generate nothing: read every outcome from PATH (default: the shipped file)")
    e.add_argument("--fresh", action="store_true", help="regenerate every answer, ignoring the cache")
    e.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples for the 95%% CIs")
    e.add_argument("--no-embedding", action="store_true", help="train the learned policy on features only")
    e.add_argument("--large-share", type=float, help="target large share for the threshold (default: profile's)")
    e.add_argument("--save-weights",
                   action="store_true", help="save the trained policy as the profile's router weights")
    e.add_argument("--folds", type=_folds, default=5,
                   help="k-fold cross-validation: every task is held out once (default 5); 1: one 50/50 split")
    e.add_argument("--write-labels", type=Path,
                   help="write the training labels of every task, or of the train half with --folds 1 "
                        "(the `router train` format)")
    e.add_argument("--out", type=Path, metavar="PATH", help="also write the full report as JSON to PATH")
    e.add_argument("--json", nargs="?", const=True, default=False, action=_JsonFlag, metavar="",
                   help="print the full report as JSON instead of the tables")
    e.add_argument("--chart", type=Path, help="write a PNG of quality against large share")
    e.set_defaults(func=run_eval)

    t = verbs.add_parser("train", help="fit the learned policy from labelled requests")
    t.add_argument("labels",
                   type=Path, help='JSON lines: {"prompt"|"messages", "label": 0|1, "max_tokens"?, "weight"?}')
    t.add_argument("--profile", help="profile the weights belong to")
    t.add_argument("--out", type=Path, metavar="PATH", help="weights file (default: <data dir>/router/<profile>.json)")
    add_deprecated_option(t, "--output", dest="out", replacement="--out", type=Path)
    t.add_argument("--no-embedding", action="store_true", help="features only (no embedding model needed)")
    t.add_argument("--json", action="store_true", help="print what was trained as one JSON object")
    t.set_defaults(func=run_train)

    s = verbs.add_parser("show", help="tiers, policy, and the decision for a prompt")
    s.add_argument("prompt", nargs="?", help="a prompt to route")
    s.add_argument("--profile")
    s.add_argument("--max-tokens", type=int)
    s.add_argument("--hint", help="fast | best | a tier name")
    s.add_argument("--json", action="store_true", help="print the tiers, the policy and the decision as JSON")
    s.set_defaults(func=run_show)
    p.set_defaults(func=lambda args: (p.print_help(), 0)[1])


# `--from-outcomes` without a PATH: the committed outcomes, located when the command runs (they are
# evaluation data outside the package: localspec.evals).
# Not a str, so argparse hands it over as it is instead of through `type`.
_SHIPPED = object()


def _profile(name: str | None):
    from localspec.models import ModelManager

    mm = ModelManager()
    key = name or mm.registry.default_profile or "default"
    return mm, key, mm.profile(key)


def _embedder(mm, profile, disabled: bool):
    if disabled or not profile.embedding:
        return None, None
    path = mm.installed_path(profile.embedding)
    if path is None:
        print(f"note: {profile.embedding} is not installed; the learned policy uses features only "
              f"(`localspec models pull {profile.embedding}` to add the embedding)", file=sys.stderr)
        return None, None
    from localspec.service import open_embedder

    return open_embedder(path), profile.embedding


def _limit(tasks, n: int | None):
    if not n:
        return tasks
    kinds = sorted({t.kind for t in tasks})
    per = max(1, n // len(kinds))
    out = []
    for k in kinds:
        out += [t for t in tasks if t.kind == k][:per]
    return out


def _folds(text: str) -> int:
    k = int(text)
    if k < 1:
        raise argparse.ArgumentTypeError("--folds must be 1 (one 50/50 split) or more")
    return k


def run_eval(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from localspec.paths import resolve_paths
    from localspec.router.outcomes import Outcome, OutcomeCache, run_tier
    from localspec.router.tasks import kfold, load_tasks, shipped_outcomes, split

    console = Console(stderr=True)
    mm, prof_name, profile = _profile(args.profile)
    tasks = _limit(load_tasks(args.tasks), args.limit)
    if args.from_outcomes is _SHIPPED:
        args.from_outcomes = shipped_outcomes()
    splits = [split(tasks)] if args.folds == 1 else kfold(tasks, args.folds)
    tier_models = {"small": profile.small, "large": profile.target}
    if not profile.small:
        raise ConfigError(f"Profile {prof_name!r} names no small model.", "Add small = \"<model id>\" to the profile.")
    t0 = time.monotonic()
    results: dict[str, dict] = {}
    if args.from_outcomes:
        if not args.from_outcomes.is_file():
            raise ConfigError(f"No outcome file at {args.from_outcomes}.",
                              "Run `localspec router eval` to generate one.")
        cache = OutcomeCache(args.from_outcomes)
        for tier in tier_models:
            found = {t.id: cache.find(t, tier, args.max_tokens) for t in tasks}
            missing = [tid for tid, o in found.items() if o is None]
            if missing:
                raise ConfigError(f"{args.from_outcomes} lacks {len(missing)} {tier} outcomes (e.g. {missing[0]}).",
                                  "Run `localspec router eval` without --from-outcomes to generate them.")
            results[tier] = found
    else:
        from localspec.service import open_engine

        cache = OutcomeCache(args.outcomes or resolve_paths().cache_dir / "router" / "outcomes.json")
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as progress:
            for tier, model_id in tier_models.items():
                model_id = mm.resolve(model_id).id
                path = mm.require_path(model_id)
                bar = progress.add_task(f"{tier:5s} {model_id}", total=len(tasks))

                def opener(mid=model_id):
                    return open_engine(target=mid, mode="off", n_ctx=2048, n_threads=args.threads,
                                       parallel=args.parallel)

                def advance(_outcome: Outcome | None, b: TaskID = bar) -> None:  # the default binds this bar
                    progress.advance(b)

                outs = run_tier(tier, model_id, path, tasks, cache, args.max_tokens, args.fresh, opener, advance)
                results[tier] = {o.task_id: o for o in outs}
    gen_s = time.monotonic() - t0

    from localspec.router.evaluation import chart, evaluate, labels_from_outcomes, write_labels

    if args.write_labels:
        labelled = splits[0][0] if args.folds == 1 else tasks
        write_labels(args.write_labels,
                     labels_from_outcomes(labelled, results["small"], results["large"], args.max_tokens))
    embedder, emb_id = _embedder(mm, profile, args.no_embedding)
    share = profile.large_share if args.large_share is None else args.large_share
    try:
        result = evaluate(splits, results["small"], results["large"], args.max_tokens, embedder, emb_id,
                          share, args.resamples)
    except ValueError as exc:
        _print_tiers(console, tasks, results)
        raise LocalspecError(f"Cannot train the router on this split: {exc}.",
                             "Use more tasks (drop --limit) or fewer --folds, so both labels occur in every "
                             "training part.") from None
    finally:
        if embedder is not None:
            embedder.close()
    report = result.as_dict()
    report.update(profile=prof_name, max_tokens=args.max_tokens, parallel=args.parallel, tasks=len(tasks),
                  seconds=round(gen_s, 1),
                  source=str(args.from_outcomes) if args.from_outcomes else "generated/cached")
    report["goals"] = _goals(report)
    note = sys.stderr if args.json else sys.stdout  # with --json, stdout carries the JSON alone
    if args.json:
        print_json(report)
    else:
        _print_report(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"report written to {args.out}", file=note)
    if args.chart:
        drawn = chart(result, args.chart)
        print(f"chart written to {args.chart}" if drawn else "matplotlib is not installed: no chart",
              file=note)
    if args.save_weights:
        from localspec.router import weights_path

        path = weights_path(prof_name)
        result.learned.save(path)
        print(f"router weights saved to {path}", file=note)
    return 0


def _print_tiers(console, tasks, results) -> None:
    for tier, outs in results.items():
        passed = sum(outs[t.id].passed for t in tasks)
        console.print(f"{tier}: {passed}/{len(tasks)} passed")


def _fmt(e: dict) -> str:
    v, (lo, hi) = e["value"], e["ci95"]
    if v is None:
        return "n/a"
    return f"{v:.2f} [{lo:.2f}, {hi:.2f}]" if lo is not None else f"{v:.2f}"


def _goals(report: dict) -> dict:
    """The goals: APGR >= 0.6 with its lower bound above random's, and CPT(50%) <= 40%."""
    routers = report["routers"]
    apgr, cpt = routers["learned"]["apgr"], routers["learned"]["cpt50"]
    return {"apgr_met": (apgr["value"] or 0) >= 0.6 and (apgr["ci95"][0] or 0) > routers["random"]["apgr"]["value"],
            "cpt50_met": cpt["value"] is not None and cpt["value"] <= 0.4}


def _print_report(report: dict) -> None:
    from rich.table import Table

    from localspec.cli.output import table_console

    console = table_console()
    tiers = report["tiers"]
    how = (f"{report['folds']}-fold cross-validation, each policy trained on {report['train_tasks']:.0f}"
           if report["folds"] > 1 else f"trained on {report['train_tasks']:.0f}")
    t = Table(title=f"Tiers on {report['held_out_tasks']} held-out tasks ({how})")
    for col in ("tier", "model", "pass rate", "code", "math", "mean latency s"):
        t.add_column(col)
    for name, s in tiers.items():
        t.add_row(name, s["model"], f"{s['quality']:.1%}", f"{s['quality_by_kind'].get('code', 0):.1%}",
                  f"{s['quality_by_kind'].get('math', 0):.1%}", f"{s['mean_latency_s']:.2f}")
    print_table(t)
    console.print(f"[dim]large = {tiers['large']['note']}[/dim]")

    routers = report["routers"]
    c = Table(title="Quality (pass rate) against the share of large calls, held-out")
    c.add_column("large share")
    for name in routers:
        c.add_column(f"{name} quality")
        c.add_column(f"{name} PGR [95% CI]")
    for share in routers["learned"]["quality_at_share"]:
        row = [share]
        for r in routers.values():
            q = r["quality_at_share"][share]
            row += [f"{q:.1%}" if q is not None else "n/a", _fmt(r["pgr_at_share"][share])]
        c.add_row(*row)
    print_table(c)

    m = Table(title="RouteLLM metrics, held-out (95% bootstrap CI)")
    for col in ("router", "APGR", "CPT(50%)"):
        m.add_column(col)
    for name, r in routers.items():
        m.add_row(name, _fmt(r["apgr"]), _fmt(r["cpt50"]))
    print_table(m)
    boot = routers["learned"]["bootstrap"]
    console.print(f"[dim]{boot['resamples']} resamples of the held-out tasks; {boot['skipped_gap_not_positive']} "
                  f"skipped (large no better than small in the resample). cascade-confidence needs the small "
                  f"answer first (reference only). random's point value is its expectation.[/dim]")
    goal_apgr, goal_cpt = report["goals"]["apgr_met"], report["goals"]["cpt50_met"]
    console.print(f"goal APGR >= 0.6 with lower bound above random's {routers['random']['apgr']['value']:.2f}: "
                  f"{'met' if goal_apgr else 'NOT met'}; goal CPT(50%) <= 40%: {'met' if goal_cpt else 'NOT met'}")
    at = report["at_threshold"]
    lp = report["learned_policy"]
    console.print(f"held out, at each policy's threshold for a {at['target_large_share']:.0%} target share: "
                  f"{at['large_share']:.0%} large, quality {at['quality']:.1%}, "
                  f"mean latency {at['mean_latency_s']:.2f} s")
    kept = "embedding + features" if lp["uses_embedding"] else "features only"
    console.print(f"policy kept by --save-weights: {kept}, "
                  f"L2 {lp['l2']}, trained on {lp.get('n')} labelled tasks ({lp.get('positives')} need large), "
                  f"threshold {at['threshold']:.3f}")


def run_train(args: argparse.Namespace) -> int:
    from localspec.router import weights_path
    from localspec.router.evaluation import read_labels, train_from_labels

    mm, prof_name, profile = _profile(args.profile)
    examples = read_labels(args.labels)
    embedder, emb_id = _embedder(mm, profile, args.no_embedding)
    try:
        policy = train_from_labels(examples, embedder, emb_id)
    except ValueError as exc:
        raise LocalspecError(f"Cannot train on {args.labels}: {exc}.", "Label more examples of both kinds.") from None
    finally:
        if embedder is not None:
            embedder.close()
    policy.set_share(profile.large_share)
    out = args.out or weights_path(prof_name)
    policy.save(out)
    if args.json:
        print_json({"profile": prof_name, "examples": len(examples), "positives": policy.meta["positives"],
                    "uses_embedding": policy.uses_embedding, "l2": policy.l2, "threshold": policy.threshold,
                    "large_share": profile.large_share, "weights": str(out)})
        return 0
    print(f"trained on {len(examples)} examples ({policy.meta['positives']} need large); "
          f"{'embedding + features' if policy.uses_embedding else 'features only'}, L2 {policy.l2}; "
          f"threshold {policy.threshold:.3f} for a {profile.large_share:.0%} large share")
    print(f"weights written to {out}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    from localspec.router import RouteInput, Router

    router = Router.from_profile(args.profile)
    try:
        decision = router.decide(RouteInput(None, args.prompt, args.max_tokens, args.hint)) if args.prompt else None
        if args.json:
            print_json({"profile": router.profile, "policy": router.policy.name,
                        "threshold": router.policy.threshold, "cascade": router.cascade, "note": router.note,
                        "tiers": [t.as_dict() for t in router.tiers],
                        "decision": decision.as_dict() if decision else None})
            return 0
        print(f"profile {router.profile}: policy {router.policy.name}, threshold {router.policy.threshold:.3f}, "
              f"cascade {'on' if router.cascade else 'off'}")
        if router.note:
            print(f"note: {router.note}")
        for t in router.tiers:
            if t.kind == "local":
                where = f"{t.target}" + (f" + draft {t.draft}" if t.draft else "")
            else:
                where = f"{t.model} at {t.base_url}"
            print(f"  {t.name:7s} {t.kind:6s} {where}")
        if decision:
            print(decision.reason)
            print(json.dumps(decision.as_dict()))
    finally:
        router.close()
    return 0
