"""The reuse judge: the answering model confirms a semantic hit before it is served.

Similarity and the guard's rules see words, not meaning. On pairs written blind to the rules they
served 6% of traps ("convert X to Y" against "Y to X", "who wrote" against "who translated") and
refused most real paraphrases ("combine my last four commits" against "squash the last 4").
So a semantic candidate that passes them goes to the model that would answer the request, which
is asked one yes/no question: do the two requests ask for the same thing? Its score is the margin

    score = logit(Yes) - logit(No)   (= logprob(Yes) - logprob(No): softmax's normaliser cancels)

read from the first token's log-probabilities; the hit is served when the score reaches the
threshold, chosen on the dev pairs (`localspec cache eval --split dev`).

Cost: one prefill of about 80 tokens on the answering model, no generated text; the system prompt
is shared by every question, so the engine's prefix reuse skips it. Measured on the 1.5B target on
the 2-core CPU here: about 0.6-1 s a judgement (a generated answer takes 10-30 s); on a GPU, tens of
milliseconds.
"""

from __future__ import annotations

import math
import queue
import time
from collections.abc import Callable

from localspec.engine.config import GenerationRequest
from localspec.engine.events import Done, Token, TokenLogprob

SYSTEM = "You check whether a saved answer can be reused for a new request."
QUESTION = (
    "Do both requests ask for exactly the same thing, so that a correct answer to the saved request is also a "
    "fully correct answer to the new one (same numbers, same language, same tools, same direction, nothing added "
    "or excluded)? Reply Yes or No."
)
TOP_LOGPROBS = 20  # the engine's maximum; "Yes" and "No" are nearly always both among them

# Chosen on the dev pairs (`localspec cache eval --split dev`) with JUDGED_THRESHOLD: the most
# paraphrase hits at a false-hit rate of at most half the goal (64.5% hits, 0.48% false hits).
DEFAULT_JUDGE_THRESHOLD = 1.0
# The similarity floor when a judge confirms: candidates from here up are put to it, after the
# guard's facts-only check (guard.conflict).
JUDGED_THRESHOLD = 0.64


def judge_request(saved: str, new: str) -> GenerationRequest:
    """One greedy token with its log-probabilities: the model's Yes or No."""
    return GenerationRequest(
        messages=[{"role": "system", "content": SYSTEM},
                  {"role": "user", "content": f"Saved request: {saved}\nNew request: {new}\n{QUESTION}"}],
        max_tokens=1, logprobs=TOP_LOGPROBS, mode="off",
    )


def yes_no_margin(logprob: TokenLogprob, yes_ids: set[int], no_ids: set[int]) -> float:
    """log P(Yes) - log P(No) from the first token's alternatives.

    A side missing from the top list is below the least likely one listed, so that value bounds it
    from above: a missing "No" gives a margin that is at most the true one (never too eager to
    serve), a missing "Yes" gives -inf.
    """
    listed = dict(logprob.top)
    listed.setdefault(logprob.token, logprob.logprob)
    floor = min(listed.values()) if listed else -math.inf
    yes = max((listed[t] for t in yes_ids if t in listed), default=None)
    no = max((listed[t] for t in no_ids if t in listed), default=None)
    if yes is None:
        return -math.inf
    return yes - (no if no is not None else floor)


# A judgement waits behind the engine's other work when every slot is busy; past this the lookup
# gives up (a miss: the request is generated) rather than hold the request.
DEFAULT_JUDGE_TIMEOUT_S = 10.0


class JudgeTimeout(RuntimeError):
    pass


class ModelJudge:
    """Judges with a loaded model through `submit` (a tier's queue or an engine's own)."""

    def __init__(self, submit: Callable[[GenerationRequest], object], tokenize: Callable[[str], list[int]],
                 threshold: float = DEFAULT_JUDGE_THRESHOLD, name: str = "",
                 timeout_s: float = DEFAULT_JUDGE_TIMEOUT_S) -> None:
        self._submit = submit
        self.threshold = threshold
        self.name = name
        self.timeout_s = timeout_s
        # The first token of each spelling the model may start its reply with.
        self.yes_ids = {ids[0] for ids in (tokenize(w) for w in ("Yes", " Yes", "yes")) if ids}
        self.no_ids = {ids[0] for ids in (tokenize(w) for w in ("No", " No", "no")) if ids}

    def score(self, saved: str, new: str) -> float:
        handle = self._submit(judge_request(saved, new))
        first: TokenLogprob | None = None
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                event = handle.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                handle.cancel()
                raise JudgeTimeout(f"the reuse judge gave no verdict within {self.timeout_s:g} s") from None
            if isinstance(event, Token) and first is None:
                first = event.logprob
            elif isinstance(event, Done):
                break
        if first is None:
            raise RuntimeError("the judge model returned no token")
        return yes_no_margin(first, self.yes_ids, self.no_ids)

    def agrees(self, saved: str, new: str) -> tuple[bool, float]:
        score = self.score(saved, new)
        return score >= self.threshold, score


__all__ = ["DEFAULT_JUDGE_THRESHOLD", "JUDGED_THRESHOLD", "JudgeTimeout", "ModelJudge", "judge_request",
           "yes_no_margin"]
