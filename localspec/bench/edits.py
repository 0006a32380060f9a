"""The `predicted` plan's workload: whole-file edits, every mode interleaved per edit, and whether
each mode's greedy answer is `off`'s.

Two suites. `predicted`: the held-in tasks of data/predicted.json, asked as `localspec edit` asks
them (EditTask's messages, the file as the prediction, edit's reply budget). `editing`: the shipped
editing prompts of suites.json, untouched, with the code in each prompt (its fenced blocks) as the
prediction. Only modes whose ModeSpec says `prediction` send it.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib import resources

import numpy as np

from localspec.bench.runner import SHUFFLE_SEED, BenchPlan, Generated, ModeSpec, load_suites, run_request, run_row
from localspec.cli.edit_cmd import TEMPLATE_SLACK, reply_budget
from localspec.edit.reply import fenced_blocks
from localspec.edit.task import EditTask
from localspec.engine.chat import ChatMessage
from localspec.engine.config import GenerationRequest
from localspec.engine.drafters import common_prefix
from localspec.engine.runtime import Row
from localspec.engine.scheduler import Engine
from localspec.errors import ConfigError

TASKS = "predicted"  # the suite of held-in edit tasks
OFF = ModeSpec("off", "off")
# Logit units: the target's top-2 gap under which a greedy divergence counts as a near-tie. The
# threshold tests/test_engine_real.py holds speculative decoding to: one batch of rows and one row
# at a time give logits that differ by up to ~0.6 (mean ~0.09) on a CPU build.
NEAR_TIE = 0.5
CONTEXT_CHARS = 30  # of each answer shown either side of a difference
CONTEXT_STEP = 256  # n_ctx is rounded up to this

TokenCount = Callable[[str], int]


@dataclass(frozen=True)
class EditBenchTask:
    id: str
    shape: str  # what kind of edit (rename, add types, ...), as the issue lists them
    file: str  # the name the model sees
    text: str
    instruction: str

    def edit(self) -> EditTask:
        return EditTask(name=self.file, text=self.text, instruction=self.instruction)

    def to_json(self) -> dict:
        return {"id": self.id, "shape": self.shape, "file": self.file}


def parse_tasks(raw: object) -> list[EditBenchTask]:
    """The tasks of a predicted.json; a ValueError names what is malformed."""
    tasks = raw.get("tasks") if isinstance(raw, dict) else None
    if not isinstance(tasks, list) or not tasks:
        raise ValueError("predicted.json needs a non-empty list 'tasks'")
    out = []
    for n, t in enumerate(tasks):
        fields = ("id", "shape", "file", "text", "instruction")
        if not isinstance(t, dict) or any(not isinstance(t.get(f), str) or not t[f].strip() for f in fields):
            raise ValueError(f"task {n} needs a non-empty string for each of {', '.join(fields)}")
        out.append(EditBenchTask(**{f: t[f] for f in fields}))
    ids = [t.id for t in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"task ids repeat: {ids}")
    return out


def load_tasks() -> list[EditBenchTask]:
    text = resources.files("localspec.bench").joinpath("data/predicted.json").read_text(encoding="utf-8")
    return parse_tasks(json.loads(text))


def code_in(prompt: str) -> str | None:
    """The prompt's fenced blocks, fences included (a closing one added where the prompt left it
    open), one blank line apart: the reply of a model that returns the code unchanged."""
    blocks, _ = fenced_blocks(prompt)
    lines = prompt.split("\n")
    out = []
    for b in blocks:
        opening = lines[b.start_line - 1].strip()
        fence = opening[: len(opening) - len(opening.lstrip(opening[0]))]
        body = b.body if b.body.endswith("\n") else b.body + "\n"  # a closed block's text ends with one
        out.append(f"{opening}\n{body}{fence}")
    return "\n\n".join(out) or None


@dataclass(frozen=True)
class BenchItem:
    """One edit as every mode is asked it."""

    suite: str
    key: str  # the task's id, or the shipped prompt's index
    messages: tuple[ChatMessage, ...]
    prediction: str
    max_tokens: int
    prompt_tokens: int  # the messages' tokens and the chat template's slack

    @property
    def context(self) -> int:
        return self.prompt_tokens + self.max_tokens

    def request(self, spec: ModeSpec, *, repeat: int = 0) -> GenerationRequest:
        """Greedy (the default sampling); the prediction only where the mode sends one. Each mode and
        repeat is its own client, so every ask is a first ask, as an editor asks an edit once: a
        repeat that copied the earlier repeat's answer measured lookup over history, not the
        prediction (docs/predicted-outputs.md)."""
        return GenerationRequest(messages=list(self.messages), max_tokens=self.max_tokens, mode=spec.mode, k=spec.k,
                                 prediction=self.prediction if spec.prediction else None,
                                 history_scope=f"bench:{spec.name}:{repeat}")


def _item(suite: str, key: str, messages: Sequence[ChatMessage], prediction: str, code: str, count: TokenCount,
          requested: int | None) -> BenchItem:
    prompt = sum(count(m.content) for m in messages) + TEMPLATE_SLACK
    return BenchItem(suite=suite, key=key, messages=tuple(messages), prediction=prediction,
                     max_tokens=reply_budget(count(code), requested), prompt_tokens=prompt)


def task_item(task: EditBenchTask, count: TokenCount, requested: int | None = None) -> BenchItem:
    edit = task.edit()
    return _item(TASKS, task.id, edit.messages(), edit.prediction(), task.text, count, requested)


def prompt_item(suite: str, index: int, prompt: str, count: TokenCount,
                requested: int | None = None) -> BenchItem | None:
    """A shipped prompt as it is; None when it holds no code to predict."""
    code = code_in(prompt)
    if code is None:
        return None
    return _item(suite, str(index), [ChatMessage(role="user", content=prompt)], code, code, count, requested)


def plan_items(plan: BenchPlan, count: TokenCount) -> list[BenchItem]:
    """Every item of the plan's suites, in order; `count` is the target's tokenizer (budgets, context)."""
    requested = plan.max_tokens or None  # 0: each reply's budget as `localspec edit` sizes it
    items: list[BenchItem] = []
    for suite in plan.suites:
        if suite == TASKS:
            items += [task_item(t, count, requested) for t in load_tasks()[: plan.prompt_count(suite)]]
            continue
        for n, prompt in enumerate(plan.prompts(suite, load_suites())):
            item = prompt_item(suite, n, prompt, count, requested)
            if item is not None:
                items.append(item)
    return items


def context_for(items: Sequence[BenchItem], *, floor: int, trained: int | None) -> int:
    """n_ctx for the largest item (prompt and reply budget), at least `floor`, at most `trained`
    (the model's trained context; None: unknown, no bound)."""
    if not items:
        raise ConfigError("The plan has no edits to run.", "Check --suites and --prompts.")
    largest = max(items, key=lambda i: i.context)
    need = max(floor, -(-largest.context // CONTEXT_STEP) * CONTEXT_STEP)
    if trained is None:
        return need
    if largest.context > trained:
        raise ConfigError(f"{largest.suite} {largest.key} needs {largest.context:,} tokens of context (prompt "
                          f"{largest.prompt_tokens:,} + reply {largest.max_tokens:,}); the model was trained on "
                          f"{trained:,}.", "Leave that edit out with --prompts, or give --max-tokens.")
    return min(trained, need)


@dataclass(frozen=True)
class Outcome:
    item: BenchItem
    mode: str
    rep: int
    generated: Generated

    @property
    def key(self) -> tuple[str, str, int]:
        return self.item.suite, self.item.key, self.rep

    def row(self) -> dict:
        """bench.json's run, with the prediction's counts and the answer's text (for identity)."""
        done = self.generated.done
        s = done.stats
        return {**run_row(self.item.suite, self.item.key, self.rep, self.mode, done),
                "prompt_tokens": s.prompt_tokens, "target_passes": s.target_passes,
                "prediction_tokens": s.prediction_tokens, "prediction_drafted": s.prediction_drafted,
                "prediction_accepted": s.prediction_accepted, "text": done.text, "error": done.error}


def run_items(engine: Engine, plan: BenchPlan, items: Sequence[BenchItem],
              tick: Callable[[str], None]) -> list[Outcome]:
    """Each repeat runs every item's modes back to back, in a shuffled order (as run_modes does), so
    a slow spell of the machine hits the modes of an item alike."""
    rng = random.Random(SHUFFLE_SEED)
    out = []
    for rep in range(plan.repeats):
        for item in items:
            order = list(plan.modes_for(item.suite))
            rng.shuffle(order)
            for spec in order:
                tick(f"{item.suite} {item.key} {spec.name}")
                out.append(Outcome(item, spec.name, rep, run_request(engine, item.request(spec, repeat=rep))))
    return out


# ---------------------------------------------------------------------------- greedy identity


@dataclass(frozen=True)
class Tie:
    gap: float  # the target's top-2 logit gap where the answers part, from a fresh prefill
    top_two: bool  # both answers' tokens there are the target's two best


TieCheck = Callable[[BenchItem, Sequence[int], Sequence[int], int], Tie | None]


@dataclass(frozen=True)
class Difference:
    """Where a mode's answer first departs from `off`'s for the same item and repeat."""

    suite: str
    key: str
    rep: int
    mode: str
    token: int  # index of the first differing token
    char: int  # of the first differing character
    off: str  # off's answer around that character
    got: str  # the mode's
    tie: Tie | None = None  # None: not checked

    @property
    def near_tie(self) -> bool | None:
        """A proven near-tie (as tests/test_engine_real.py proves one); None: not checked."""
        if self.tie is None:
            return None
        return self.tie.top_two and self.tie.gap < NEAR_TIE

    def to_json(self) -> dict:
        return {**asdict(self), "near_tie": self.near_tie}


@dataclass(frozen=True)
class Identity:
    compared: int  # answers compared with off's
    differences: list[Difference]

    def to_json(self) -> dict:
        return {"compared": self.compared, "differences": [d.to_json() for d in self.differences]}


def _around(text: str, at: int) -> str:
    return text[max(0, at - CONTEXT_CHARS): at + CONTEXT_CHARS]


def identity(outcomes: Sequence[Outcome], check: TieCheck | None = None) -> Identity:
    """Every answer against `off`'s for the same item and repeat; `check` judges each difference."""
    off = {o.key: o for o in outcomes if o.mode == OFF.name}
    compared, diffs = 0, []
    for o in outcomes:
        ref = off.get(o.key)
        if o.mode == OFF.name or ref is None:
            continue
        compared += 1
        a, b = ref.generated.done.text, o.generated.done.text
        if a == b:
            continue
        char = len(os.path.commonprefix([a, b]))
        ref_ids, ids = ref.generated.ids, o.generated.ids
        token = common_prefix(ref_ids, ids)
        tie = check(o.item, ref_ids, ids, token) if check is not None else None
        diffs.append(Difference(suite=o.item.suite, key=o.item.key, rep=o.rep, mode=o.mode, token=token, char=char,
                                off=_around(a, char), got=_around(b, char), tie=tie))
    return Identity(compared, diffs)


def fresh_logits(engine: Engine, history: Sequence[int]) -> np.ndarray:
    """The target's next-token logits after `history`, prefilled into an emptied slot 0 (emptied
    again after: the engine's next request prefills its prompt anew)."""
    slot = engine.slots[0]
    engine._reset_kv(slot)
    try:
        rows = [Row(t, i, slot.seq, logits=i == len(history) - 1) for i, t in enumerate(history)]
        return engine.target.decode(rows)[-1]
    finally:
        engine._reset_kv(slot)


def tie_check(engine: Engine) -> TieCheck:
    """The near-tie check of the engine's real-model tests, on an idle engine: the logits where off's
    answer and the mode's part, and whether their tokens there are the two best and how close."""

    def check(item: BenchItem, ref: Sequence[int], got: Sequence[int], at: int) -> Tie | None:
        prompt, _ = engine.prompt_tokens(item.request(OFF))
        logits = fresh_logits(engine, [*prompt, *ref[:at]])
        best = [int(t) for t in np.argsort(logits)[-2:]]
        # An answer that ended here chose an end-of-generation token (it is not among the streamed ids).
        chosen = [ids[at] if at < len(ids) else None for ids in (ref, got)]
        top_two = all(t in best if t is not None else any(engine.target.is_eog(b) for b in best) for t in chosen)
        return Tie(gap=float(logits[best[1]] - logits[best[0]]), top_two=top_two)

    return check

