"""Replay `auto`'s choices over recorded greedy answers: a controller policy judged in seconds.

A bench run of the predicted plan takes 20 minutes, and on this shared 2-core box the same `auto`
code read 0.85-0.92x `off` on one task across runs: single-row passes alone moved between 33 and 37
ms from one request to the next. A policy change worth 3% cannot be seen that way. The replay takes
the clock out: the answers are recorded once (greedy, `off`), and each replayed step costs what the
pinned verify curve says, so two policies differ only by their choices.

    python scripts/replay_auto.py record --out answers.json      # the predicted plan's items (~3 min)
    python scripts/replay_auto.py replay answers.json --curve DIR/bench.json [--seeds 6] [--trace KEY]

Per item and position: lookup's proposal and the prediction's (the engine's own PromptLookupDrafter
and Prediction), the real Controller's choice, the drafted prefix the answer keeps; a pass of n rows
costs verify(n) single steps. The speed-up is the answer's tokens over the steps spent. Items run in
the bench's order with one shared acceptance book and explorer; each seed shuffles the modes per item
as the bench does, and the summary averages the seeds (the book's path moves single items by a few
percent). `--curve` takes a bench.json (its learned `costs`) or a calibration file.

Not replayed: the draft model (auto on the CPU bench rarely picks it), per-step overhead (Python,
logits copies), lookup over earlier requests, answers that part from `off`'s at a near-tie. Use it to compare policies; measure speed with `localspec bench`.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from localspec.engine.controller import AcceptanceBook, Controller, Explorer
from localspec.engine.costs import Costs
from localspec.engine.drafters import PromptLookupDrafter
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
        # As Active.ahead: a lookup copy kept whole learns whether the target's next token is the copy's next.
        ahead = (proposal.tokens[kept] == out[i + kept] if choice.drafter == "lookup" and kept == len(draft)
                 and kept < len(proposal) and i + kept < len(out) else None)
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
            for mode in (m for m in order if m in MODES):
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
    costs = Costs.from_json(data.get("costs", data))
    costs.pinned = True
    return costs


def record(out: Path) -> None:
    from localspec.bench.edits import plan_items
    from localspec.bench.runner import PREDICTED_MODES, predicted_plan, run_request
    from localspec.service import open_engine

    engine = open_engine(mode="off")
    count = lambda s: len(engine.target.tokenize(s, add_special=False, parse_special=False))  # noqa: E731
    off = next(m for m in PREDICTED_MODES if m.name == "off")
    rows = []
    for item in plan_items(predicted_plan(), count):
        request = item.request(off)
        prompt, _ = engine.prompt_tokens(engine.with_defaults(request))
        answer = run_request(engine, request).ids
        rows.append({"suite": item.suite, "key": item.key, "prompt": list(prompt), "answer": list(answer),
                     "prediction": item.prediction, "max_tokens": item.max_tokens})
        print(f"{item.suite} {item.key}: {len(prompt)} prompt tokens, {len(answer)} answer tokens", flush=True)
    out.write_text(json.dumps(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    rec = sub.add_parser("record", help="run the predicted plan's items greedily and keep the answers")
    rec.add_argument("--out", type=Path, required=True)
    rep = sub.add_parser("replay", help="replay auto and auto+prediction over recorded answers")
    rep.add_argument("answers", type=Path)
    rep.add_argument("--curve", type=Path, required=True, help="a bench.json or a calibration file")
    rep.add_argument("--seeds", type=int, default=6)
    rep.add_argument("--trace", action="append", default=[], help="print each draft of this item (repeatable)")
    args = ap.parse_args()
    if args.verb == "record":
        record(args.out)
        return
    from localspec.engine.runtime import Vocabulary
    from localspec.service import resolve_models

    files, _ = resolve_models(need_draft=False)
    items = [Recorded(**row) for row in json.loads(args.answers.read_text())]
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
