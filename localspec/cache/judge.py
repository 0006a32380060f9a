"""The reuse judge: the answering model confirms a semantic hit before it is served.

Similarity and the guard's rules see words, not meaning. On pairs written blind to the rules they
served 6% of traps ("convert X to Y" against "Y to X", "who wrote" against "who translated") and
refused most real paraphrases ("combine my last four commits" against "squash the last 4").
So a semantic candidate that passes them goes to the model that would answer the request, which
is asked one yes/no question: do the two requests ask for the same thing? It is asked twice, with
the requests in both orders, and each reading gives the margin

    margin = logit(Yes) - logit(No)   (= logprob(Yes) - logprob(No): softmax's normaliser cancels)

read from the first token's log-probabilities. The score is the smaller margin; the hit is served
when it reaches the threshold, chosen on the dev pairs (`localspec cache eval --split dev`).

The question comes with worked examples as earlier turns (EXAMPLES). They cost one prefill of
about 700 tokens once; the engine then keeps them pinned (GenerationRequest.pin_prefix), so each
judgement prefills only the two requests: about 30-60 tokens, no generated text. Measured on the
1.5B target on the 2-core CPU here: about 0.9 s a reading, so 1.8 s for a served hit and 0.9 s for a
candidate refused at the first reading (a generated answer takes 10-30 s); on a GPU, tens of
milliseconds.
"""

from __future__ import annotations

import math
import queue
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from localspec.engine.config import GenerationRequest
from localspec.engine.events import Done, Token, TokenLogprob

if TYPE_CHECKING:
    from localspec.engine.slots import Handle

SYSTEM = (
    "You check whether a saved answer can be reused for a new request. Reply Yes only if both requests ask for "
    "exactly the same thing, so that a correct answer to the saved request is also a fully correct answer to the "
    "new one: same numbers, same language, same library and tools, same direction, the same item or person, "
    "nothing added or excluded. Different wording, word order, abbreviations, politeness and typos do not matter. "
    "Otherwise reply No."
)
# Worked examples, given as earlier turns of the conversation. Written for this prompt, not taken
# from the evaluation pairs; they show the trap kinds (direction, numbers, exclusion, language,
# library, a different question about the same thing, a narrower task) next to rewordings. On the
# dev pairs they spread the Yes/No margin, and on the test half they halved the false hits at the
# same hit rate (docs/semantic-cache.md).
EXAMPLES: tuple[tuple[str, str, bool], ...] = (
    ("How can I remove duplicates from a list in Python?", "python: dedupe a list, what's the way?", True),
    ("Convert 10 miles to kilometers", "Convert 10 kilometers to miles", False),
    ("What is the capital of Australia?", "Which city is Australia's capital?", True),
    ("How do I sort a dict by value in Python?", "How do I sort a dict by key in Python?", False),
    ("git: undo the last commit but keep the changes",
     "How do I revert my latest commit without losing my edits in git?", True),
    ("What is 12% of 250?", "What is 15% of 250?", False),
    ("Read a CSV file in Python with pandas", "Read a CSV file in Python without pandas", False),
    ("Explain what a closure is in JavaScript", "What are JS closures? Please explain.", True),
    ("How do I parse JSON in Go?", "How do I parse JSON in Rust?", False),
    ("Who painted the Mona Lisa?", "Who stole the Mona Lisa?", False),
    ("What's the time complexity of binary search?", "Binary search: what is its big-O running time?", True),
    ("List all files in a directory in bash", "Count the files in a directory in bash", False),
    ("Encode a string to base64 in Python", "Decode a base64 string in Python", False),
    ("How do I make an HTTP GET request with requests?", "How do I make an HTTP GET request with httpx?", False),
    ("how to center a div with flexbox", "Center a div using CSS flexbox", True),
    ("Write a function that returns the largest number in an array",
     "Write a function that returns the two largest numbers in an array", False),
)
TOP_LOGPROBS = 20  # the engine's maximum; "Yes" and "No" are nearly always both among them

# Chosen on the dev pairs with JUDGED_THRESHOLD by evaluate.choose_threshold: the most paraphrase
# hits at a false-hit rate of at most half the goal (66% hits, 3 false hits of 838, both readings;
# scripts/cache_judge_prompts.py).
DEFAULT_JUDGE_THRESHOLD = 0.25
# The similarity floor when a judge confirms: candidates from here up are put to it, after the
# guard's facts-only check (guard.conflict).
JUDGED_THRESHOLD = 0.64


def _pair(saved: str, new: str) -> str:
    return f"Saved request: {saved}\nNew request: {new}"


_SHARED: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
for _saved, _new, _same in EXAMPLES:
    _SHARED += [{"role": "user", "content": _pair(_saved, _new)},
                {"role": "assistant", "content": "Yes" if _same else "No"}]


def judge_request(saved: str, new: str) -> GenerationRequest:
    """One greedy token with its log-probabilities: the model's Yes or No.

    Everything but the last message is the same for every judgement (about 700 tokens): the engine
    keeps it pinned (pin_prefix), so a judgement prefills only the two requests, even when the slot
    has served a chat since."""
    return GenerationRequest(
        messages=[*_SHARED, {"role": "user", "content": _pair(saved, new)}],
        max_tokens=1, logprobs=TOP_LOGPROBS, mode="off", pin_prefix=True,
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

    def __init__(self, submit: Callable[[GenerationRequest], Handle], tokenize: Callable[[str], list[int]],
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
        """The smaller margin of the two readings, saved-then-new and new-then-saved.

        A small model asked once is swayed by the order ("X to Y" then "Y to X" reads as a rewording
        more often than the other way round); a pair must convince it both ways. On the dev pairs
        that gave 5 more points of hits at the same false hits as one reading
        (scripts/cache_judge_prompts.py)."""
        return min(self.margin(saved, new), self.margin(new, saved))

    def margin(self, saved: str, new: str) -> float:
        """One reading's logit(Yes) - logit(No)."""
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

    def warm(self, wait: bool = False) -> None:
        """Queue one judgement whose verdict nobody reads: it prefills the shared instructions and
        examples, which the engine then keeps pinned. `wait`: return when it is done."""
        handle = self._submit(judge_request("", ""))
        if wait:
            handle.done.wait()

    def agrees(self, saved: str, new: str) -> tuple[bool, float]:
        """Whether both readings reach the threshold (the second is skipped when the first fails)."""
        first = self.margin(saved, new)
        if first < self.threshold:
            return False, first
        score = min(first, self.margin(new, saved))
        return score >= self.threshold, score


__all__ = ["DEFAULT_JUDGE_THRESHOLD", "JUDGED_THRESHOLD", "JudgeTimeout", "ModelJudge", "judge_request",
           "yes_no_margin"]
