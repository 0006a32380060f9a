"""`localspec cache stats | clear | export | eval | train-scorer`: inspect and measure the semantic cache."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from localspec.cli.options import CACHE_JUDGES, add_deprecated_flag, add_deprecated_option
from localspec.cli.output import writing_file
from localspec.errors import LocalspecError, UsageError

if TYPE_CHECKING:
    from rich.progress import Progress

EMBEDDING_MODEL = "all-minilm-l6-v2-f16"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="semantic cache: statistics, clear, export, evaluation", description=__doc__)
    verbs = p.add_subparsers(dest="cache_command", metavar="VERB", required=True)

    s = verbs.add_parser("stats", help="entries, size, hits and false hits")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=run_stats)

    c = verbs.add_parser("clear", help="remove every cached answer")
    c.add_argument("--json", action="store_true", help="print how many answers were removed as JSON")
    c.set_defaults(func=run_clear)

    e = verbs.add_parser("export", help="write every entry as JSON lines")
    e.add_argument("path", type=Path)
    e.set_defaults(func=run_export)

    v = verbs.add_parser("eval", help="hit rate, false-hit rate, precision and recall per threshold on labelled pairs")
    v.add_argument("--split", choices=("test", "dev", "all"), default="test",
                   help="the committed pairs to run: test (default) was written blind and is never tuned on; dev "
                        "is what the guard's rules and the thresholds were tuned on; all: both")
    v.add_argument("--file", type=Path, help="a labelled pair file (JSON lines: a, b, label hit|miss) instead")
    v.add_argument("--limit", type=int, help="only the first N pairs")
    v.add_argument("--threshold", type=float, help="similarity threshold (default: the cache's default)")
    v.add_argument("--exact-only", action="store_true", help="run without the embedding model")
    v.add_argument("--embedding-model", type=Path, help="a GGUF embedding model file (default: the installed MiniLM)")
    v.add_argument("--cache-judge", choices=CACHE_JUDGES, default="model",
                   help="who confirms semantic hits, as on serve and chat: the answering model, "
                        "the learned pair scorer, or the guard's rules alone")
    # The older spellings of this verb, where `none` meant `rules`.
    add_deprecated_option(v, "--judge", dest="cache_judge", replacement="--cache-judge",
                          values={"model": "model", "scorer": "scorer", "none": "rules"})
    add_deprecated_flag(v, "--no-judge", dest="cache_judge", const="rules", replacement="--cache-judge rules")
    v.add_argument("--judge-model", help="the judge's model id (default: the profile's target)")
    v.add_argument("--judge-threshold", type=float,
                   help="the judge's threshold: the model's logit margin or the scorer's log-odds (default: theirs)")
    v.add_argument("--scorer-weights", type=Path, help="pair scorer weights (default: the shipped ones)")
    v.add_argument("--profile", help="profile whose target model judges")
    v.add_argument("--latency-sample", type=int, default=100,
                   help="with the judge, time real lookups on the first N pairs (each judgement costs a prefill)")
    v.add_argument("--misses", action="store_true", help="also list the paraphrases that were not served, and why")
    v.add_argument("--json", action="store_true", help="print the full report as JSON")
    v.add_argument("--out", type=Path, metavar="PATH", help="also write the full report as JSON to PATH")
    add_deprecated_option(v, "--save", dest="out", replacement="--out", type=Path)
    v.set_defaults(func=run_eval)

    t = verbs.add_parser("train-scorer", help="fit the pair scorer (--cache-judge scorer) on labelled pairs",
                         description="Fit the pair scorer on the committed dev pairs (or your own files) and write "
                                     "its weights as JSON. Its threshold is chosen on pairs from a file the fit did "
                                     "not see, one file at a time (see localspec.cache.scorer).")
    t.add_argument("--out", type=Path, required=True, help="where to write the weights (JSON)")
    t.add_argument("--file", type=Path, action="append", default=[],
                   help="a labelled pair file, one per author (repeat; at least two); default: the dev split")
    t.add_argument("--embedding-model", type=Path, help="a GGUF embedding model file (default: the installed MiniLM)")
    t.set_defaults(func=run_train_scorer)


def open_embedder(model_id: str = EMBEDDING_MODEL):
    """The installed embedding model, or None (the cache then runs in exact-match mode)."""
    from localspec.models import ModelManager
    from localspec.service import open_embedder as load

    try:
        path = ModelManager().installed_path(model_id)
    except LocalspecError:
        path = None
    if path is None:
        return None
    return load(path)


class _JudgeProgress:
    """A progress bar for the judged pairs (a prefill each), or nothing without a judge."""

    def __init__(self, judge) -> None:
        self.judge = judge
        self._progress: Progress | None = None

    def __enter__(self):
        if self.judge is None:
            return None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        progress = Progress(TextColumn("judging pairs"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                            console=Console(stderr=True))
        self._progress = progress
        progress.start()
        bar = progress.add_task("judge", total=None)

        def update(done: int, total: int) -> None:
            progress.update(bar, completed=done, total=total)

        return update

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()


def _open_cache(embedder=None):
    from localspec.cache import SemanticCache

    return SemanticCache(embedder=embedder)


# What an open cache says of its own embedder: this command opens the store without one, so they would
# report "exact-match mode: no embedding model installed" and 0 indexed, whatever is installed or served.
_HANDLE_ONLY = ("mode", "description", "indexed")


def run_stats(args: argparse.Namespace) -> int:
    cache = _open_cache()
    try:
        stats = {k: v for k, v in cache.stats().items() if k not in _HANDLE_ONLY}
    finally:
        cache.close()
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    print(f"directory   {stats['directory']}")
    print(f"entries     {stats['entries']} ({stats['bytes'] / 1e6:.1f} MB of {stats['size_limit'] / 1e6:.0f} MB)")
    print(f"lookups     {stats['lookups']}: {stats['exact_hits']} exact hits, {stats['semantic_hits']} semantic hits, "
          f"{stats['misses']} misses (hit rate {stats['hit_rate']:.1%})")
    print(f"guard       {stats['guard_rejections']} candidates rejected; {stats['false_hits']} answers marked wrong")
    print(f"judge       {stats['judged']} candidates judged, {stats['judge_rejections']} rejected, "
          f"{stats['judge_errors']} unanswered (timeout or error)")
    print(f"writes      {stats['stores']} stored, {stats['store_skipped']} skipped")
    return 0


def run_clear(args: argparse.Namespace) -> int:
    cache = _open_cache()
    try:
        n = cache.clear()
    finally:
        cache.close()
    if args.json:
        print(json.dumps({"removed": n}))
    else:
        print(f"removed {n} cached answers")
    return 0


def run_export(args: argparse.Namespace) -> int:
    cache = _open_cache()
    try:
        with writing_file(args.path, "the export file"):
            n = cache.export(args.path)
    finally:
        cache.close()
    print(f"wrote {n} entries to {args.path}")
    return 0


def _scorer_judge(embedder, weights: Path | None, threshold: float | None):
    from localspec.cache.scorer import PairScorer, ScorerJudge

    try:
        scorer = PairScorer.load(weights)
    except (OSError, ValueError, KeyError) as exc:
        raise LocalspecError(f"pair scorer weights {weights or '(shipped)'} unusable: {exc}",
                             "Train them with `localspec cache train-scorer --out PATH`.") from exc
    try:
        return ScorerJudge(scorer, embedder, threshold)
    except ValueError as exc:
        raise LocalspecError(str(exc), "Train weights for this embedding model with `localspec cache train-scorer`, "
                                       "or evaluate with the registry's MiniLM.") from exc


def run_train_scorer(args: argparse.Namespace) -> int:
    from localspec.cache.evaluate import load_pairs, pair_files
    from localspec.cache.scorer import reworded_pairs, train_scorer, training_pairs

    files = args.file or pair_files("dev")
    for f in files:
        if not f.exists():
            raise LocalspecError(f"{f} does not exist.", "Give JSON-lines files of labelled pairs (a, b, label).")
    if len(files) < 2:
        raise UsageError("train-scorer needs at least two pair files.",
                             "Give one --file per author: the threshold is chosen on a file the fit did not see.")
    if args.embedding_model and not args.embedding_model.exists():
        raise LocalspecError(f"{args.embedding_model} does not exist.", "Give the path of a GGUF embedding model.")
    if args.embedding_model:
        from localspec.service import open_embedder as load

        embedder, model_name = load(args.embedding_model), args.embedding_model.stem
    else:
        embedder, model_name = open_embedder(), EMBEDDING_MODEL
    if embedder is None:
        raise LocalspecError(f"{EMBEDDING_MODEL} is not installed.", f"Run `localspec models pull {EMBEDDING_MODEL}`.")
    try:
        rows = [dict(r, source=Path(f).stem) for f in files for r in load_pairs(Path(f))]
        rows += reworded_pairs(rows)  # made-up rewordings: fitted on, not counted (see cache.scorer)
        print(f"embedding {len(rows)} pairs from {len(files)} files...", file=sys.stderr)
        vectors = functools.cache(embedder.embed)  # each text once, though it occurs in many pairs
        pairs = training_pairs(rows, vectors)
        try:
            scorer = train_scorer(pairs, vectors, embedder.fingerprint, model_name)
        except ValueError as exc:
            raise LocalspecError(f"cannot train the pair scorer: {exc}", "Add labelled pairs of both kinds.") from exc
    finally:
        embedder.close()
    scorer.save(args.out)
    chosen = scorer.report["chosen"]
    print(f"{len(pairs)} pairs ({sum(p.augmented for p in pairs)} of them made-up rewordings), "
          f"{scorer.report['candidates']} scored (guard passed, similarity >= {scorer.floor:.2f})")
    print("held out (each file scored by a fit on the others):  log-odds  hit rate  false hits")
    for point in scorer.report["held_out_curves"][str(chosen["l2"])]:
        mark = " <- chosen" if point["threshold"] == chosen["threshold"] else ""
        print(f"  {point['threshold']:5.2f}   {point['hit_rate']:6.1%}   {point['false_hit_rate']:6.2%}{mark}")
    print(f"L2 {chosen['l2']}, threshold {chosen['threshold']:.2f} ({scorer.report['rule']}); wrote {args.out}")
    return 0


def run_eval(args: argparse.Namespace) -> int:
    from localspec.cache.evaluate import load_pairs, pair_files, run_eval as evaluate

    if args.file:
        if not args.file.exists():
            raise LocalspecError(f"{args.file} does not exist.", "Give a JSON-lines file of labelled pairs.")
        pairs = load_pairs(args.file, args.limit)
        source = str(args.file)
    else:
        pairs = [p for path in pair_files(args.split) for p in load_pairs(path)]
        pairs = pairs[: args.limit] if args.limit else pairs
        source = f"committed pairs, split {args.split}"
    if not pairs:
        raise LocalspecError("The pair file is empty.", "Give at least one labelled pair.")
    if args.embedding_model and not args.embedding_model.exists():
        raise LocalspecError(f"{args.embedding_model} does not exist.", "Give the path of a GGUF embedding model.")
    if args.exact_only:
        embedder = None
    elif args.embedding_model:
        from localspec.service import open_embedder as load

        embedder = load(args.embedding_model)
    else:
        embedder = open_embedder()
    if embedder is None and not args.exact_only:
        print(f"note: {EMBEDDING_MODEL} is not installed; exact-match mode "
              f"(run `localspec models pull {EMBEDDING_MODEL}`)", file=sys.stderr)
    judge, close_judge = None, None
    latency_sample = args.latency_sample
    try:
        if args.cache_judge == "model" and embedder is not None:
            from localspec.service import open_judge

            print("loading the reuse judge...", file=sys.stderr)
            judge, close_judge = open_judge(args.profile, args.judge_model, args.judge_threshold)
        elif args.cache_judge == "scorer" and embedder is not None:
            judge = _scorer_judge(embedder, args.scorer_weights, args.judge_threshold)
            latency_sample = len(pairs)  # milliseconds a pair: time every lookup
        with _JudgeProgress(judge) as progress:
            report = evaluate(pairs, embedder, threshold=args.threshold, judge=judge,
                              latency_sample=latency_sample, progress=progress)
    finally:
        if close_judge is not None:
            close_judge()
        if embedder is not None:
            embedder.close()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    judged = report["judge"]
    print(f"{source}: {report['pairs']} pairs ({report['paraphrases']} paraphrases, {report['traps']} traps), "
          f"{report['mode']} mode" + (f", reuse judge {judged['model']} at {judged['threshold']:.2f} "
                                      f"({judged['judged_pairs']} pairs judged)" if judged else ", no reuse judge"))
    print("threshold  hit rate  false hits  precision  recall   | without guard: hit rate  false hits")
    for p, q in zip(report["curve"], report["curve_without_guard"], strict=True):
        mark = " <- used" if abs(p["threshold"] - report["threshold"]) < 1e-9 else ""
        if abs(p["threshold"] - report["suggested_threshold"]) < 1e-9:
            mark += " <- suggested"
        print(f"  {p['threshold']:.2f}     {p['hit_rate']:6.1%}   {p['false_hit_rate']:6.1%}     {p['precision']:6.1%}"
              f"    {p['recall']:6.1%}  |                {q['hit_rate']:6.1%}     {q['false_hit_rate']:6.1%}{mark}")
    a = report["at_threshold"]
    if judged:
        print(f"judge threshold at similarity {report['threshold']:.2f}:  hit rate  false hits  precision")
        for p in report["judge_curve"]:
            mark = " <- used" if abs(p["threshold"] - judged["threshold"]) < 1e-9 else ""
            if abs(p["threshold"] - report["suggested_judge_threshold"]) < 1e-9:
                mark += " <- suggested"
            print(f"  {p['threshold']:5.2f}{'':29}{p['hit_rate']:6.1%}    {p['false_hit_rate']:6.1%}"
                  f"     {p['precision']:6.1%}{mark}")
    stopped = f"the guard stopped {a['traps_stopped_by_guard']} traps above the threshold"
    if judged:
        stopped += f", the judge {a['traps_stopped_by_judge']} more"
    print(f"threshold {report['threshold']:.2f}: hit rate {a['hit_rate']:.1%} ({a['hits']}/{report['paraphrases']}), "
          f"false-hit rate {a['false_hit_rate']:.1%} ({a['false_hits']}/{report['traps']}), "
          f"precision {a['precision']:.1%}; {stopped}")
    lat = report["latency_ms"]
    print(f"lookup latency over {lat['timed_lookups']} real lookups: p50 {lat['lookup_p50']:.1f} ms, "
          f"p95 {lat['lookup_p95']:.1f} ms; hits: p50 {lat['hit_p50']:.1f} ms, p95 {lat['hit_p95']:.1f} ms, "
          f"max {lat['hit_max']:.1f} ms" + (f"; {lat['disagreements_with_probe']} disagreed with the judged probe"
                                            if judged else ""))
    print(f"suggested threshold for these pairs: {report['suggested_threshold']:.2f} (the highest within 2 points of "
          f"the most hits at a false-hit rate of at most half the goal)")
    goals = report["goals"]
    verdict = "met" if goals["met"] else "NOT met"
    print(f"goals at {report['threshold']:.2f}: >= {goals['hit_rate']:.0%} paraphrase hits and <= "
          f"{goals['false_hit_rate']:.0%} false hits: {verdict}")
    for ex in a["false_hit_examples"]:
        print(f"  false hit ({ex['category']}, {ex['similarity']:.3f}): {ex['b']!r} "
              f"was served the answer to {ex['a']!r}")
    if args.misses:
        for ex in a["missed_paraphrases"]:
            why = (f"guard: {ex['guard']}" if ex["guard"] else f"judge: {ex['judge']:.2f}" if ex["judge"] is not None
                   else "below the threshold")
            print(f"  missed ({why}, {ex['similarity']:.3f}): {ex['a']!r} / {ex['b']!r}")
    return 0
