"""Where the evaluation data lives: the labelled cache pairs and the router's task set.

The data is not in the package (it is most of a wheel's size and no request needs it). The eval
commands find it in `evals/` beside the package in a checkout, or in the folder LOCALSPEC_EVALS_DIR
names (for an installed wheel: a copy of the repository's `evals/`). Without either, they stop
with one line that says where to get it; nothing is downloaded.
"""

from __future__ import annotations

import os
from pathlib import Path

from localspec.errors import ConfigError

EVALS_ENV = "LOCALSPEC_EVALS_DIR"


class EvalDataMissing(ConfigError):
    """The evaluation data is not on this machine."""


def evals_dir() -> Path:
    """$LOCALSPEC_EVALS_DIR when set, else the checkout's `evals/` folder."""
    named = os.environ.get(EVALS_ENV)
    if named:
        path = Path(named).expanduser()
        if not path.is_dir():
            raise EvalDataMissing(f"{EVALS_ENV} names {path}, which is not a folder.",
                                  "Point it at a copy of the localspec repository's evals/ folder.")
        return path
    return Path(__file__).resolve().parents[1] / "evals"


def eval_file(*parts: str) -> Path:
    """One data file under the evals folder, e.g. eval_file("router", "tasks.jsonl")."""
    path = evals_dir().joinpath(*parts)
    if not path.is_file():
        raise EvalDataMissing(
            f"The evaluation data {'/'.join(parts)} is not here (looked in {path.parent}).",
            f"Run from a checkout of the localspec repository, or set {EVALS_ENV} to a copy of its evals/ folder.",
        )
    return path
