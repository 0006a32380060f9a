"""Replay `auto`'s choices over recorded greedy answers: a controller policy judged in seconds.

A bench run of the predicted plan takes 20 minutes, and on this shared 2-core box the same `auto`
code read 0.85-0.92x `off` on one task across runs: single-row passes alone moved between 33 and 37
ms from one request to the next. A policy change worth 3% cannot be seen that way. The replay takes
the clock out: the answers are recorded once (greedy, `off`), and each replayed step costs what the
pinned verify curve says, so two policies differ only by their choices.

    python scripts/replay_auto.py record --out answers.json      # the predicted plan's items (~3 min)
    python scripts/replay_auto.py replay answers.json --curve DIR/bench.json [--seeds 6] [--trace KEY]
    python scripts/replay_auto.py record --plan goals --out goals.json   # the goals plan's prompts (~2 min)
    python scripts/replay_auto.py ceiling goals.json --curve DIR/bench.json
    python scripts/replay_auto.py asks --curve DIR/bench.json [--repeats 3] [--out asks.json]   # (~6 min)

`ceiling`: per answer, the most any policy over the engine's lookup proposal could reach on the curve
if it knew where each copy ends (each pass drafts any prefix of the proposal, or nothing), beside fixed
rules (draft k tokens at matches of m or more), `auto`'s replay and llama-server's n-gram drafters
(`localspec.bench.ngram_rules`): what a first ask can gain by copying its prompt and its own answer so far
(no draft model, no other question's answer).

Per item and position: lookup's proposal and the prediction's (the engine's own PromptLookupDrafter
and Prediction), the real Controller's choice, the drafted prefix the answer keeps; a pass of n rows
costs verify(n) single steps. The speed-up is the answer's tokens over the steps spent. Items run in
the bench's order with one shared acceptance book and explorer; each seed shuffles the modes per item
as the bench does, and the summary averages the seeds (the book's path moves single items by a few
percent). `--curve` takes a bench.json (its learned `costs`) or a calibration file.

`asks`: not a replay but the real engine, `auto` with its costs pinned to the curve, asking the goals
plan's prompts `--repeats` times in one process as the bench does (the second and third asks copy the
first's answer), each ask priced on the curve: its plain passes and drafts of k at verify(k + 1) single
steps. What it adds to the replay: lookup over earlier requests, and answers that part at near-ties in
the batch shapes `auto` chose. Which way a near-tie goes is chance, so compare whole runs, not prompts.

Not replayed: the draft model (auto on the CPU bench rarely picks it), per-step overhead (Python,
logits copies), lookup over earlier requests, answers that part from `off`'s at a near-tie. Use it to compare policies; measure speed with `localspec bench`.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from localspec.bench.ngram_rules import price_rules
from localspec.engine.config import GenerationRequest
from localspec.engine.controller import AcceptanceBook, Controller, Explorer
from localspec.engine.costs import Costs
from localspec.engine.drafters import PromptLookupDrafter
from localspec.engine.events import Stats
from localspec.engine.prediction import Tokenizer, prepare

MODES = ("auto", "auto+prediction")
PREDICTION_K_MAX = 16  # EngineConfig.prediction_k_max: with a prediction, lookup copies no further
COPY_K_MAX = 48  # EngineConfig.copy_k_max
K_MAX = 16  # EngineConfig.auto_k_max
N_CTX = 4096  # the bench's context is sized to its largest edit: no answer here reaches it


@dataclass(frozen=True)
class Recorded:
    suite: str
    key: str
    prompt: list[int]
    answer: list[int]
    prediction: str
    max_tokens: int = N_CTX  # the reply budget the bench gave it


@dataclass
class Replayed:
    speedup: float  # answer tokens over the single steps spent
    drafts: list[str] = field(default_factory=list)  # "l m=4 15/15 +7.8": drafter, match, kept/drafted, steps saved


def replay_one(item: Recorded, controller: Controller, costs: Costs, tokenizer: Tokenizer, *,
               prediction: bool) -> Replayed:
    """One request as the scheduler's auto path runs it, on the recorded answer instead of the target.
    The answer's first token comes from the prompt's pass (no choice), as does the bench's decode
    speed leave it out."""
    lookup = PromptLookupDrafter(2, 16)
    predicted = prepare(item.prediction, tokenizer, n_ctx=N_CTX) if prediction else None
    out, n_prompt = item.answer, len(item.prompt)
    i, spent, drafts = 1, 0.0, []
    while i < len(out):
        history = item.prompt + out[:i]
        room = min(item.max_tokens - i - 1, N_CTX - len(history))  # as Engine._plan_draft's
        available = 0
        if predicted is not None:
            predicted.follow(history, start=n_prompt)
            available = min(PREDICTION_K_MAX, room, predicted.available())
        proposal = lookup.propose(history, min(room, controller.copy_k_max), None, prompt=n_prompt)
        choice = controller.choose(0, proposal.match_length, len(proposal), room, context=len(history),
                                   prediction_available=available, prediction_cap=available,
                                   prediction_odds=predicted.follow_odds(available) if predicted else (),
                                   prediction_streak=predicted.streak if predicted else 0,
                                   lookup_repeat=proposal.source == "repeat")
        if choice.drafter == "prediction" and predicted is not None:
            draft: Sequence[int] = predicted.propose(choice.k).tokens
        elif choice.drafter == "lookup":
            draft = proposal.tokens[: choice.k]
        else:
            draft = ()
        kept = next((j for j, t in enumerate(draft) if i + j >= len(out) or out[i + j] != t), len(draft))
        # As Active.ahead: a copy or prediction kept whole learns whether the target's next token is its next.
        source = (proposal.tokens if choice.drafter == "lookup" else
                  predicted.propose(choice.k + 1).tokens if choice.drafter == "prediction" and predicted else ())
        ahead = (source[kept] == out[i + kept] if draft and kept == len(draft) and kept < len(source)
                 and i + kept < len(out) else None)
        controller.observe(choice, len(draft), kept, proposal.match_length, lookup_repeat=proposal.source == "repeat",
                           ahead=ahead)
        steps = costs.steps(len(draft) + 1)
        if draft:
            drafts.append(f"{choice.drafter[0]}{'x' if choice.explored else ''} m={proposal.match_length} "
                          f"{kept}/{len(draft)} {kept + 1 - steps:+.1f}")
        spent, i = spent + steps, i + kept + 1
    return Replayed((len(out) - 1) / spent if spent else 1.0, drafts)


def replay(items: Sequence[Recorded], costs: Costs, tokenizer: Tokenizer, *, seed: int,
           explore: float = 0.01) -> dict[tuple[str, str, str], list[Replayed]]:
    """The bench's order: each repeat runs every item, its modes shuffled; one book and explorer."""
    book, explorer = AcceptanceBook(decay=0.99), Explorer(budget=explore)
    rng = random.Random(seed)
    out: dict[tuple[str, str, str], list[Replayed]] = {}
    for _ in range(2):
        for item in items:
            order = ["off", *MODES] if item.suite != "predicted" else ["off", "lookup", *MODES]
            rng.shuffle(order)
            for mode in (m for m in order if m in MODES and (item.prediction or m == "auto")):
                with_prediction = mode == "auto+prediction"
                controller = Controller(costs, k_max=K_MAX, has_draft_model=False, book=book, explorer=explorer,
                                        copy_k_max=PREDICTION_K_MAX if with_prediction else COPY_K_MAX,
                                        lookup_min=16 if with_prediction else 0)  # lookup_n_max
                run = replay_one(item, controller, costs, tokenizer, prediction=with_prediction)
                out.setdefault((item.suite, item.key, mode), []).append(run)
    return out


def summary(runs: dict[tuple[str, str, str], list[Replayed]]) -> dict[tuple[str, str], dict[str, float]]:
    """Per suite and mode: each item's mean speed-up over its repeats."""
    table: dict[tuple[str, str], dict[str, float]] = {}
    for (suite, key, mode), rs in runs.items():
        table.setdefault((suite, mode), {})[key] = statistics.mean(r.speedup for r in rs)
    return table


def load_curve(path: Path) -> Costs:
    data = json.loads(path.read_text())
    # A bench.json's learned curve, or its starting calibration (goals runs before they kept the curve).
    costs = Costs.from_json(data.get("costs") or data.get("calibration") or data)
    costs.pinned = True
    return costs


def _requests(plan: str, count: Callable[[str], int]) -> list[tuple[str, str, GenerationRequest, str]]:
    """(suite, key, greedy `off` request, prediction) per item of a plan: `predicted`'s edit tasks and
    prompts with their files as predictions, or `goals`' shipped prompts as the bench asks them."""
    from localspec.bench.edits import plan_items
    from localspec.bench.runner import PREDICTED_MODES, goals_plan, load_suites, predicted_plan
    from localspec.engine.chat import ChatMessage

    if plan == "predicted":
        off = next(m for m in PREDICTED_MODES if m.name == "off")
        return [(i.suite, i.key, i.request(off), i.prediction) for i in plan_items(predicted_plan(), count)]
    goals = goals_plan()
    return [(suite, str(n), GenerationRequest(messages=[ChatMessage(role="user", content=prompt)],
                                              max_tokens=goals.max_tokens, mode="off"), "")
            for suite in goals.suites for n, prompt in enumerate(goals.prompts(suite, load_suites()))]


def record(out: Path, plan: str = "predicted") -> None:
    from localspec.bench.runner import run_request
    from localspec.service import open_engine

    engine = open_engine(mode="off")
    count = lambda s: len(engine.target.tokenize(s, add_special=False, parse_special=False))  # noqa: E731
    rows = []
    for suite, key, request, prediction in _requests(plan, count):
        request = engine.with_defaults(request)
        prompt, _ = engine.prompt_tokens(request)
        answer = run_request(engine, request).ids
        rows.append({"suite": suite, "key": key, "prompt": list(prompt), "answer": list(answer),
                     "prediction": prediction, "max_tokens": request.max_tokens})
        print(f"{suite} {key}: {len(prompt)} prompt tokens, {len(answer)} answer tokens", flush=True)
    out.write_text(json.dumps(rows))


def modeled_steps(stats: Stats, costs: Costs) -> float:
    """A finished request's target passes after its first token priced on the curve: plain ones at verify(1),
    each draft of k tokens at verify(k + 1), in single steps (drafted_by_position[i]: the drafts longer than
    i). `off` spends one step on each token after the first."""
    longer = [*stats.drafted_by_position, 0]
    drafts = sum((longer[k - 1] - longer[k]) * costs.steps(k + 1) for k in range(1, len(longer)))
    return (stats.target_passes - longer[0]) * costs.steps(1) + drafts


def asks(curve: Path, repeats: int, out: Path | None) -> None:
    from localspec.bench.runner import run_request
    from localspec.service import open_engine

    engine = open_engine(mode="auto")
    engine.costs = costs = load_curve(curve)
    engine.cost_file = None  # the pinned curve is not this machine's: never saved over its calibration
    rows = []
    for rep in range(repeats):
        for suite, key, request, _ in _requests("goals", lambda s: 0):
            done = run_request(engine, request.model_copy(update={"mode": "auto", "history_scope": "bench:auto"})).done
            s = done.stats
            steps = max(modeled_steps(s, costs), 1.0)
            rows.append({"suite": suite, "key": key, "ask": rep + 1, "tokens": s.completion_tokens - 1, "steps": steps,
                         "drafted": s.drafted, "accepted": s.accepted, "passes": s.target_passes})
            print(f"{suite} {key} ask {rep + 1}: {s.drafted} drafted, {s.accepted} kept, {s.target_passes} passes, "
                  f"{(s.completion_tokens - 1) / steps:.2f}x `off` modeled", flush=True)
    for name, part in (("every ask", rows), ("asked again", [r for r in rows if r["ask"] > 1])):
        print(f"{name}: {sum(r['tokens'] for r in part) / sum(r['steps'] for r in part):.3f}x `off` modeled")
    if out is not None:
        out.write_text(json.dumps(rows))


def _proposals(item: Recorded) -> list[tuple[int, int, int]]:
    """Per answer position i >= 1: (lookup's match length, proposal length, how many of the proposal
    the answer keeps), as the engine's drafter proposes from the prompt and the answer before i."""
    lookup = PromptLookupDrafter(2, 16)
    out = [(0, 0, 0)]
    for i in range(1, len(item.answer)):
        p = lookup.propose(item.prompt + item.answer[:i], COPY_K_MAX, None, prompt=len(item.prompt))
        kept = next((j for j, t in enumerate(p.tokens) if i + j >= len(item.answer) or item.answer[i + j] != t),
                    len(p.tokens))
        out.append((p.match_length, len(p.tokens), kept))
    return out


def lookup_ceiling(item: Recorded, costs: Costs) -> float:
    """The most any lookup policy could reach on this answer: at each position either a plain step or
    a draft of k of the proposal's tokens, verify(k + 1) single steps for the kept prefix and the
    target's token after it, chosen knowing the answer (shortest total cost, by dynamic programming)."""
    proposals, n = _proposals(item), len(item.answer)
    least = [0.0] * (n + 1)  # least[i]: single steps to emit the answer from position i on
    for i in range(n - 1, 0, -1):
        _, available, kept = proposals[i]
        least[i] = costs.steps(1) + least[i + 1]
        for k in range(1, available + 1):
            least[i] = min(least[i], costs.steps(k + 1) + least[min(n, i + min(k, kept) + 1)])
    return (n - 1) / least[1] if n > 1 else 1.0


def fixed_rule(item: Recorded, costs: Costs, *, k: int, min_match: int) -> float:
    """Lookup drafting k tokens (or the proposal's length) wherever the match has min_match tokens."""
    proposals, n = _proposals(item), len(item.answer)
    i, spent = 1, 0.0
    while i < n:
        match, available, kept = proposals[i]
        drafted = min(k, available, item.max_tokens - i - 1) if match >= min_match else 0  # room, as replay_one
        spent += costs.steps(drafted + 1)
        i += min(drafted, kept) + 1
    return (n - 1) / spent if spent else 1.0


FIXED_RULES = ((4, 4), (4, 8), (16, 8), (16, 16))  # (k, min_match)


def ceiling_table(items: Sequence[Recorded], costs: Costs, auto: dict[tuple[str, str], dict[str, float]]) -> list[str]:
    """Per suite: each answer's ceiling, the fixed rules and auto's replay, and their medians."""
    lines = []
    for suite in dict.fromkeys(i.suite for i in items):
        mine = [i for i in items if i.suite == suite]
        rows = {"ceiling": [lookup_ceiling(i, costs) for i in mine]}
        for k, m in FIXED_RULES:
            rows[f"k={k} at m>={m}"] = [fixed_rule(i, costs, k=k, min_match=m) for i in mine]
        rows["auto (replay)"] = [auto[suite, "auto"][i.key] for i in mine]
        # llama-server's n-gram drafters on the same answers and curve: what they draft, not how fast their passes run.
        for i in mine:
            for name, priced in price_rules(i.prompt, i.answer, costs.steps).items():
                rows.setdefault(f"llama.cpp {name}", []).append(priced.speedup)
        lines.append(f"{suite}: " + " ".join(i.key for i in mine))
        lines += [f"  {name:15} median {statistics.median(v):.3f} | " + " ".join(f"{x:.2f}" for x in v)
                  for name, v in rows.items()]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    rec = sub.add_parser("record", help="run a plan's items greedily (--plan predicted or goals) and keep the answers")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--plan", choices=("predicted", "goals"), default="predicted")
    rep = sub.add_parser("replay", help="replay auto and auto+prediction over recorded answers")
    rep.add_argument("answers", type=Path)
    rep.add_argument("--curve", type=Path, required=True, help="a bench.json or a calibration file")
    rep.add_argument("--seeds", type=int, default=6)
    rep.add_argument("--trace", action="append", default=[], help="print each draft of this item (repeatable)")
    cei = sub.add_parser("ceiling", help="the most lookup could reach on recorded answers, beside fixed rules and auto")
    cei.add_argument("answers", type=Path)
    cei.add_argument("--curve", type=Path, required=True, help="a bench.json or a calibration file")
    ask = sub.add_parser("asks", help="the goals plan's prompts asked again in one auto engine, priced on a curve")
    ask.add_argument("--curve", type=Path, required=True, help="a bench.json or a calibration file")
    ask.add_argument("--repeats", type=int, default=3)
    ask.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.verb == "asks":
        asks(args.curve, args.repeats, args.out)
        return
    if args.verb == "record":
        record(args.out, args.plan)
        return
    from localspec.engine.runtime import Vocabulary
    from localspec.service import resolve_models

    files, _ = resolve_models(need_draft=False)
    items = [Recorded(**row) for row in json.loads(args.answers.read_text())]
    if args.verb == "ceiling":
        with Vocabulary(files.target) as vocab:
            auto = summary(replay(items, load_curve(args.curve), vocab, seed=1))
        print("\n".join(ceiling_table(items, load_curve(args.curve), auto)))
        return
    with Vocabulary(files.target) as vocab:
        tables = []
        for seed in range(1, args.seeds + 1):
            runs = replay(items, load_curve(args.curve), vocab, seed=seed)
            tables.append(summary(runs))
            for (_, key, mode), rs in runs.items():
                if key in args.trace and seed == 1:
                    for n, r in enumerate(rs):
                        print(f"{key} {mode} repeat {n}: {r.speedup:.3f}x  {' | '.join(r.drafts)}")
    for suite, mode in tables[0]:
        keys = tables[0][suite, mode]
        means = {k: statistics.mean(t[suite, mode][k] for t in tables) for k in keys}
        medians = statistics.mean(statistics.median(t[suite, mode].values()) for t in tables)
        worst = statistics.mean(min(t[suite, mode].values()) for t in tables)
        cells = " ".join(f"{k[:10]} {v:.2f}" for k, v in means.items())
        print(f"{suite:9} {mode:15} median {medians:.3f}  worst {worst:.3f}  | {cells}")


if __name__ == "__main__":
    main()
