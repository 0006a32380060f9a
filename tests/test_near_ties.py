"""Near-ties settled as the same question's earlier answer settled them (verify.settle_near_ties).

llama.cpp reads a row in a batch of several with other kernels than alone, so a greedy argmax at a
near-tie may go the other way in a verify pass than in the plain step that made the earlier answer.
The fake runtime here does exactly that at one known position, so what the engine does there is exact.
"""

from __future__ import annotations

import numpy as np
import pytest

from localspec.engine.config import EngineConfig, GenerationRequest
from localspec.engine.events import Done, Token
from localspec.engine.sampling import SamplingParams
from localspec.engine.scheduler import Engine
from localspec.engine.verify import TIE_MARGIN, Draft, settle_near_ties, verify_greedy
from tests.fake_runtime import FakeRuntime

NV = 5
PROMPT = [3, 1, 4, 1, 0, 2, 2, 4, 3, 0, 1, 1, 4, 2, 0, 3, 3, 2]  # 18 tokens: a full 16-token history match
TIE = 6  # the answer's 7th token is a near-tie (a row inside the first copy of 16)
BONUS = 17  # the first copy's row after its 16 drafted tokens: the answer's 18th
GAP = 0.05  # read alone, the chain's next token leads by this much


class BatchShapedRuntime(FakeRuntime):
    """The next token is (last + 1) % NV by 4 logits; at the answer's token `tie` the one after it is within
    GAP, read alone, and `shift` more in passes of several rows."""

    def __init__(self, shift: float, tie: int = TIE) -> None:
        self.tie_at = len(PROMPT) + tie  # the history length the tied row reads
        super().__init__(self.chain, n_normal=NV, n_seq_max=1, n_ctx=256)
        self.shift = shift

    def chain(self, history: tuple[int, ...]) -> np.ndarray:
        z = np.zeros(NV + 1, dtype=np.float32)
        z[(history[-1] + 1) % NV] = 4.0
        if len(history) == self.tie_at:
            z[(history[-1] + 2) % NV] = 4.0 - GAP
        z[NV] = -np.inf
        return z

    def decode(self, rows):
        out = super().decode(rows)
        logit_rows = [r for r in rows if r.logits]
        if len(rows) > 1:
            for i, r in enumerate(logit_rows):
                if r.pos + 1 == self.tie_at:
                    out[i, (r.token + 2) % NV] += self.shift
        return out


def ask(engine: Engine, *, mode: str, sampling: SamplingParams | None = None) -> tuple[list[int], Done]:
    request = GenerationRequest(prompt=" ".join(map(str, PROMPT)), max_tokens=24, mode=mode, k=16,
                                sampling=sampling or SamplingParams())
    ids: list[int] = []
    done = None
    for ev in engine.generate(request):
        if isinstance(ev, Token):
            ids.extend(ev.ids)
        elif isinstance(ev, Done):
            done = ev
    assert done is not None and done.error is None
    return ids, done


def engine_for(shift: float, tie: int = TIE) -> Engine:
    return Engine(BatchShapedRuntime(shift, tie), config=EngineConfig(n_ctx=256, parallel=1, pinned_prefix_cells=0))


def chain(n: int, after: int, tie: int | None = None) -> list[int]:
    out, last = [], after
    for i in range(n):
        last = (last + 2) % NV if tie is not None and i == tie else (last + 1) % NV
        out.append(last)
    return out


def test_an_answer_asked_again_is_made_again_through_a_near_tie_a_batch_reads_the_other_way():
    engine = engine_for(shift=2 * GAP)  # in a verify pass the runner-up leads by GAP: float noise
    first, _ = ask(engine, mode="off")
    assert first == chain(24, PROMPT[-1])  # plain steps read the tie alone: the chain goes on
    again, done = ask(engine, mode="lookup")
    assert done.stats.drafted >= 16 and done.stats.near_ties_settled == 1
    assert again == first


def test_the_row_after_a_copy_kept_whole_follows_the_earlier_answer_too():
    engine = engine_for(shift=2 * GAP, tie=BONUS)
    first, _ = ask(engine, mode="off")
    assert first == chain(24, PROMPT[-1])
    again, done = ask(engine, mode="lookup")
    assert done.stats.near_ties_settled == 1 and again == first


@pytest.mark.parametrize("penalties", [(0.1, None), (None, 0.1), (0.1, 0.2)])
def test_an_earlier_answer_picked_with_other_penalties_settles_nothing(penalties):
    """Its picks are the argmax of other logits: not this request's pick up to float noise."""
    first_penalty, again_penalty = (SamplingParams(presence_penalty=p) if p else SamplingParams() for p in penalties)
    engine = engine_for(shift=2 * GAP)
    first, _ = ask(engine, mode="off", sampling=first_penalty)
    assert first == chain(24, PROMPT[-1])  # every chain token is seen alike: the penalty moves none of them apart
    again, done = ask(engine, mode="lookup", sampling=again_penalty)
    assert done.stats.near_ties_settled == 0 and again[6] == (first[5] + 2) % NV
    # With the same penalties it is the same rule, and the tie is settled.
    engine = engine_for(shift=2 * GAP)
    ask(engine, mode="off", sampling=first_penalty)
    same, done = ask(engine, mode="lookup", sampling=first_penalty)
    assert done.stats.near_ties_settled == 1 and same == first


def test_without_the_margin_the_same_ask_parts_at_the_tie(monkeypatch):
    """The control: with no margin, the verify pass decides the tie the other way, so the test above
    could fail (following the earlier answer's pick at exactly this context is what made it again)."""
    monkeypatch.setattr("localspec.engine.verify.TIE_MARGIN", 0.0)
    engine = engine_for(shift=2 * GAP)
    first, _ = ask(engine, mode="off")
    again, done = ask(engine, mode="lookup")
    assert done.stats.near_ties_settled == 0
    assert again[:6] == first[:6] and again[6] == (first[5] + 2) % NV


def test_a_difference_past_the_margin_parts_the_answers_where_the_verify_pass_says():
    engine = engine_for(shift=GAP + TIE_MARGIN + 0.1)  # the runner-up leads by 0.35 in a verify pass
    first, _ = ask(engine, mode="off")
    again, done = ask(engine, mode="lookup")
    assert done.stats.near_ties_settled == 0
    assert again[:6] == first[:6] and again[6] == (first[5] + 2) % NV  # the verify pass's argmax


def test_a_sampled_earlier_answer_settles_nothing():
    """Its tokens were drawn, not the target's greedy picks: they say nothing about a tie."""
    engine = engine_for(shift=2 * GAP)
    first, _ = ask(engine, mode="off", sampling=SamplingParams(temperature=0.01, seed=1))
    assert first == chain(24, PROMPT[-1])
    again, done = ask(engine, mode="lookup")
    assert done.stats.near_ties_settled == 0 and again[6] == (first[5] + 2) % NV


def test_auto_settles_the_same_tie_and_its_bonus_rows_too():
    from localspec.engine.costs import Costs

    engine = Engine(BatchShapedRuntime(shift=2 * GAP), config=EngineConfig(
        n_ctx=256, parallel=1, pinned_prefix_cells=0, mode="auto", auto_explore=0.0))
    engine.costs = Costs(verify=[0.03 + 0.002 * n for n in range(64)], draft_step=0.02, draft_row=0.005, pinned=True)
    first, _ = ask(engine, mode="off")
    again, done = ask(engine, mode="auto")
    assert done.stats.near_ties_settled == 1 and again == first


# ---------------------------------------------------------------- the rule alone


def rows_with(ties: dict[int, tuple[int, float]], n: int, best: list[int]) -> list[np.ndarray]:
    """Rows whose argmax is best[i], with token ties[i][0] ties[i][1] below it."""
    out = []
    for i in range(n):
        row = np.zeros(NV, dtype=np.float32)
        row[best[i]] = 5.0
        if i in ties:
            token, below = ties[i]
            row[token] = 5.0 - below
        out.append(row)
    return out


def test_the_rule_settles_only_near_ties_at_exactly_the_earlier_context():
    earlier = [1, 2, 3, 4, 0]
    # Row 2 is a near-tie read the other way: settled, and the whole draft is kept.
    rows = rows_with({2: (3, 0.1)}, 6, [1, 2, 4, 4, 0, 1])
    targets = [int(np.argmax(r)) for r in rows]
    settled, n = settle_near_ties(targets, rows.__getitem__, earlier, earlier)
    assert n == 1 and settled == [1, 2, 3, 4, 0, 1]
    assert verify_greedy(settled, Draft(tuple(earlier))).accepted == 5
    # Past the margin it stands, and nothing after it (another text) is touched.
    rows = rows_with({2: (3, TIE_MARGIN + 0.01), 3: (4, 0.0)}, 6, [1, 2, 4, 1, 0, 1])
    targets = [int(np.argmax(r)) for r in rows]
    assert settle_near_ties(targets, rows.__getitem__, earlier, earlier) == (targets, 0)
    # A row after a draft token that is not the earlier answer's reads another context.
    rows = rows_with({1: (2, 0.1)}, 3, [1, 4, 0])
    targets = [int(np.argmax(r)) for r in rows]
    assert settle_near_ties(targets, rows.__getitem__, [0, 2], earlier)[1] == 0
    # The bonus row follows the earlier answer too, and an empty draft's one row (a plain step).
    rows = rows_with({2: (3, 0.2)}, 3, [1, 2, 0])
    assert settle_near_ties([1, 2, 0], rows.__getitem__, [1, 2], earlier) == ([1, 2, 3], 1)
    assert settle_near_ties([4], rows_with({0: (1, 0.2)}, 1, [4]).__getitem__, [], earlier) == ([1], 1)


def test_a_settled_token_is_always_within_the_margin_of_the_rows_top():
    rng = np.random.default_rng(3)
    for _ in range(600):
        rows = [rng.normal(scale=0.3, size=NV).astype(np.float32) for _ in range(4)]
        earlier = [int(rng.integers(NV)) for _ in range(4)]
        targets = [int(np.argmax(r)) for r in rows]
        out, _ = settle_near_ties(targets, rows.__getitem__, earlier[:3], earlier)
        for i, token in enumerate(out):
            assert rows[i][token] >= rows[i].max() - TIE_MARGIN
