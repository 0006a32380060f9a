"""Several engine jobs for one request: OpenAI's `n` choices and llama.cpp's `n_cmpl` completions.

Each choice is its own job, so the engine decodes them together in its slots (--parallel). They are
admitted together (one refused cancels the rest) and given up together (a client gone, one failed).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from localspec.jobs import Job
from localspec.server.backend import Backend
from localspec.server.state import ServerState
from localspec.server.translate import Plan


async def submit_all(state: ServerState, b: Backend, plans: Sequence[Plan], *, model: str, owner: str) -> list[Job]:
    """A job per plan, in order. One refused (a full queue: 429; a 400) cancels those already
    submitted, which nobody would read."""
    jobs: list[Job] = []
    try:
        for plan in plans:
            jobs.append(await state.submit(b, plan, model=model, owner=owner))
    except BaseException:
        for job in jobs:  # each marked cancelled, even one already done: nobody reads it
            job.cancel()
        raise
    return jobs


def cancel_unfinished(jobs: Iterable[Job]) -> None:
    """Cancel the jobs still running: one choice failed, or the client left, and the others' answers
    are not wanted either."""
    for job in jobs:
        if not job.done.is_set():
            job.cancel()
