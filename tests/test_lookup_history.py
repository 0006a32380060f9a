"""Lookup over earlier requests: a request asked again drafts its earlier answer, within its owner's
scope only, and only on a full n_max-token match (turn markers shared by every chat draft nothing)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from localspec.engine.drafters import LookupHistory, PromptLookupDrafter, agreement_odds
from localspec.engine.verify import GREEDY, TIE_MARGIN, PickRule


def test_a_repeated_request_drafts_the_earlier_answer_to_the_end_of_that_request():
    history = LookupHistory(max_tokens=1000)
    prompt, answer = list(range(100, 120)), [7, 8, 9, 10]
    history.add("alice", prompt + answer)
    d = PromptLookupDrafter(n_min=2, n_max=16, history=history)
    draft = d.propose(prompt, 8, "alice")
    assert draft.tokens == (7, 8, 9, 10) and draft.match_length == 16  # stops at that request's end
    # After one token of the answer, the rest follows.
    assert d.propose(prompt + [7], 8, "alice").tokens == (8, 9, 10)
    # Without the history, the sequence alone has nothing to copy.
    assert d.propose(prompt, 8).tokens == ()


def test_another_owner_and_a_short_match_draft_nothing_from_history():
    history = LookupHistory(max_tokens=1000)
    template_tail = [1, 2, 3, 4, 5]  # "<|im_end|>\n<|im_start|>assistant\n": in every chat
    history.add("alice", list(range(100, 120)) + template_tail + [50, 51, 52])
    d = PromptLookupDrafter(n_min=2, n_max=16, history=history)
    assert d.propose(list(range(100, 120)) + template_tail, 4, "bob").tokens == ()
    other_question = list(range(200, 220)) + template_tail
    assert d.propose(other_question, 4, "alice").tokens == ()


def test_the_sequence_own_full_match_wins_over_history():
    history = LookupHistory(max_tokens=1000)
    seq = list(range(16)) + [90, 91] + list(range(16))
    history.add("local", list(range(16)) + [70, 71])
    assert PromptLookupDrafter(n_max=16, history=history).propose(seq, 2, "local").tokens == (90, 91)


def test_history_keeps_the_newest_tokens_within_its_bound_and_matches_never_span_two_requests():
    history = LookupHistory(max_tokens=50)
    for i in range(10):
        history.add("local", [1000 + i] * 5 + list(range(i * 10, i * 10 + 10)))
    joined = history.tokens("local")
    assert joined is not None and np.count_nonzero(joined != LookupHistory.SEPARATOR) <= 50
    assert 1009 in joined and 1000 not in joined  # the oldest went first
    # A suffix that would only match across a separator does not match.
    history = LookupHistory(max_tokens=1000)
    history.add("local", list(range(8)))
    history.add("local", list(range(8, 30)))
    assert PromptLookupDrafter(n_max=16, history=history).propose(list(range(16)), 4, "local").tokens == ()
    assert LookupHistory(max_tokens=0).tokens("local") is None


def test_history_proposals_match_a_brute_force_search():
    def context(source, end, seq):  # tokens before `end` that agree with the end of seq
        n = 0
        while n < min(end, len(seq)) and source[end - 1 - n] == seq[-1 - n]:
            n += 1
        return n

    rng = random.Random(3)
    for _ in range(3000):
        history = LookupHistory(max_tokens=10_000)
        d = PromptLookupDrafter(n_min=2, n_max=4, history=history)
        seqs = [[rng.randrange(3) for _ in range(rng.randrange(2, 15))] for _ in range(rng.randrange(1, 4))]
        for s in seqs:
            history.add("s", s)
        hist = [rng.randrange(3) for _ in range(rng.randrange(4, 12))]
        got = d.propose(hist, 3, "s")
        own = d.propose(hist, 3)
        # The own match's context: its latest full occurrence's, else its length.
        own_ends = [i + 4 for i in range(len(hist) - 4) if hist[i : i + 4] == hist[-4:]]
        own_context = context(hist, own_ends[-1], hist) if own.match_length >= 4 else own.match_length
        best, expected, again = 0, (), False
        for s in seqs:  # every full match followed by a token, oldest first: the longest context wins, then the latest
            for i in range(len(s) - 4):
                if s[i : i + 4] == hist[-4:] and context(s, i + 4, hist) >= best:
                    best, expected, again = context(s, i + 4, hist), tuple(s[i + 4 : i + 7]), s[: len(hist)] == hist
        if best > own_context or (again and best == own_context):  # "history": that request began like this one
            assert got.tokens == expected and got.source == ("history" if again else "lookup"), (seqs, hist)
        else:
            assert got == own, (seqs, hist)


def test_the_same_question_asked_again_copies_its_own_answer_not_the_latest_about_the_same_file():
    history = LookupHistory(max_tokens=1000)
    file, turn = list(range(100, 140)), [1, 2, 3]
    rename, add_types = [500, 501] + file + turn, [600, 601] + file + turn
    history.add("local", rename + [70, 71, 72])
    history.add("local", add_types + [80, 81, 82])  # the latest full match, about another edit
    d = PromptLookupDrafter(n_max=16, history=history)
    assert d.propose(rename, 3, "local").tokens == (70, 71, 72)
    assert d.propose(add_types, 3, "local").tokens == (80, 81, 82)
    assert d.propose(add_types, 3, "local").source == "history"  # asked again: auto's earlier-answer book
    # A third question about the file copies the latest answer about it, as a copy of related text,
    # not as the same question asked again.
    other = d.propose([700, 701] + file + turn, 3, "local")
    assert other.tokens == (80, 81, 82) and other.source == "lookup"
    # A copy of the prompt (its own full match) gives way to the earlier answer that agrees for longer:
    # the answer asked again made the edit the prompt's text has not.
    asked_again = rename + [70] + file[:20]
    history.add("local", rename + [70] + file[:20] + [999, 998])  # its earlier answer edited the file here
    assert d.propose(asked_again, 2, "local").tokens == (999, 998)
    # Asked again, the answer parted from the earlier one at a near-tie and met it again: still the
    # earlier answer to this prompt (its own book entry), not a related text.
    parted = rename + [70, 555] + file[:20]
    again = d.propose(parted, 2, "local", prompt=len(rename))
    assert again.tokens == (999, 998) and again.source == "history"
    # The prompt unknown, the whole sequence must agree to be asked again: here it does not, and on
    # a tie the sequence's own copy of the prompt goes on.
    assert d.propose(parted, 2, "local").tokens == tuple(file[20:22])
    assert d.propose(asked_again, 2).tokens == tuple(file[20:22])  # without history: the prompt's copy


def test_a_history_proposal_says_so_and_keeps_the_end_token():
    history = LookupHistory(max_tokens=1000)
    prompt = list(range(100, 120))
    history.add("local", prompt + [7, 8], end=2)  # 2: the end-of-generation token that ended it
    draft = PromptLookupDrafter(n_max=16, history=history).propose(prompt, 8, "local")
    assert draft.source == "history" and draft.tokens == (7, 8, 2)
    assert PromptLookupDrafter(n_max=16, history=history).propose(prompt + prompt[:16], 2).source == "lookup"


def test_history_evidence_is_booked_apart_from_copies_of_the_prompt():
    from localspec.engine.controller import AcceptanceBook, Choice, Controller
    from localspec.engine.costs import Costs

    cpu = Costs(verify=[0.060, 0.105, 0.124, 0.142, 0.161, 0.200, 0.240, 0.290, 0.338], draft_step=0.027, draft_row=0.004)
    book = AcceptanceBook()
    for _ in range(30):  # regenerated answers (one request each) that part from the earlier one at once
        Controller(cpu, k_max=8, book=book).observe(Choice("lookup", 8, 1.0), drafted=8, accepted=0, lookup_match=16,
                                                    lookup_earlier=True)
    c = Controller(cpu, k_max=8, book=book)
    assert book.for_lookup(16, earlier=True).planning_rates(1)[0] < 0.2
    assert book.for_lookup(16).planning_rates(1)[0] > 0.5  # copies of the prompt keep their prior
    # So a 16-token match in this sequence still drafts, while one in the history no longer does.
    assert c.choose(0, 16, 8, 8, explore=False).drafter == "lookup"
    assert c.choose(0, 16, 8, 8, explore=False, lookup_earlier=True).drafter == "off"


def _cpu_costs():
    from localspec.engine.costs import Costs

    # This 2-core CPU's verify curve (ms by rows; scripts/verify_cost_shape.py-style, 300 tokens of KV):
    # batched matmul kernels make 49 rows cost 23 single-row passes, 17 rows 10.4.
    measured = {1: 32, 2: 62, 5: 128, 9: 244, 17: 333, 25: 442, 33: 531, 49: 731}
    xs = sorted(measured)
    verify = []
    for n in range(1, 50):
        lo, hi = max(x for x in xs if x <= n), min(x for x in xs if x >= n)
        ms = measured[lo] if lo == hi else measured[lo] + (measured[hi] - measured[lo]) * (n - lo) / (hi - lo)
        verify.append(ms / 1000)
    return Costs(verify=verify, draft_step=0.027, draft_row=0.004)


def test_the_first_answer_asked_again_is_copied_before_any_history_evidence():
    """Bench, code prompt #1 asked again with identical output: from the copy prior `auto` drafted 2
    tokens in 256 on the second ask and copied only on the third. An earlier answer starts from the
    prediction's prior, and one long copy is worth a CPU's verify of 49 rows."""
    from localspec.engine.controller import AcceptanceBook, Controller

    c = Controller(_cpu_costs(), k_max=16, book=AcceptanceBook(decay=0.99), copy_k_max=48)
    choice = c.choose(0, 16, 48, 200, explore=False, lookup_earlier=True)
    assert choice.drafter == "lookup" and choice.k > 16
    # A 16-token copy of the prompt, with no evidence yet, still waits for it.
    assert c.choose(0, 16, 48, 200, explore=False).drafter == "off"


def test_a_sure_copy_drafts_past_auto_k_max_where_long_batches_are_cheaper_per_row():
    from localspec.engine.controller import AcceptanceBook, Controller

    cpu = _cpu_costs()
    book = AcceptanceBook()
    for _ in range(50):  # the same request asked again: its earlier answer is accepted whole
        book.for_lookup(16, earlier=True).observe(48, 48)
    long = Controller(cpu, k_max=16, book=book, copy_k_max=48)
    choice = long.choose(0, 16, 48, 200, explore=False, lookup_earlier=True)
    assert choice.drafter == "lookup" and choice.k > 16
    capped = Controller(cpu, k_max=16, book=book, copy_k_max=16)
    assert capped.choose(0, 16, 48, 200, explore=False, lookup_earlier=True).k == 16
    assert choice.expected_rate > 1.2 * capped.choose(0, 16, 48, 200, explore=False, lookup_earlier=True).expected_rate
    # The draft model stays at its own cap.
    assert all(o.choice.k <= 16 for o in long.options(0, 0, 0, 200) if o.choice.drafter == "draft")


def test_auto_tells_the_lookup_where_its_prompt_ends():
    """Whether an earlier request is this one asked again depends on the prompt alone, not on where
    the answers parted: `auto` passes the prompt's length with every proposal it weighs."""
    from tests.test_costs import QUIET, _answer, _auto_engine
    from localspec.engine.costs import Costs

    engine, copy = _auto_engine(Costs(verify=QUIET, draft_step=0.02, draft_row=0.005, pinned=True))
    seen: list[tuple[int, int | None]] = []
    propose = engine.lookup.propose

    def spy(history, k, scope=None, *, prompt=None, rule=GREEDY):
        seen.append((len(history), prompt))
        return propose(history, k, scope, prompt=prompt, rule=rule)

    engine.lookup.propose = spy  # type: ignore[method-assign]
    prompt = "Copy this:\n" + copy
    _answer(engine, prompt)
    n_prompt = len(engine.target.tokenize(prompt, add_special=True, parse_special=False))
    assert seen and all(p == n_prompt < n for n, p in seen)


def test_begins_with_finds_each_kept_sequences_start_also_after_the_oldest_went():
    history = LookupHistory(max_tokens=40)
    seqs = [[100 + i] + list(range(i, i + 9)) for i in range(6)]  # 10 tokens each: 4 fit
    for s in seqs:
        history.add("local", s)
    joined = history.tokens("local")
    assert joined is not None
    kept = seqs[-4:]
    at = 0
    for i, s in enumerate(kept):
        for j in range(len(s)):  # every index inside the sequence names it, and only it
            assert history.begins_with("local", at + j, np.asarray(s[:3]))
            other = kept[i - 1] if i else kept[1]
            assert not history.begins_with("local", at + j, np.asarray(other[:3]))
        at += len(s) + 1  # and its separator
    assert at == len(joined)


def test_the_odds_of_picking_a_token_again_follow_its_top_two_gap():
    """Batch shapes move a row's logits: a near-tie goes either way, a clear pick stays."""
    from localspec.engine.drafters import agreement_odds

    assert agreement_odds(0.0) == 0.5 and agreement_odds(-0.3) == 0.5  # not the argmax: a coin at best
    assert 0.6 < agreement_odds(0.03) < 0.7 < agreement_odds(0.07) < 0.85
    assert agreement_odds(0.2) > 0.99 and agreement_odds(float("inf")) == 1.0
    gaps = [0.0, 0.01, 0.05, 0.1, 0.3, 1.0]
    assert [agreement_odds(g) for g in gaps] == sorted(agreement_odds(g) for g in gaps)


def test_a_history_proposal_carries_the_odds_its_answer_was_picked_with():
    from localspec.engine.drafters import agreement_odds

    history = LookupHistory(max_tokens=1000)
    prompt = list(range(100, 120))
    history.add("local", prompt + [7, 8, 9], end=2, gaps=[1.0, 0.0, 5.0, 3.0])  # the answer's and its end's gaps
    # Another question ending alike (its first token differs): the answer was picked at another context.
    draft = PromptLookupDrafter(n_max=16, history=history).propose([99, *prompt], 8, "local")
    assert draft.tokens == (7, 8, 9, 2) and draft.own_picks == ()
    assert draft.odds == (agreement_odds(1.0), 0.5, 1.0, 1.0)
    # The same question: the answer is the target's own picks at exactly this context, and a verify keeps
    # them at near-ties within TIE_MARGIN, so even the tie is likely to be copied.
    again = PromptLookupDrafter(n_max=16, history=history).propose(prompt, 8, "local")
    assert again.tokens == draft.tokens and again.own_picks == (7, 8, 9, 2)
    assert again.odds == tuple(agreement_odds(g + TIE_MARGIN) for g in (1.0, 0.0, 5.0, 3.0)) and again.odds[1] > 0.99
    # Cut short, the copy still names the earlier answer's pick one past it: the row after a copy kept whole.
    assert PromptLookupDrafter(n_max=16, history=history).propose(prompt, 2, "local").own_picks == (7, 8, 9)
    # Another rule of picking (penalties, or a sampled or grammar request: None) settles nothing with these picks.
    for rule in (PickRule(repeat_penalty=1.1, penalty_last_n=64), None):
        other_rule = PromptLookupDrafter(n_max=16, history=history).propose(prompt, 8, "local", rule=rule)
        assert other_rule.tokens == draft.tokens and other_rule.own_picks == () and other_rule.odds == draft.odds
    # A copy of the sequence's own text carries none, with a history in scope too: its evidence is all there is.
    own = list(range(500, 520)) * 2
    d = PromptLookupDrafter(n_max=16, history=history).propose(own[:-4], 4, "local")
    assert d.tokens == tuple(own[-4:]) and d.source == "lookup" and d.odds == ()
    # Without gaps (a sampled answer), an earlier answer's tokens are given, but they are not the target's picks.
    history.add("other", prompt + [7, 8, 9])
    sampled = PromptLookupDrafter(n_max=16, history=history).propose(prompt, 8, "other")
    assert sampled.odds == (1.0, 1.0, 1.0) and sampled.own_picks == ()


def test_a_sequence_joined_at_the_end_reads_as_all_of_them_joined_again():
    """The history joins a new sequence to the others without joining them all again, until one goes."""
    rng = random.Random(7)
    history = LookupHistory(max_tokens=300)
    kept: list[list[int]] = []
    for _ in range(40):
        seq = [rng.randrange(100) for _ in range(rng.randrange(2, 60))]
        history.add("s", seq, gaps=[0.5] * len(seq))
        kept.append(seq)
        while sum(map(len, kept)) > 300:
            kept.pop(0)
        assert history.tokens("s").tolist() == [t for q in kept for t in (*q, LookupHistory.SEPARATOR)]
        starts = np.cumsum([0] + [len(q) + 1 for q in kept[:-1]]).tolist()
        for i, start in enumerate(starts):  # each sequence continues from its own start only
            assert history.continues("s", start + 1, np.array(kept[i][:1]), GREEDY)
            assert not history.continues("s", start + 1, np.array(kept[i][:1]), None)
        assert history.odds("s", 0, len(history.tokens("s"))).count(1.0) == len(kept)  # the separators


def test_history_odds_stay_with_their_tokens_when_old_sequences_go():
    rng = random.Random(5)
    history = LookupHistory(max_tokens=120)
    for n in range(8):
        prompt = [1000 + 100 * n + i for i in range(20)]
        answer = [rng.randrange(50) for _ in range(rng.randrange(2, 30))]
        gaps = [0.0 if t % 2 else 9.0 for t in answer]  # odd tokens were near-ties
        history.add("s", prompt + answer, gaps=gaps)
        d = PromptLookupDrafter(n_max=16, history=history).propose(prompt, 64, "s")
        assert d.tokens == tuple(answer) and d.own_picks == tuple(answer)
        assert d.odds == tuple(agreement_odds(TIE_MARGIN) if t % 2 else 1.0 for t in answer)
        start = len(history.tokens("s")) - len(answer) - 1
        assert history.odds("s", start, len(answer)) == tuple(0.5 if t % 2 else 1.0 for t in answer)


def test_a_copy_of_an_earlier_answer_stops_before_a_likely_near_tie():
    """A 48-token copy whose 11th token was picked by a hair: another batch shape may decide it the other
    way, and every row past it is then lost (a second ask's 48-token copy kept 2, 0.81x `off`). The copy
    stops before it, so the target's own pick there comes with the pass; a clear copy still runs long."""
    from localspec.engine.controller import AcceptanceBook, Controller

    book = AcceptanceBook()
    for _ in range(50):
        book.for_lookup(16, earlier=True).observe(48, 48)
    c = Controller(_cpu_costs(), k_max=16, book=book, copy_k_max=48)
    clear = c.choose(0, 16, 48, 200, explore=False, lookup_earlier=True)
    assert clear.drafter == "lookup" and clear.k > 16
    odds = [1.0] * 48
    odds[10] = 0.5
    tie = c.choose(0, 16, 48, 200, explore=False, lookup_earlier=True, lookup_odds=odds)
    assert tie.drafter == "lookup" and tie.k == 10
    # A token less likely to part is drafted through: stopping would cost more than it is likely to save.
    odds[10] = 0.9
    assert c.choose(0, 16, 48, 200, explore=False, lookup_earlier=True, lookup_odds=odds).k > 16
    # At the very next token, the plain step decides it (or another drafter) and the copy goes on after.
    odds[0] = 0.6
    assert c.choose(0, 16, 48, 200, explore=False, lookup_earlier=True, lookup_odds=odds).drafter != "lookup"


def test_the_engine_keeps_the_gaps_its_greedy_answers_were_picked_with():
    """A greedy answer goes to the history with the odds of its tokens being picked again (from the
    top-two gap of each row); a sampled one's tokens are given (1)."""
    from localspec.engine.config import GenerationRequest
    from localspec.engine.drafters import agreement_odds
    from localspec.engine.sampling import SamplingParams
    from tests.fake_tier import Reply, scripted, scripted_engine

    engine = scripted_engine(script=scripted({"unsure": Reply("Maybe so.", confidence=0.02),
                                              "sure": Reply("Surely so.", confidence=0.1)}), parallel=1)
    # Sampled at a temperature that still follows the script (gaps of 0.02 / 0.001 = 20 logits).
    sampled = SamplingParams(temperature=0.001, seed=3)
    for prompt, sampling, expected in (("Are you unsure about this one?", SamplingParams(), agreement_odds(0.02)),
                                       ("Are you sure about this one?", SamplingParams(), agreement_odds(0.1)),
                                       ("Sampled: are you unsure about it?", sampled, 1.0)):
        request = engine.with_defaults(GenerationRequest(prompt=prompt, max_tokens=32, sampling=sampling))
        list(engine.generate(request))
        tokens, _ = engine.prompt_tokens(request)
        again = engine.lookup.propose(list(tokens), 64, "local", prompt=len(tokens))
        assert again.source == "history" and len(again.odds) == len(again.tokens) > 3
        assert again.own_picks == (again.tokens if sampling.greedy else ())
        start = len(engine.lookup.history.tokens("local")) - len(again.tokens) - 1  # the latest answer, end included
        assert engine.lookup.history.odds("local", start, len(again.tokens)) == pytest.approx(
            [expected] * len(again.tokens), abs=1e-6)


def test_the_gaps_stay_with_their_tokens_when_a_stop_string_ends_the_answer():
    from localspec.engine.config import GenerationRequest
    from localspec.engine.drafters import agreement_odds
    from tests.fake_tier import Reply, scripted, scripted_engine

    engine = scripted_engine(script=scripted(default=Reply("Maybe so. Or not at all.", confidence=0.05)), parallel=1)
    request = engine.with_defaults(GenerationRequest(prompt="Tell me whether it is so, please.", max_tokens=64,
                                                     stop=[" Or"]))
    list(engine.generate(request))
    tokens, _ = engine.prompt_tokens(request)
    again = engine.lookup.propose(list(tokens), 64, "local", prompt=len(tokens))
    assert engine.target.text(again.tokens).startswith("Maybe so.") and len(again.odds) == len(again.tokens)
    start = len(engine.lookup.history.tokens("local")) - len(again.tokens) - 1
    assert engine.lookup.history.odds("local", start, len(again.tokens)) == pytest.approx(
        [agreement_odds(0.05)] * len(again.tokens), abs=1e-6)


def test_a_sequence_longer_than_the_history_keeps_the_odds_of_its_newest_tokens():
    history = LookupHistory(max_tokens=30)
    prompt, answer = list(range(100, 120)), list(range(200, 230))
    history.add("s", prompt + answer, gaps=[0.0 if t % 3 == 0 else 9.0 for t in answer])
    d = PromptLookupDrafter(n_max=16, history=history).propose(answer[:20], 64, "s")
    assert d.tokens == tuple(answer[20:])
    assert d.odds == tuple(0.5 if t % 3 == 0 else 1.0 for t in answer[20:])


def test_a_gap_is_taken_from_the_logits_the_pick_was_made_from_penalties_included():
    from localspec.engine.config import GenerationRequest
    from localspec.engine.events import Stats
    from localspec.engine.sampling import SamplingParams
    from localspec.engine.slots import Active, Handle
    from localspec.engine.verify import PositionRng

    def active(sampling: SamplingParams) -> Active:
        return Active(handle=Handle(1), request=GenerationRequest(prompt="x", sampling=sampling), tokens=[2],
                      n_prompt=1, mode="off", k=0, rng=PositionRng(0), stats=Stats(), t_submit=0.0)

    row = np.array([0.0, 5.0, 5.5, 0.0], dtype=np.float32)
    a = active(SamplingParams(presence_penalty=1.0))  # token 2 is in the history: 5.5 - 1 = 4.5
    a.note_gap(row, 1)
    assert a.gaps == [pytest.approx(0.5)]
    plain = active(SamplingParams())
    plain.note_gap(row, 2)
    plain.note_gap(None, 2)
    assert plain.gaps == [pytest.approx(0.5), float("inf")]
    sampled = active(SamplingParams(temperature=0.7))
    sampled.note_gap(row, 2)
    assert sampled.gaps == [float("inf")]


def test_a_plain_step_where_the_earlier_answer_went_on_otherwise_marks_the_answers_parted():
    """A copy that stops before a near-tie at its first token leaves the plain step to pick it: if the target
    picks otherwise there, the answers parted as surely as at a rejected copy."""
    from localspec.engine.controller import REALIGNED_BUCKET, AcceptanceBook, Choice, Controller

    c = Controller(_cpu_costs(), k_max=16, book=AcceptanceBook(), copy_k_max=48)
    c.observe(Choice("off", 0, 1.0), 0, 0, 16, lookup_earlier=True, ahead=True)
    assert not c.parted
    c.observe(Choice("off", 0, 1.0), 0, 0, 16, lookup_earlier=True, ahead=False)
    assert c.parted and c._bucket(16, True, False) == REALIGNED_BUCKET
    # The engine's side: a plain step tells whether its pick is the earlier answer's next token.
    from localspec.engine.config import GenerationRequest
    from localspec.engine.events import Stats
    from localspec.engine.slots import Active, Handle
    from localspec.engine.verify import Draft, PositionRng, Verdict

    a = Active(handle=Handle(1), request=GenerationRequest(prompt="x"), tokens=[2], n_prompt=1, mode="auto", k=8,
               rng=PositionRng(0), stats=Stats(), t_submit=0.0, proposal=Draft((5, 6), source="history"))
    assert a.ahead(Draft(()), Verdict(0, 5)) is True and a.ahead(Draft(()), Verdict(0, 7)) is False
    a.proposal = Draft((5, 6), source="lookup")  # a copy of the prompt: no earlier answer to leave
    assert a.ahead(Draft(()), Verdict(0, 7)) is None
