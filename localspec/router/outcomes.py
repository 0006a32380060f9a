"""Running each local tier on the tasks, and the cache of what it answered.

Generation is greedy (temperature 0) through the engine with the model's chat template. The
large tier is evaluated as its target alone (mode "off"): lossless speculative decoding gives
the identical greedy text with the draft, so the draft would only cost evaluation time.

Outcomes are cached in one JSON file keyed by task id + model file fingerprint + prompt hash +
max_tokens, so a re-run only generates what changed. A greedy answer that stopped on its own
before its cap is also the answer under any larger cap (the cap only ends generation; it never
changes a token before it), so a run with a larger --max-tokens regenerates only the answers
that were cut off.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from localspec.errors import ConfigError
from localspec.router.checker import check
from localspec.router.tasks import Task

if TYPE_CHECKING:
    from localspec.engine import SamplingParams
    from localspec.engine.scheduler import Engine

OUTCOMES_FORMAT = "localspec-router-outcomes"


@dataclass(frozen=True)
class Outcome:
    task_id: str
    tier: str
    model: str
    passed: bool
    latency_s: float
    completion_tokens: int
    mean_logprob: float | None
    finish_reason: str
    detail: str
    text: str = ""  # empty in the shipped cache (kept small); its verdict then stands as recorded


def outcome_key(task: Task, fingerprint: str, max_tokens: int) -> str:
    return f"{task.id}|{fingerprint}|{task.prompt_hash()}|{max_tokens}"


class OutcomeCache:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict] = {}
        if path.is_file():
            try:
                raw = json.loads(path.read_text(encoding="utf-8"))
                if raw.get("format") != OUTCOMES_FORMAT or not isinstance(raw.get("entries"), dict):
                    raise ValueError(f"not a {OUTCOMES_FORMAT} file")
                self.entries = raw["entries"]
            except (OSError, ValueError, AttributeError) as exc:
                raise ConfigError(f"Cannot use the outcome cache {path}: {exc}.",
                                  "Delete it or pass --fresh to regenerate.") from None

    def get(self, key: str) -> Outcome | None:
        e = self.entries.get(key)
        return Outcome(**e) if e else None

    def lookup(self, task: Task, fingerprint: str, max_tokens: int) -> Outcome | None:
        """The outcome under `max_tokens`: recorded under that cap, or an answer that stopped on its
        own under a smaller cap (the same greedy text)."""
        hit = self.get(outcome_key(task, fingerprint, max_tokens))
        if hit is not None:
            return hit
        return self._stopped_below(f"{task.id}|{fingerprint}|{task.prompt_hash()}|", max_tokens)

    def find(self, task: Task, tier: str, max_tokens: int) -> Outcome | None:
        """A cached outcome for the task's current prompt from any model file (for --from-outcomes,
        which must work where the models are not installed)."""
        suffix = f"|{task.prompt_hash()}|{max_tokens}"
        for key, e in self.entries.items():
            if key.startswith(task.id + "|") and key.endswith(suffix) and e.get("tier") == tier:
                return recheck(task, Outcome(**e))
        hit = self._stopped_below(task.id + "|", max_tokens, tier=tier, prompt_hash=task.prompt_hash())
        return None if hit is None else recheck(task, hit)

    def _stopped_below(self, prefix: str, max_tokens: int, tier: str | None = None,
                       prompt_hash: str | None = None) -> Outcome | None:
        """An entry under `prefix` (and of `tier`, for `prompt_hash`, when given) recorded with a
        smaller cap whose answer stopped before it."""
        for key, e in self.entries.items():
            head, _, cap = key.rpartition("|")
            if not key.startswith(prefix) or not cap.isdigit() or int(cap) >= max_tokens:
                continue
            if tier is not None and e.get("tier") != tier:
                continue
            if prompt_hash is not None and not head.endswith("|" + prompt_hash):
                continue
            if e.get("finish_reason") == "stop" and int(e.get("completion_tokens", max_tokens)) < int(cap):
                return Outcome(**e)
        return None

    def put(self, key: str, outcome: Outcome) -> None:
        self.entries[key] = asdict(outcome)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        body = {"format": OUTCOMES_FORMAT, "version": 1, "entries": dict(sorted(self.entries.items()))}
        tmp.write_text(json.dumps(body, indent=0, ensure_ascii=False) + "\n", encoding="utf-8")
        tmp.replace(self.path)


def recheck(task: Task, outcome: Outcome) -> Outcome:
    """A cached answer checked again, so a fixed checker applies without regenerating."""
    if not outcome.text:
        return outcome
    res = check(task, outcome.text)
    return replace(outcome, passed=res.passed, detail=res.detail)


@dataclass(frozen=True)
class Answer:
    """One generated answer, as `generate_answers` yields it."""

    index: int  # position in the task list given
    text: str
    seconds: float  # the request's own prefill + decode time (queueing excluded)
    completion_tokens: int
    token_logprobs: tuple[float, ...]  # each generated token's log-probability
    finish_reason: str

    @property
    def mean_logprob(self) -> float | None:
        lps = self.token_logprobs
        return sum(lps) / len(lps) if lps else None


def generate_answers(engine: Engine, tasks: list[Task], max_tokens: int,
                     sampling: SamplingParams | None = None) -> Iterator[Answer]:
    """Answers for `tasks` (greedy unless `sampling` says otherwise), submitted together so the
    engine's parallel slots batch them. Yields an `Answer` as each finishes; with more than one
    slot its seconds include sharing the steps with the other sequences.
    """
    import queue

    from localspec.engine import Done, GenerationRequest, SamplingParams, Token

    sampling = sampling or SamplingParams(temperature=0.0)
    handles = []
    for task in tasks:
        request = GenerationRequest(messages=task.messages(), max_tokens=max_tokens, sampling=sampling, logprobs=0)
        handles.append(engine.submit(request))
    logprobs: list[list[float]] = [[] for _ in tasks]
    pending = set(range(len(tasks)))
    try:
        while pending:
            engine.step()
            for i in list(pending):
                while True:
                    try:
                        event = handles[i].events.get_nowait()
                    except queue.Empty:
                        break
                    if isinstance(event, Token) and event.logprob is not None:
                        logprobs[i].append(event.logprob.logprob)
                    elif isinstance(event, Done):
                        pending.discard(i)
                        if event.error:
                            raise RuntimeError(f"task {tasks[i].id}: generation failed: {event.error}")
                        secs = (event.stats.prefill_ms + event.stats.decode_ms) / 1000.0
                        yield Answer(i, event.text, secs, event.stats.completion_tokens, tuple(logprobs[i]),
                                     event.finish_reason)
                        break
    finally:
        for i in pending:
            handles[i].cancel()
        while engine.busy:
            engine.step()


def run_tier(tier: str, model_id: str, model_path: Path, tasks: list[Task], cache: OutcomeCache,
             max_tokens: int, fresh: bool, open_engine: Callable[[], Engine],
             on_progress: Callable[[Outcome | None], None] = lambda o: None) -> list[Outcome]:
    """Outcomes of one tier on every task; the engine is opened only if something is missing."""
    from localspec.engine.embedder import file_fingerprint

    fingerprint = file_fingerprint(model_path)
    out: list[Outcome | None] = []
    todo: list[int] = []
    for i, task in enumerate(tasks):
        hit = None if fresh else cache.lookup(task, fingerprint, max_tokens)
        if hit is not None:
            hit = recheck(task, hit)
        out.append(hit)
        if hit is None:
            todo.append(i)
        else:
            on_progress(hit)
    if todo:
        engine = open_engine()
        try:
            batch = [tasks[i] for i in todo]
            for n, answer in enumerate(generate_answers(engine, batch, max_tokens), 1):
                i, task = todo[answer.index], batch[answer.index]
                res = check(task, answer.text)
                mean_lp = answer.mean_logprob
                o = Outcome(task.id, tier, model_id, res.passed, round(answer.seconds, 3), answer.completion_tokens,
                            None if mean_lp is None else round(mean_lp, 4), answer.finish_reason, res.detail,
                            answer.text)
                cache.put(outcome_key(task, fingerprint, max_tokens), o)
                out[i] = o
                if n % 10 == 0:
                    cache.save()  # a long run that is interrupted keeps what it generated
                on_progress(o)
        finally:
            cache.save()
            engine.close()
    return [o for o in out if o is not None]
