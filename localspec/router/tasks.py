"""The evaluation task set: coding functions with unit tests, and arithmetic word problems.

The set lives in `evals/router/tasks.jsonl` (found by localspec.evals), one JSON object a line:
`{"id", "kind": "code"|"math", "prompt", "tests": [assert lines]}` or `{..., "answer": number}`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.errors import ConfigError


def default_tasks() -> Path:
    """The committed task set; raises EvalDataMissing when the evals folder is not on this machine."""
    from localspec.evals import eval_file

    return eval_file("router", "tasks.jsonl")


def shipped_outcomes() -> Path:
    """The committed outcomes of both tiers on the task set (what `router eval` replays)."""
    from localspec.evals import eval_file

    return eval_file("router", "outcomes.json")


@dataclass(frozen=True)
class Task:
    id: str
    kind: str  # "code" | "math"
    prompt: str
    tests: tuple[str, ...] = ()
    answer: float | None = None

    def messages(self) -> list[dict]:
        return [{"role": "user", "content": self.prompt}]

    def prompt_hash(self) -> str:
        """What a cached outcome depends on besides the model: the prompt and how it is checked."""
        blob = json.dumps([self.kind, self.prompt, list(self.tests), self.answer])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def jsonl_rows(path: Path, what: str, fix: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, decoded JSON object) of each non-blank line. An unreadable file or a line that
    is not a JSON object is a ConfigError naming the file and line; callers check the fields."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"Cannot read the {what} file {path}: {exc.strerror or exc}.", fix) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a {what} file: it is not UTF-8 (byte 0x{exc.object[exc.start]:02x} at "
                          f"offset {exc.start}).", fix) from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{n}: not a valid {what} ({exc}).", fix) from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}:{n}: not a valid {what} (not a JSON object).", fix)
        yield n, row


def load_tasks(path: Path | None = None) -> list[Task]:
    path = path or default_tasks()
    tasks: list[Task] = []
    seen: set[str] = set()
    fix = "Each line needs id, kind (code|math), prompt, and tests or answer."
    for n, raw in jsonl_rows(path, "task", fix):
        try:
            kind = raw["kind"]
            if kind == "code":
                task = Task(str(raw["id"]), kind, str(raw["prompt"]), tests=tuple(str(t) for t in raw["tests"]))
                if not task.tests:
                    raise ValueError("a code task needs tests")
            elif kind == "math":
                task = Task(str(raw["id"]), kind, str(raw["prompt"]), answer=float(raw["answer"]))
            else:
                raise ValueError(f"unknown kind {kind!r}")
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{path}:{n}: not a valid task ({exc}).", fix) from None
        if task.id in seen:
            raise ConfigError(f"{path}:{n}: task id {task.id!r} appears twice.", "Give every task a unique id.")
        seen.add(task.id)
        tasks.append(task)
    return tasks


def _by_kind_hashed(tasks: list[Task]) -> dict[str, list[Task]]:
    """Each kind's tasks in a fixed order that does not depend on the file's order: by id hash."""
    return {kind: sorted((t for t in tasks if t.kind == kind), key=lambda t: hashlib.sha256(t.id.encode()).hexdigest())
            for kind in sorted({t.kind for t in tasks})}


def _in_file_order(tasks: list[Task], subset: list[Task]) -> list[Task]:
    order = {t.id: i for i, t in enumerate(tasks)}
    return sorted(subset, key=lambda t: order[t.id])


def split(tasks: list[Task]) -> tuple[list[Task], list[Task]]:
    """Deterministic ~50/50 train/held-out split, per kind, by the hash of each id."""
    train: list[Task] = []
    held: list[Task] = []
    for group in _by_kind_hashed(tasks).values():
        half = len(group) // 2
        train += group[:half]
        held += group[half:]
    return _in_file_order(tasks, train), _in_file_order(tasks, held)


def kfold(tasks: list[Task], k: int) -> list[tuple[list[Task], list[Task]]]:
    """k deterministic (train, held-out) splits; every task is held out in exactly one of them.

    Stratified by kind (each kind is dealt round-robin, in id-hash order, into the k folds), so every
    fold has the same mix of code and math. Cross-validation lets every task count as held out
    once, by a model that never saw it, which doubles the evaluated tasks of a single 50/50 split.
    """
    if k < 2:
        raise ValueError("cross-validation needs at least 2 folds")
    fold_of: dict[str, int] = {}
    for group in _by_kind_hashed(tasks).values():
        for i, t in enumerate(group):
            fold_of[t.id] = i % k
    return [([t for t in tasks if fold_of[t.id] != f], [t for t in tasks if fold_of[t.id] == f]) for f in range(k)]
