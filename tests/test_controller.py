"""The auto controller's rule, on synthetic costs (no timing, no model)."""

from __future__ import annotations

import pytest

from localspec.engine.controller import (
    Acceptance,
    AcceptanceBook,
    Choice,
    Controller,
    Costs,
    expected_tokens,
    match_bucket,
)

# Measured on a 2-core CPU with the real pair (issue 9): target step 60 ms, draft step 27 ms,
# verify of 2/5/9 rows 105/161/338 ms. Intermediate sizes interpolated.
CPU = Costs(verify=[0.060, 0.105, 0.124, 0.142, 0.161, 0.200, 0.240, 0.290, 0.338], draft_step=0.027, draft_row=0.004)
# This workplace's 2-core CPU as `localspec bench` calibrated it (a 2-row verify costs 1.5 steps).
HERE = Costs(verify=[0.0436, 0.0662, 0.0910, 0.1128, 0.1339, 0.1966, 0.2246, 0.2768, 0.2645], draft_step=0.0251, draft_row=0.011)
# A GPU: a batch of 9 costs about one step.
GPU = Costs(verify=[0.020, 0.0205, 0.021, 0.0215, 0.022, 0.0225, 0.023, 0.0235, 0.024], draft_step=0.004, draft_row=0.0002)


def trained(costs: Costs, rate: float, steps: int = 200, k: int = 8) -> Controller:
    c = Controller(costs, k_max=k)
    c.draft = Acceptance(accepted=[rate * steps] * k, trials=[float(steps)] * k)
    return c


def test_expected_tokens_matches_closed_form():
    a = 0.8
    for k in range(0, 8):
        assert expected_tokens([a] * k) == pytest.approx((1 - a ** (k + 1)) / (1 - a))


def test_chooses_plain_decoding_when_drafting_cannot_pay():
    c = trained(CPU, rate=0.9)
    choice = c.choose(draft_lag=0, lookup_match=0, lookup_available=0, k_cap=8)
    assert choice.drafter == "off" and choice.k == 0
    assert choice.expected_rate == pytest.approx(1 / 0.060)


def test_chooses_a_long_draft_when_verification_is_nearly_free():
    c = trained(GPU, rate=0.9)
    choice = c.choose(draft_lag=0, lookup_match=0, lookup_available=0, k_cap=8)
    assert choice.drafter == "draft" and choice.k >= 5
    # ...but not when acceptance is poor.
    assert trained(GPU, rate=0.05).choose(0, 0, 0, 8).drafter == "off"


def test_catch_up_cost_can_tip_the_choice():
    c = trained(GPU, rate=0.6)
    assert c.choose(draft_lag=0, lookup_match=0, lookup_available=0, k_cap=8).drafter == "draft"
    assert c.choose(draft_lag=400, lookup_match=0, lookup_available=0, k_cap=8).drafter == "off"


def test_lookup_chosen_on_cpu_when_its_matches_are_reliable():
    c = trained(CPU, rate=0.9)
    c.lookup[4] = Acceptance(accepted=[95.0] * 8, trials=[100.0] * 8)
    choice = c.choose(draft_lag=0, lookup_match=4, lookup_available=8, k_cap=8)
    assert choice.drafter == "lookup" and choice.k >= 4
    # A short proposal limits k, and a weak match length keeps its own (poor) statistics.
    assert c.choose(0, 4, 2, 8).k <= 2
    c.lookup[2] = Acceptance(accepted=[5.0] * 8, trials=[100.0] * 8)
    assert c.choose(0, 2, 8, 8).drafter == "off"


def test_k_cap_is_respected():
    c = trained(GPU, rate=0.95)
    assert c.choose(0, 0, 0, k_cap=2).k <= 2


def test_acceptance_counts_only_reached_positions():
    acc = Acceptance()
    acc.observe(drafted=4, accepted=1)  # pos1 accepted, pos2 rejected, pos3-4 never reached
    assert acc.trials == [1, 1] and acc.accepted == [1, 0]
    acc.observe(drafted=2, accepted=2)
    assert acc.trials == [2, 2] and acc.accepted == [2, 1]


def test_online_cost_refresh_moves_towards_observations():
    c = Costs(verify=[0.1, 0.2], draft_step=0.05, draft_row=0.01)
    for _ in range(100):
        c.observe_verify(2, 0.1)
        c.observe_draft_step(0.01)
    assert c.verify_cost(2) == pytest.approx(0.1, rel=1e-3) and c.draft_step == pytest.approx(0.01, rel=1e-3)
    # Past the learned range the last slope goes on (here flat: 2 rows cost what 1 does).
    assert c.verify_cost(4) == pytest.approx(c.verify_cost(2) + 2 * (c.verify_cost(2) - c.verify_cost(1)))


def test_lookup_evidence_is_pooled_by_match_length_bucket():
    assert [match_bucket(n) for n in (0, 1, 2, 3, 4, 7, 8, 15, 16, 40)] == [0, 1, 2, 3, 4, 4, 8, 8, 16, 16]
    c = trained(CPU, rate=0.0)
    for _ in range(100):
        c.observe(c.choose(0, 20, 8, 8), drafted=4, accepted=4, lookup_match=20)
    # Evidence from 20-token matches speaks for 16-token matches, not for 3-token ones.
    assert c.choose(0, 16, 8, 8).drafter == "lookup"
    assert c.lookup[16].trials[0] > 50 and 3 not in c.lookup


def test_requests_share_what_the_engine_learned():
    book = AcceptanceBook()
    first = Controller(CPU, k_max=8, book=book)
    for _ in range(60):
        choice = first.choose(0, 3, 8, 8)
        if choice.drafter == "off":
            break
        first.observe(choice, drafted=choice.k, accepted=0, lookup_match=3)
    # The next request starts from that evidence instead of the prior, and does not retry.
    assert Controller(CPU, k_max=8, book=book).choose(0, 3, 8, 8).drafter == "off"
    assert Controller(CPU, k_max=8).choose(0, 3, 8, 8).drafter == "lookup"  # fresh book: prior


def test_one_unlucky_rejection_does_not_retire_a_good_drafter():
    c = Controller(HERE, k_max=8)
    c.observe(c.choose(0, 16, 8, 8), drafted=1, accepted=0, lookup_match=16)
    assert c.choose(0, 16, 8, 8).drafter == "lookup"  # still worth another try
    for _ in range(30):
        choice = c.choose(0, 16, 8, 8)
        c.observe(choice, drafted=choice.k, accepted=choice.k, lookup_match=16)
    # Later positions inherit the evidence, so a reliable drafter grows its k.
    assert c.choose(0, 16, 8, 8).k >= 3


def test_old_evidence_fades_when_the_workload_changes():
    c = Controller(CPU, k_max=8, book=AcceptanceBook(decay=0.99))
    for _ in range(300):
        c.observe(Choice_lookup(4), drafted=4, accepted=4, lookup_match=16)
    assert c.choose(0, 16, 8, 8).drafter == "lookup"
    for _ in range(300):
        c.observe(Choice_lookup(4), drafted=4, accepted=0, lookup_match=16)
    assert c.choose(0, 16, 8, 8).drafter == "off"


def Choice_lookup(k: int):
    from localspec.engine.controller import Choice

    return Choice("lookup", k, 0.0)


def test_draft_lag_counts_everything_after_the_shared_prefix():
    """A slot's draft KV may hold an earlier request: its catch-up is all that differs, not the
    length difference (which once made `auto` pick the draft model and pay a whole re-read)."""
    from tests.fake_runtime import FakeRuntime, logits_fn

    from localspec.engine.drafters import DraftModelDrafter

    runtime = FakeRuntime(logits_fn(5, [1], [1.0]))
    drafter = DraftModelDrafter(runtime, runtime.n_vocab)
    earlier = [1, 2, 3, 4, 0, 1, 2, 3, 4, 0]
    drafter.sync(0, earlier, budget=100)
    assert drafter.lag(0, earlier) == 1  # caught up: only the last token is left to decode
    assert drafter.lag(0, earlier + [1, 2]) == 3
    new = [1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0]  # the same first 3 tokens, then another request
    assert drafter.lag(0, new) == len(new) - 3
    assert drafter.lag(1, new) == len(new)  # a sequence the draft has never seen


def test_verify_observations_move_the_whole_curve():
    """Plain decoding at long context observes only 1-row verifies. They must raise the cost of
    every batch size, or drafting looks cheap next to a slower plain step."""
    costs = Costs(verify=[0.040, 0.074, 0.094], draft_step=0.025, draft_row=0.011)
    c = trained(costs, rate=0.95, k=2)
    assert c.choose(0, 0, 0, 2).drafter == "off"  # short context: the draft model does not pay
    for _ in range(100):
        costs.observe_verify(1, 0.060, context=2048)  # the same model at 2k tokens of context
    assert [costs.verify_cost(n, context=2048) for n in (1, 2, 3)] == pytest.approx([0.060, 0.111, 0.141], rel=1e-3)
    assert c.choose(0, 0, 0, 2, context=2048).drafter == "off"
    # The short context keeps its own level: costs are learned per context range.
    assert costs.verify_cost(1, context=48) == pytest.approx(0.040)


def test_why_not_counts_the_draft_models_own_steps():
    """CI's first command said "draft k=15: verify(16) = 8.8 steps for 6.6 tokens expected, 0.14x":
    the ratio counted the draft model's decodes, the message did not name them."""
    import re

    costs = Costs(verify=[0.03 * s for s in (1.0, 1.7, 2.4, 3.0, 3.6)], draft_step=0.03, draft_row=0.006)
    c = Controller(costs, k_max=4, book=AcceptanceBook(decay=1.0))
    for _ in range(40):  # a draft model that is rarely right
        c.draft.observe(4, 0)
    assert c.choose(draft_lag=40, lookup_match=0, lookup_available=0, k_cap=4).drafter == "off"
    m = re.fullmatch(r"draft k=(\d): verify\(\d\) = ([\d.]+) steps \+ drafting ([\d.]+) for ([\d.]+) tokens "
                     r"expected, ([\d.]+)x", c.why_not)
    assert m, c.why_not
    verify_steps, drafting, tokens, ratio = map(float, m.groups()[1:])
    assert abs(ratio - tokens / (verify_steps + drafting)) < 0.02


def test_exploring_never_swaps_a_paying_draft_for_plain_decoding():
    """Plain decoding is measured by every plain step: exploring it teaches nothing. It used to be
    the 'hopeful' option whenever a lookup draft was best by a little, so a 347-token edit proposed
    lookup drafts 120 times and drafted none."""
    from localspec.engine.controller import Explorer

    c = Controller(HERE, k_max=8, has_draft_model=False, explorer=Explorer(budget=0.5))
    book = c.book.for_lookup(8)
    book.accepted, book.trials = [90.0], [100.0]
    # One token to propose: lookup k=1 (1.9 tokens for 1.5 steps) or plain decoding.
    choices = [c.choose(draft_lag=0, lookup_match=8, lookup_available=1, k_cap=8) for _ in range(200)]
    assert {ch.drafter for ch in choices} == {"lookup"}
    assert not any(ch.explored and ch.k == 0 for ch in choices)


def test_exploring_tries_only_an_option_whose_hope_beats_the_best():
    from localspec.engine.controller import Explorer

    c = Controller(HERE, k_max=8, has_draft_model=False, explorer=Explorer(budget=0.5, credit=10.0))
    book = c.book.for_lookup(8)
    book.accepted, book.trials = [0.0], [1000.0]  # a drafter seen to fail, a thousand times
    choices = [c.choose(draft_lag=0, lookup_match=8, lookup_available=8, k_cap=8) for _ in range(50)]
    assert all(ch.drafter == "off" and not ch.explored for ch in choices)


def test_one_accepted_copy_does_not_plan_a_draft_of_untried_length():
    """Optimism is paid where drafts have reached: positions never tried used to borrow it too and
    compound to certainty, so one accepted 3-token lookup planned a 47-token draft (42 tokens
    expected) that kept 1 on a real edit."""
    c = Controller(HERE, k_max=8, has_draft_model=False, copy_k_max=48)
    c.book.for_lookup(8).observe(3, 3)
    planned = expected_tokens(c.book.for_lookup(8).planning_rates(48))
    assert planned < 15
    choice = c.choose(draft_lag=0, lookup_match=8, lookup_available=48, k_cap=200, explore=False)
    assert choice.drafter == "lookup" and 3 <= choice.k <= 12


def test_a_copy_prior_still_plans_long_before_any_evidence():
    """A client's prediction (and an earlier answer asked again) says the answer is a copy: long runs
    are the belief itself, so its untried positions keep the optimism."""
    copy = Acceptance(prior=0.9, copy_prior=True)
    assert expected_tokens(copy.planning_rates(16)) > 15
    assert expected_tokens(Acceptance(prior=0.9).planning_rates(16)) < 10


def _replay(book: AcceptanceBook, runs: tuple[int, ...], match: int, *, ahead: bool = False) -> list[int]:
    """One request's lookup drafts at `match`-token matches where each copy runs on for the given
    number of tokens: the k the controller chose for each (0: it did not draft). `ahead`: a copy kept
    whole also learns whether the copy's next token was the target's (what the scheduler gets from the
    verify's bonus token)."""
    request = Controller(_cpu_curve(), k_max=16, book=book, copy_k_max=48, has_draft_model=False)
    ks = []
    for run in runs:
        choice = request.choose(0, match, 48, 300, explore=False)
        ks.append(choice.k)
        if choice.k:
            kept = min(run, choice.k)
            request.observe(choice, drafted=choice.k, accepted=kept, lookup_match=match,
                            ahead=(run > choice.k) if ahead and kept == choice.k else None)
    return ks


def _taught(match: int) -> AcceptanceBook:
    """A book that earlier requests (a rename's copies) taught that `match`-token matches run on for 47."""
    book = AcceptanceBook(decay=0.99)
    for _ in range(12):
        book.for_lookup(match).observe(47, 47)
    return book


def test_a_request_that_copies_badly_soon_stops_drafting_though_the_book_says_copies_run_long():
    """The book pools every request and learns slowly; one request copies well or badly as a whole.
    After a rename taught the book that 4-token matches run on for 47 tokens, a rewrite (its copies
    from the trace below) drafted 15-47 tokens from such matches 20 times and kept 0-18 (0.70x)."""
    book = _taught(4)
    ks = _replay(book, (16, 1, 1, 6, 0, 0, 0, 12, 0, 0), match=4)
    assert ks[0] == 16  # the book's belief, up to the slow start's first cap (copy_cap)
    assert ks[5:] == [0] * 5 and sum(ks) < 120, ks  # the whole book's way: 10 drafts of 48 rows
    # The next request starts from the book again, which this one's passes moved only a little.
    assert _replay(book, (47,), match=4)[0] >= 16


def test_a_copy_past_k_max_starts_at_k_max_and_doubles_while_kept_whole():
    """Bench first asks drafted 48-token copies from matches in related text and kept 0-5 of each,
    ~20 single steps lost to each on a CPU: a request's first copy stops at k_max, then each copy
    kept whole doubles the next one's cap, and a miss brings it back to k_max."""
    ks = _replay(_taught(16), (48, 48, 48, 48, 3, 48, 48), match=16)
    assert ks == [16, 32, 48, 48, 48, 16, 32], ks


def test_a_question_asked_again_copies_long_at_once_then_slowly_after_the_answers_part():
    """Noisy bench, editing #4 asked again: its answer parted from the first at a near-tie, and it
    drafted four more 48-token copies of the first answer, kept 2 of them all (0.87x `off`)."""
    book = AcceptanceBook(decay=0.99)
    for _ in range(15):  # earlier requests asked again copied their first answers whole
        book.for_lookup(16, earlier=True).observe(48, 48)
    request = Controller(_cpu_curve(), k_max=16, book=book, copy_k_max=48, has_draft_model=False)
    ks = []
    for run in (23, 21, 0, 1, 0, 1, 0, 0, 3, 0):
        choice = request.choose(0, 16, 48, 300, explore=False, lookup_earlier=True)
        ks.append(choice.k)
        if choice.k:
            request.observe(choice, drafted=choice.k, accepted=min(run, choice.k), lookup_match=16,
                            lookup_earlier=True)
    assert ks[0] == 48  # the first answer is the belief
    assert ks[1] <= 16 and sum(ks) < 150, ks  # before: 48, then 23 a pass five times (181 drafted)


def test_a_rename_keeps_copying_between_its_renamed_words():
    ks = _replay(_taught(16), (0, 30, 20, 0, 25, 40, 12, 0, 30, 30, 30), match=16)
    assert min(ks) >= 12, ks
    ks = _replay(_taught(16), (12, 14, 0, 13, 25, 12, 0, 13, 12, 14, 12), match=16)
    assert min(ks) >= 12, ks


def _cpu_curve() -> Costs:
    """This CPU's learned curve to 49 rows (a 49-row pass for ~21 single steps)."""
    steps = {1: 1.0, 2: 1.9, 3: 2.63, 5: 4.19, 9: 7.7, 17: 9.77, 33: 15.8, 49: 22.4}
    known = sorted(steps)
    curve = []
    for n in range(1, 50):
        lo = max(k for k in known if k <= n)
        hi = min(k for k in known if k >= n)
        v = steps[lo] if lo == hi else steps[lo] + (steps[hi] - steps[lo]) * (n - lo) / (hi - lo)
        curve.append(0.035 * v)
    return Costs(verify=curve, draft_step=0.02, draft_row=0.005)


def test_exploring_never_tries_a_copy_longer_than_k_max():
    """A long copy is taken on belief alone: a wrong 47-row pass costs ~20 single steps on a CPU."""
    from localspec.engine.controller import Explorer

    book = _taught(16)
    c = Controller(_cpu_curve(), k_max=16, book=book, copy_k_max=48, has_draft_model=False,
                   explorer=Explorer(budget=0.5, credit=100.0))
    explored = []
    for run in (0, 0, 3, 0, 1) * 8:
        choice = c.choose(0, 16, 48, 300)
        explored += [choice.k] if choice.explored else []
        if choice.k:
            c.observe(choice, drafted=choice.k, accepted=min(run, choice.k), lookup_match=16)
    assert explored and max(explored) <= 16, explored


def test_an_explored_step_is_charged_what_it_lost_not_what_it_hoped():
    """The hope that makes an option worth trying is what prices it too, so failures cost more than
    believed: a first ask explored 23 of its 41 drafts, 12-15-token copies at short matches that kept
    1-6 (0.87x `off`). The outcome settles the charge; a debt stops exploring until it is earned back."""
    from localspec.engine.controller import Explorer

    explorer = Explorer(budget=0.5, credit=0.3)
    c = Controller(HERE, k_max=8, has_draft_model=False, explorer=explorer)
    book = c.book.for_lookup(8)
    book.accepted, book.trials = [1.0], [2.0]  # a coin flip, seen twice: hopeful, not believed
    best = c.choose(draft_lag=0, lookup_match=8, lookup_available=8, k_cap=8, explore=False)
    before = explorer.credit + explorer.budget * HERE.verify_cost(best.k + 1)  # with this step's earnings
    choice = c.choose(draft_lag=0, lookup_match=8, lookup_available=8, k_cap=8)
    assert choice.explored and choice.k > best.k
    believed, charged = before - explorer.credit, explorer.credit
    c.observe(choice, drafted=choice.k, accepted=0, lookup_match=8)
    # Charged what the step cost beyond the time the best choice needs for the one token it gave.
    lost = HERE.verify_cost(choice.k + 1) - 1 / best.expected_rate
    assert lost > believed
    assert explorer.credit == pytest.approx(charged + believed - lost)


def test_exploring_heals_an_acceptance_belief_on_a_steep_well_known_curve():
    """The curve this workplace's engine had learned over 26,344 passes (a 2-row verify 1.94 steps,
    17 rows 10.66): well known, so the explorer's cost optimism was nil, and a lookup never tried at
    length is planned on its 0.7 prior, where only k = 1 is near paying (1.9 tokens for 1.94 steps).
    A rename copying its prompt drafted nothing at all in 256 tokens. The explorer hopes for each
    position's acceptance at its upper bound, so it tries a copy, and copies that are kept whole are
    then planned on their evidence."""
    from localspec.engine.controller import Explorer
    from localspec.engine.costs import MAX_WEIGHT

    steps = [1.0, 1.94, 2.67, 3.26, 4.11, 4.71, 5.69, 6.47, 7.79, 8.06, 8.08, 8.12, 8.92, 8.96, 8.99, 9.01, 10.66]
    costs = Costs(verify=[0.0369 * s for s in steps], draft_step=0.0187, draft_row=0.006, pinned=True)
    costs.shape_weight = [MAX_WEIGHT] * len(steps)
    c = Controller(costs, k_max=16, has_draft_model=True, book=AcceptanceBook(decay=0.99),
                   explorer=Explorer(budget=0.01), copy_k_max=48)
    tokens, drafted = 0, 0
    while tokens < 256:
        choice = c.choose(draft_lag=0, lookup_match=7, lookup_available=48, k_cap=256 - tokens, context=450)
        if choice.k:
            c.observe(choice, choice.k, choice.k, lookup_match=7)  # the copy is the answer
        tokens, drafted = tokens + choice.k + 1, drafted + choice.k
    assert drafted > 0.8 * tokens, (drafted, tokens)


def test_with_a_prediction_lookup_copies_only_from_a_full_match():
    """The prompt holds the file the prediction is: a short match there is that file again where the
    prediction's realignment refused it (on the bench's large change such copies kept 0-4 of 15)."""
    from localspec.engine.controller import Explorer

    def controller(lookup_min: int, credit: float = 0.0) -> Controller:
        c = Controller(GPU, k_max=8, has_draft_model=False, lookup_min=lookup_min,
                       explorer=Explorer(budget=0.5, credit=credit))
        for m in (8, 16):
            book = c.book.for_lookup(m)
            book.accepted, book.trials = [95.0] * 8, [100.0] * 8
        return c

    beside = controller(16)
    short = beside.choose(draft_lag=0, lookup_match=8, lookup_available=8, k_cap=8, explore=False)
    assert short.drafter == "off"
    full = controller(16).choose(draft_lag=0, lookup_match=16, lookup_available=8, k_cap=8, explore=False)
    assert full.drafter == "lookup" and full.k >= 4
    plain = controller(0).choose(draft_lag=0, lookup_match=8, lookup_available=8, k_cap=8, explore=False)
    assert plain.drafter == "lookup" and plain.k >= 4
    exploring = controller(16, credit=10.0)  # nor does the explorer take the short match
    choices = [exploring.choose(draft_lag=0, lookup_match=8, lookup_available=8, k_cap=8) for _ in range(20)]
    assert all(ch.drafter == "off" for ch in choices)
    assert "lookup copies only 16-token matches beside a prediction" in exploring.why_not


def test_a_copy_kept_whole_learns_the_position_past_it_from_the_bonus_token():
    """Bench first ask (editing #3, a copy of its prompt): one 14-token copy kept 2, and from then on
    the request drafted 2 tokens at 16-token matches 50 times, each kept whole; position 3 kept its one
    rejection as the request's evidence, since no draft reached it again. The bonus token after a whole
    copy says what drafting one more would have: the copy grows back."""
    book = AcceptanceBook(decay=0.99)
    for _ in range(25):  # earlier requests' copies at 16-token matches mostly ran on
        book.for_lookup(16).observe(15, 15)
    runs = (2, *([40] * 8))
    stuck = _replay(book, runs, 16)
    assert stuck == [16] + [2] * 8, stuck  # the trap, as it was
    book = AcceptanceBook(decay=0.99)
    for _ in range(25):
        book.for_lookup(16).observe(15, 15)
    grown = _replay(book, runs, 16, ahead=True)
    assert grown[:2] == [16, 2] and min(grown[2:]) >= 16, grown


def test_the_bonus_token_past_a_whole_copy_counts_as_one_more_position():
    """ahead=True books position k + 1 as kept, ahead=False as the rejection there, None nothing."""
    for ahead, trials, kept in ((None, 4, 4), (True, 5, 5), (False, 5, 4)):
        book = AcceptanceBook(decay=1.0)
        c = Controller(HERE, k_max=8, book=book, has_draft_model=False)
        c.observe(Choice("lookup", 4, 1.0), drafted=4, accepted=4, lookup_match=16, ahead=ahead)
        entry = book.for_lookup(16)
        assert (len(entry.trials), sum(entry.accepted)) == (trials, kept)
    # Only a copy kept whole: a rejected draft already shows where it ended.
    book = AcceptanceBook(decay=1.0)
    Controller(HERE, k_max=8, book=book, has_draft_model=False).observe(
        Choice("lookup", 4, 1.0), drafted=4, accepted=2, lookup_match=16, ahead=True)
    assert book.for_lookup(16).trials == [1.0, 1.0, 1.0]


def test_after_the_answers_part_copies_of_the_earlier_answer_are_their_own_bet():
    """Editing #4 (docstrings) asked again: the copy of the first answer parted at token 9, then the
    answers met at the code between docstrings and two more 15-token copies kept 0 each (0.89x `off`);
    their rejections also taught the asked-again entry, so the third ask drafted nothing for 112 tokens
    of an answer it then copied. Copies after the part plan on their own entry (REALIGNED_BUCKET)."""
    from localspec.engine.controller import EARLIER_BUCKET, REALIGNED_BUCKET

    book = AcceptanceBook(decay=0.99)
    for _ in range(15):  # earlier requests asked again copied their first answers whole
        book.for_lookup(16, earlier=True).observe(48, 48)
    request = Controller(_cpu_curve(), k_max=16, book=book, copy_k_max=48, has_draft_model=False)
    ks = []
    for run in (8, 0, 0, 0):
        choice = request.choose(0, 16, 48, 300, explore=False, lookup_earlier=True)
        ks.append(choice.k)
        if choice.k:
            request.observe(choice, drafted=choice.k, accepted=min(run, choice.k), lookup_match=16,
                            lookup_earlier=True)
    assert ks[0] == 48 and max(ks[1:]) <= 4, ks  # before: 48, 16, 16, 16
    assert request.parted and REALIGNED_BUCKET in book.lookup
    # Only the first copy taught the asked-again entry: its 16th observation, the earlier 15 decayed.
    assert book.lookup[EARLIER_BUCKET].trials[0] == pytest.approx(sum(0.99**i for i in range(16)))
    again = Controller(_cpu_curve(), k_max=16, book=book, copy_k_max=48, has_draft_model=False)
    assert again.choose(0, 16, 48, 300, explore=False, lookup_earlier=True).k == 48


def test_copies_after_the_answers_part_grow_back_where_they_run_on():
    """An edit asked again that parted at a near-tie in a comment meets its first answer again at the
    code, and copies of it run on from there: the request's own evidence (and the bonus token past each
    whole copy) lets them grow again."""
    book = AcceptanceBook(decay=0.99)
    for _ in range(15):
        book.for_lookup(16, earlier=True).observe(48, 48)
    request = Controller(_cpu_curve(), k_max=16, book=book, copy_k_max=48, has_draft_model=False)
    ks = []
    for run in (8, *([200] * 8)):
        choice = request.choose(0, 16, 48, 300, explore=False, lookup_earlier=True)
        ks.append(choice.k)
        if choice.k:
            kept = min(run, choice.k)
            request.observe(choice, drafted=choice.k, accepted=kept, lookup_match=16, lookup_earlier=True,
                            ahead=True if kept == choice.k else None)
    assert ks[0] == 48 and ks[-1] >= 16, ks


def test_an_answer_repeating_itself_is_booked_apart_from_a_copy_of_its_prompt():
    """Every bench code first ask drafted a 13-15-token copy of its own earlier text at an 8-token match,
    on what the editing suite's copies of their prompts had taught that bucket, and kept 0-1 of it."""
    from localspec.engine.controller import REPEAT_BUCKETS, match_bucket

    book = AcceptanceBook(decay=0.99)
    for _ in range(25):  # edits copied their prompts at 8-15-token matches
        book.for_lookup(8).observe(15, 15)
    c = Controller(_cpu_curve(), k_max=16, book=book, copy_k_max=48, has_draft_model=False)
    assert c.choose(0, 8, 48, 300, explore=False).k >= 8  # a copy of the prompt: the book's belief
    assert c.choose(0, 8, 48, 300, explore=False, lookup_repeat=True).k <= 2  # the answer's own text: no evidence
    c.observe(Choice("lookup", 2, 1.0), drafted=2, accepted=0, lookup_match=8, lookup_repeat=True)
    assert match_bucket(8, repeat=True) == 8 + REPEAT_BUCKETS and book.for_lookup(8).trials[0] == pytest.approx(
        sum(0.99**i for i in range(25)))  # the repeat's rejection did not teach the prompt's entry


def test_a_part_found_by_the_bonus_token_counts_as_the_answers_parting():
    """A copy of the earlier answer kept whole, whose bonus token is not the earlier answer's next:
    the answers part there, and later copies of it are realigned ones (REALIGNED_BUCKET)."""
    book = AcceptanceBook(decay=0.99)
    request = Controller(_cpu_curve(), k_max=16, book=book, copy_k_max=48, has_draft_model=False)
    choice = request.choose(0, 16, 48, 300, explore=False, lookup_earlier=True)
    request.observe(choice, drafted=choice.k, accepted=choice.k, lookup_match=16, lookup_earlier=True, ahead=True)
    assert not request.parted
    request.observe(choice, drafted=choice.k, accepted=choice.k, lookup_match=16, lookup_earlier=True, ahead=False)
    assert request.parted
