"""Predicted Outputs in the engine: the prediction's cursor, realignment by text, and that a
prediction (right, edited or entirely wrong) never changes a greedy answer, only how it is drafted.

The cursor's rules run on toy vocabularies; the engine's on the scripted model (tests/fake_tier.py),
whose tokens are bytes. The sampled case (the output distribution stays the target's) is a
chi-square case in tests/test_spec_sampling.py.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from localspec.engine.config import EngineConfig, GenerationRequest, output_rows
from localspec.engine.costs import Costs
from localspec.engine.controller import (
    PREDICTION_CREDIT,
    PREDICTION_RESUME,
    PREDICTION_STOP_LOSS,
    AcceptanceBook,
    Controller,
)
from localspec.engine.events import Done, Token
from localspec.engine.prediction import (
    FAR_MATCH_BYTES,
    MAX_SHIFTED_VIEWS,
    MIN_MATCH_BYTES,
    MIN_MATCH_TEXT,
    Prediction,
    prepare,
    shifted,
)
from localspec.engine.scheduler import Engine
from localspec.errors import PredictionTooLongError
from tests.fake_tier import SPECIAL, ScriptedRuntime, scripted, scripted_costs, scripted_engine


def byte_piece(token: int) -> bytes:
    return bytes([token])


def byte_prediction(text: str) -> Prediction:
    return Prediction.build(list(text.encode()), piece=byte_piece, tokenize=lambda s: list(s.encode()))


def as_text(tokens: tuple[int, ...]) -> str:
    return bytes(tokens).decode()


# ---------------------------------------------------------------- the cursor


def test_the_cursor_follows_the_output_and_proposes_what_comes_next():
    p = byte_prediction("def add(a, b):\n    return a + b\n")
    assert as_text(p.propose(4).tokens) == "def "
    p.follow(list(b"def add"))
    assert as_text(p.propose(6).tokens) == "(a, b)"
    assert p.available() == len("(a, b):\n    return a + b\n")
    p.follow([1, 2, *b"def add(a, b):\n    return a + b\n"], start=2)  # after a two-token prompt
    assert p.propose(4).tokens == () and p.available() == 0  # the prediction is used up


# Three spellings of one text: "foobar" is one token in the prediction and two in the output.
PIECES = {0: b"foo", 1: b"bar", 2: b"foobar", 3: b" ", 4: b"baz", 5: b"o", 6: b"ba"}


def test_an_output_that_tokenizes_the_same_text_differently_stays_aligned_by_text():
    p = Prediction.build([2, 3, 2, 3, 4], piece=PIECES.__getitem__)  # "foobar foobar baz"
    p.follow([0])  # "foo": inside the prediction's first token, so nothing to propose yet
    assert p.aligned and p.propose(8).tokens == ()
    p.follow([0, 1])  # "foobar": the shared boundary, drafting resumes
    assert p.propose(8).tokens == (3, 2, 3, 4)
    p.follow([0, 1, 3, 2, 3, 6])  # "... ba", in the middle of "baz"
    assert p.aligned and p.propose(8).tokens == ()


def test_after_a_divergence_the_cursor_realigns_on_the_outputs_recent_text():
    p = byte_prediction("x = compute(1)\ny = compute(2)\nz = compute(3)\n")
    p.follow(list(b"x = compute(10"))  # the edit: "10" where the prediction has "1)"
    assert not p.aligned and p.propose(8).tokens == ()
    p.follow(list(b"x = compute(10)\ny = com"))  # enough of the next line to find it again
    assert p.aligned
    assert as_text(p.propose(32).tokens) == "pute(2)\nz = compute(3)\n"


def test_a_short_match_does_not_realign_and_the_first_match_after_the_last_position_wins():
    text = "alpha = 1\nbeta_beta = 2\nalpha = 1\nbeta_beta = 3\n"
    p = byte_prediction(text)
    p.follow(list(b"alpha = 1\nbeta_beta = 2\nALPHA"))
    assert not p.aligned  # fewer than MIN_MATCH_BYTES of matching text since the edit
    p.follow(list(b"alpha = 1\nbeta_beta = 2\nALPHA = 1\nbeta_beta"))
    assert p.aligned and as_text(p.propose(32).tokens) == " = 3\n"  # the second occurrence: after the anchor
    assert MIN_MATCH_BYTES > len(" = 1\n")


def test_a_short_match_far_from_where_the_output_left_the_prediction_does_not_realign():
    sent = 'intro = "to-do items"\n' + "".join(f"line_{i} = {i}\n" for i in range(10))
    sent += "def add(title, path=PATH):\n    return title\n"
    p = byte_prediction(sent)
    out = 'intro = "to-do items"\nline_0 = 0\nline_1 = 1\nline_2 = 2\n'
    p.follow(list((out + "# more to-do items").encode()))
    assert not p.aligned  # " to-do items" is only on the first line, before where the output stands
    p.follow(list((out + "# more to-do items\ndef init(self, path=PATH").encode()))
    assert not p.aligned  # ", path=PATH" is eight lines on: an edit resumes near where it left off
    out += "# more to-do items\ndef init(self, path=PATH):\n    pass\ndef add(title, path=PATH):\n    ret"
    p.follow(list(out.encode()))
    assert p.aligned and as_text(p.propose(16).tokens) == "urn title\n"  # a long match goes anywhere
    assert len("\ndef add(title, path=PATH):\n    ret") >= FAR_MATCH_BYTES > len(", path=PATH")


def test_an_inserted_line_realigns_on_a_short_match_that_starts_on_the_line_before():
    p = byte_prediction("def f(a):\n    b = g(a)\n    y = transform(b)\n    return y\n")
    p.follow(list(b"def f(a):\n    b = g(a)\n    log(a)\n    y"))  # a line inserted before "y = ..."
    # "(a)\n    y" starts on the line before the one the output left, and ends on it: near.
    assert p.aligned and as_text(p.propose(32).tokens) == " = transform(b)\n    return y\n"


MODULE = """def load(path):
    with open(path) as f:
        return json.load(f)


def save(data, path):
    with open(path, "w") as f:
        json.dump(data, f)
"""


def test_a_line_end_and_indentation_alone_do_not_realign():
    p = byte_prediction("def f(a):\n        return a\n")
    p.follow(list(b"def g(bb):\n        "))  # "):\n        " is in the prediction, but it follows any statement
    assert not p.aligned and p.propose(8).tokens == ()
    p.follow(list(b"def g(bb):\n        return"))
    assert p.aligned and as_text(p.propose(8).tokens) == " a\n"
    assert MIN_MATCH_TEXT > len("):")


def test_functions_made_methods_are_followed_across_their_new_indentation():
    p = byte_prediction(MODULE)
    out = "class Store:\n    def load(self):\n        with open(self.path) as f:\n"
    p.follow(list(out.encode()))
    assert as_text(p.propose(12).tokens) == "        retu"  # realigned on ") as f:\n", at the old indentation
    out += "            return json.load(f)"
    p.follow(list(out.encode()))
    # The line is the prediction's with four more spaces: the cursor moves to the shifted view and
    # proposes the next lines as the method would write them, not the function's indentation.
    assert p.aligned and as_text(p.propose(64).tokens).startswith("\n\n    def save(data, path):\n        with")
    out += "\n\n    def save(self, data):\n        with open(self.path, \"w\") as f:\n"
    p.follow(list(out.encode()))
    assert p.aligned and as_text(p.propose(64).tokens) == "            json.dump(data, f)\n"
    assert len(p.views) == 2  # one shift, built once


def test_an_output_at_the_predictions_own_indentation_builds_no_view():
    p = byte_prediction(MODULE)
    p.follow(list(b"def load(filename):\n    with open(filename) as f:\n        return json.load(f)"))
    assert p.aligned and len(p.views) == 1
    assert as_text(p.propose(10).tokens) == "\n\n\ndef sav"


def test_dedented_lines_follow_a_view_shifted_back():
    p = byte_prediction("class A:\n    def f(self):\n        x = compute(1)\n        return x * 2\n")
    p.follow(list(b"def f():\n    x = compute(1)"))
    assert p.aligned and p.views[p.view].shift == -4
    assert as_text(p.propose(64).tokens) == "\n    return x * 2\n"


def test_a_shifted_view_moves_lines_only_at_line_feeds():
    # A form feed, a lone carriage return or a line separator inside a line is not a line start.
    text, kept = shifted("a\fb\n  c\rd\u2028e\n\n\nf\n", 4)
    assert text == "    a\fb\n      c\rd\u2028e\n\n    f\n" and kept == [0, 1, 2, 4, 5]


def test_a_realignment_in_a_view_with_fewer_blank_lines_still_prefers_what_follows_the_anchor():
    # The shifted view drops one of the two blank lines, so its line numbers run one behind.
    sent = "def a():\n    y = 2\n    x = compute(1)\n\n\ndef b():\n    y = 2\n    x = compute(1)\n    return x\n"
    p = byte_prediction(sent)
    out = "def a():\n    y = 2\n    x = compute(1)\n\n\ndef b():\n    y = 2\n        x = compute(1)"
    for n in range(1, len(out) + 1):  # as the engine folds in each step's token
        p.follow(list(out[:n].encode()))
    assert p.views[p.view].shift == 4  # the second function's line, not the first's
    assert as_text(p.propose(32).tokens) == "\n        return x\n"


def test_shifted_views_are_capped():
    p = byte_prediction(MODULE)
    for n in range(1, 9):
        p.tail = bytearray(b"\n" + b" " * (4 + n) + b"return json.load(f)")
        p.pos = p._realign()
    assert len(p.views) == 1 + MAX_SHIFTED_VIEWS


# ---------------------------------------------------------------- configuration


def test_prediction_k_max_is_bounded_and_the_target_context_serves_it():
    assert EngineConfig().prediction_k_max == 16
    with pytest.raises(ValidationError):
        EngineConfig(prediction_k_max=33)
    cfg = EngineConfig(prediction_k_max=32, draft_k=2, lookup_k=2, auto_k_max=2, parallel=4)
    assert output_rows(cfg) >= 4 * 33


def test_an_empty_prediction_is_refused():
    with pytest.raises(ValidationError, match="prediction is empty"):
        GenerationRequest(prompt="hi", prediction="")


def test_the_controller_weighs_a_prediction_like_a_free_drafter():
    book = AcceptanceBook()
    ctl = Controller(scripted_costs(), k_max=4, has_draft_model=False, book=book)
    for _ in range(20):
        ctl.prediction.observe(16, 16)
    choice = ctl.choose(0, 0, 0, 4, prediction_available=40, prediction_cap=16, explore=False)
    assert choice.drafter == "prediction" and choice.k > 4  # past auto's k_max, up to its own cap
    accepted = ctl.prediction.accepted[0]
    ctl.observe(choice, choice.k, 0)  # the first token rejected: position 1 learns a failure
    assert ctl.prediction.accepted[0] < accepted and len(ctl.prediction.trials) == 16


def test_a_requests_prediction_evidence_stays_with_it():
    """One client's wrong prediction must not keep the next request from drafting its own."""
    book = AcceptanceBook()
    costs = Costs(verify=[0.01 * (1 + 0.3 * n) for n in range(17)], draft_step=0.001, draft_row=0.0005, pinned=True)
    first, second = (Controller(costs, k_max=4, has_draft_model=False, book=book) for _ in range(2))
    for _ in range(20):
        first.prediction.observe(8, 0)
    ask = dict(prediction_available=40, prediction_cap=16, explore=False)
    assert first.choose(0, 0, 0, 4, **ask).drafter == "off"
    assert second.choose(0, 0, 0, 4, **ask).drafter == "prediction"


def test_a_prediction_wins_a_tie_with_lookup():
    """Both copy the same file: the client's prediction drafts, so its usage counts what it gave."""
    ctl = Controller(scripted_costs(), k_max=16, has_draft_model=False, book=AcceptanceBook())
    for _ in range(20):
        ctl.book.for_lookup(16).observe(16, 16)
        ctl.prediction.observe(16, 16)
    choice = ctl.choose(0, 16, 40, 16, prediction_available=40, prediction_cap=16, explore=False)
    assert choice.drafter == "prediction"


# This CPU's learned curve (bench, 2 threads): 16 rows cost 8.4 single steps, 17 rows (a 16-token draft) 9.7.
CPU_SHAPE = [1.0, 1.85, 2.54, 3.09, 3.75, 6.32, 6.35, 7.47, 7.56, 8.17, 8.17, 8.36, 8.36, 8.39, 8.39, 8.39, 9.73]
ASK = dict(prediction_available=40, prediction_cap=16)  # explore=True, the engine's step, on a budget of 0


def cpu_controller() -> Controller:
    costs = Costs(verify=[0.035 * s for s in CPU_SHAPE], draft_step=0.01, draft_row=0.005, pinned=True)
    ctl = Controller(costs, k_max=8, has_draft_model=False, book=AcceptanceBook())
    for _ in range(20):  # believed right: the rates alone would go on drafting it after a few misses
        ctl.prediction.observe(16, 16)
    return ctl


def draft_steps(ctl: Controller, kept: int, steps: int, streak: int = 0) -> tuple[int, float]:
    """`steps` engine steps where every prediction draft keeps `kept`: (drafts, single steps lost)."""
    drafts, lost = 0, 0.0
    for _ in range(steps):
        choice = ctl.choose(0, 0, 0, 64, prediction_streak=streak, **ASK)
        if choice.drafter == "prediction":
            ctl.observe(choice, choice.k, kept)
            drafts, lost = drafts + 1, lost + ctl.costs.steps(choice.k + 1) - kept - 1
    return drafts, lost


def test_a_prediction_that_loses_stops_drafting_until_the_output_follows_it_again():
    ctl = cpu_controller()
    drafts, lost = draft_steps(ctl, kept=2, steps=40)  # the output parts from every draft at its third token
    assert drafts >= 1 and lost <= PREDICTION_STOP_LOSS + ctl.costs.steps(17)
    assert ctl.choose(0, 0, 0, 64, prediction_streak=PREDICTION_RESUME - 1, **ASK).drafter == "off"
    assert "prediction stopped" in ctl.why_not
    assert ctl.choose(0, 0, 0, 64, prediction_streak=PREDICTION_RESUME, explore=False, **ASK).drafter == "off"
    choice = ctl.choose(0, 0, 0, 64, prediction_streak=PREDICTION_RESUME, **ASK)
    assert choice.drafter == "prediction" and choice.k > ctl.k_max  # from its first belief: a long draft


def test_a_prediction_whose_first_draft_fails_at_the_edit_keeps_drafting():
    """`localspec edit` renaming a function in a 55-token file: the first draft parts at the renamed
    word, and the rest of the file copies. A stop-loss of 5 steps stopped it there for good."""
    costs = Costs(verify=[0.035 * s for s in CPU_SHAPE], draft_step=0.01, draft_row=0.005, pinned=True)
    ctl = Controller(costs, k_max=8, has_draft_model=False, book=AcceptanceBook())
    choice = ctl.choose(0, 0, 0, 64, **ASK)
    assert choice.drafter == "prediction" and choice.k > ctl.k_max
    ctl.observe(choice, choice.k, 2)  # "def total_price" predicted, "def order_total" written
    assert ctl.choose(0, 0, 0, 64, **ASK).drafter == "prediction"


def _rename_drafts(ctl: Controller, *, ahead: bool, copied: int = 48) -> list[int]:
    """The rename above, drafted on: the first draft parts at its fourth token (the renamed word), then
    the output follows the prediction for `copied` tokens. Each prediction draft's k (0: plain step);
    `ahead`: a draft kept whole also hears whether the target's next token was the prediction's (the
    verify's bonus token, as Active.ahead gives it)."""
    ks, done, first = [], 0, True
    while done < copied:
        choice = ctl.choose(0, 0, 0, 64, **ASK)
        k = choice.k if choice.drafter == "prediction" else 0
        kept = min(k, 3) if first else min(k, copied - done)
        # Past a whole draft the output goes on following, except at the edit (position 4 of the first).
        ctl.observe(choice, k, kept, ahead=(not first or k < 3) if ahead and k and kept == k else None)
        ks.append(k)
        done, first = done + kept + 1, first and not k
    return ks


def test_a_prediction_kept_whole_learns_the_position_past_it_from_the_bonus_token():
    """One rejection at the edit (position 4 of the first draft) stayed the request's evidence at position 4:
    on this CPU's curve every later draft stopped at 3, kept whole, and none reached position 4 to learn
    that the output copies on. The bonus token past a whole draft says what drafting one more would have."""
    costs = Costs(verify=[0.035 * s for s in CPU_SHAPE], draft_step=0.01, draft_row=0.005, pinned=True)
    stuck = _rename_drafts(Controller(costs, k_max=8, has_draft_model=False, book=AcceptanceBook()), ahead=False)
    assert stuck[0] > 3 and max(stuck[1:]) <= 3, stuck  # the trap, as it was
    grown = _rename_drafts(Controller(costs, k_max=8, has_draft_model=False, book=AcceptanceBook()), ahead=True)
    assert grown[0] > 3 and max(grown[1:]) > 8, grown
    assert len(grown) < len(stuck)  # fewer, longer passes


def test_a_stopped_prediction_counts_only_the_tokens_followed_since_it_stopped():
    ctl = cpu_controller()
    draft_steps(ctl, kept=0, steps=10, streak=40)  # the streak was 40 when it stopped (a prefix kept it going)
    assert ctl.choose(0, 0, 0, 64, prediction_streak=40 + PREDICTION_RESUME - 1, **ASK).drafter == "off"
    assert ctl.choose(0, 0, 0, 64, prediction_streak=5, **ASK).drafter == "off"  # broken: counts from 0
    assert ctl.choose(0, 0, 0, 64, prediction_streak=PREDICTION_RESUME, **ASK).drafter == "prediction"


def test_what_a_prediction_saved_early_does_not_pay_for_long_losses_later():
    ctl = cpu_controller()
    drafts, _ = draft_steps(ctl, kept=16, steps=30)  # copied well: saved far more than the credit
    assert drafts == 30 and ctl.prediction_net == PREDICTION_CREDIT
    drafts, lost = draft_steps(ctl, kept=0, steps=30)  # then wrong at every draft
    assert drafts >= 1 and lost <= PREDICTION_CREDIT + PREDICTION_STOP_LOSS + ctl.costs.steps(17)


def test_the_streak_counts_output_tokens_that_followed_the_prediction_in_a_row():
    p = byte_prediction("x = compute(1)\ny = compute(2)\nz = compute(3)\n")
    p.follow(list(b"x = compute("))
    assert p.streak == len("x = compute(")
    p.follow(list(b"x = compute(10"))  # the edit
    assert p.streak == 0 and not p.aligned
    p.follow(list(b"x = compute(10)\ny = com"))  # realigned: counting starts again after the match
    assert p.aligned and p.streak == 0
    p.follow(list(b"x = compute(10)\ny = compute(2)"))
    assert p.streak == len("pute(2)")


# ---------------------------------------------------------------- the engine

ANSWER = ("def area(width, height):\n    return width * height\n\n\n"
          "def perimeter(width, height):\n    return 2 * (width + height)\n")
EDITED = ANSWER.replace("area(width, height):\n    return", "area(width: float, height: float) -> float:\n    return")


def run(engine: Engine, *, prediction: str | None, mode: str | None = None, **kw) -> tuple[list[Token], Done]:
    tokens: list[Token] = []
    done = None
    request = GenerationRequest(prompt="add types", max_tokens=400, prediction=prediction, mode=mode, **kw)
    for event in engine.generate(request):
        if isinstance(event, Token):
            tokens.append(event)
        else:
            done = event
    assert done is not None and done.error is None, done
    return tokens, done


def engine_for(mode: str = "lookup") -> Engine:
    draft = scripted(default=EDITED.replace("height", "h")) if mode == "draft" else None  # a so-so draft model
    return scripted_engine(script=scripted(default=EDITED), draft_script=draft, mode=mode, parallel=1)


@pytest.mark.parametrize("engine_mode", ["lookup", "auto", "draft"])
def test_greedy_output_is_the_same_with_a_right_an_edited_or_a_wrong_prediction(engine_mode):
    plain = run(engine_for(engine_mode), prediction=None, mode="off")[1]
    for prediction in (EDITED, ANSWER, "Nothing like the answer at all, not one line of it." * 3):
        tokens, done = run(engine_for(engine_mode), prediction=prediction)
        assert done.text == plain.text == EDITED
        assert done.stats.completion_tokens == plain.stats.completion_tokens
        st = done.stats
        assert st.prediction_tokens == len(prediction.encode())
        assert st.prediction_accepted + st.prediction_rejected == st.prediction_drafted <= st.drafted
        # Each accepted prediction token streams with origin "prediction"; other drafters' with "draft"
        # (fewer of those than accepted when a draft model's end-of-text tokens were accepted, not emitted).
        assert st.prediction_accepted == sum(len(t.ids) for t in tokens if t.origin == "prediction")
        assert st.accepted - st.prediction_accepted >= sum(len(t.ids) for t in tokens if t.origin == "draft")
    right = run(engine_for(engine_mode), prediction=EDITED)[1].stats
    assert right.prediction_accepted >= right.completion_tokens - right.target_passes - 1
    assert right.target_passes <= right.completion_tokens // 8


def test_an_edited_prediction_is_followed_again_after_the_edit():
    st = run(engine_for(), prediction=ANSWER)[1].stats
    before_edit = len("def area(")
    assert st.prediction_accepted > before_edit + len("perimeter(width, height):")  # realigned past the edit
    assert st.prediction_rejected > 0
    assert st.target_passes < st.completion_tokens // 3


def test_a_wrong_prediction_costs_little_drafting():
    st = run(engine_for(), prediction="zzzz " * 40)[1].stats
    assert st.prediction_accepted == 0 and st.prediction_drafted <= st.prediction_tokens


def test_off_ignores_the_prediction_and_lookup_falls_back_when_it_is_lost():
    st = run(engine_for("lookup"), prediction=EDITED, mode="off")[1].stats
    assert st.prediction_drafted == 0 and st.drafted == 0 and st.prediction_tokens == len(EDITED)
    st = run(engine_for("off"), prediction=EDITED)[1].stats  # off as the engine's mode: off too
    assert st.prediction_drafted == 0 and st.drafted == 0
    st = run(engine_for("lookup"), prediction="zzzz " * 40, mode="lookup")[1].stats
    assert st.drafted > st.prediction_drafted  # lookup drafted while the prediction had nothing


def test_auto_drafts_from_the_prediction_even_where_lookup_could_copy_the_same():
    """The edit flow: the file is in the prompt and is the prediction. Seen in the predicted bench:
    after requests that taught lookup's shared book that copying pays, auto took lookup and the
    prediction drafted 8 of 136 tokens; now the prediction drafts (its usage counts what it gave)."""
    engine = engine_for("auto")
    prompt = "copy this:\n" + EDITED
    for prediction in (None, None, EDITED):
        request = GenerationRequest(prompt=prompt, max_tokens=400, prediction=prediction)
        done = [e for e in engine.generate(request) if isinstance(e, Done)][0]
    st = done.stats
    assert st.prediction_drafted >= 0.8 * st.drafted and st.prediction_accepted >= 0.8 * st.accepted


def test_auto_hears_how_long_the_output_has_followed_the_prediction(monkeypatch):
    streaks: list[int] = []
    choose = Controller.choose

    def recording(self, *args, prediction_streak: int = 0, **kw):
        streaks.append(prediction_streak)
        return choose(self, *args, prediction_streak=prediction_streak, **kw)

    monkeypatch.setattr(Controller, "choose", recording)
    run(engine_for("auto"), prediction=EDITED)
    assert max(streaks) >= PREDICTION_RESUME and streaks == sorted(streaks)  # one run, followed throughout


def test_a_prediction_kept_whole_tells_the_controller_whether_the_output_went_on_following_it(monkeypatch):
    """Active.ahead for a prediction: after a draft kept whole, the verify's bonus token is compared with the
    prediction's next token (the cursor still where the draft started), as for a lookup copy."""
    from tests.fake_tier import record_aheads

    seen = record_aheads(monkeypatch, "prediction")
    done = run(engine_for("auto"), prediction=EDITED)[1]
    assert done.text == EDITED
    assert any(a is True for d, k, a in seen if k == d), seen  # the output followed on past a whole draft


def test_the_bonus_token_past_a_whole_prediction_draft_is_compared_with_the_predictions_next_token():
    from localspec.engine.events import Stats
    from localspec.engine.slots import Active, Handle
    from localspec.engine.verify import Draft, PositionRng, Verdict

    prediction = byte_prediction("abcdef")
    a = Active(handle=Handle(1), request=GenerationRequest(prompt="x"), tokens=[1], n_prompt=1, mode="auto", k=8,
               rng=PositionRng(0), stats=Stats(), t_submit=0.0, prediction=prediction)
    d = prediction.propose(3)
    assert d.tokens == tuple(b"abc")
    assert a.ahead(d, Verdict(3, ord("d"))) is True  # the output goes on following it
    assert a.ahead(d, Verdict(3, ord("X"))) is False  # the edit is right after the draft
    assert a.ahead(d, Verdict(2, ord("X"))) is None  # rejected: the draft shows where it ended
    whole = prediction.propose(6)
    assert a.ahead(whole, Verdict(6, ord("\n"))) is None  # nothing predicted past it
    assert a.ahead(Draft(tuple(b"abd"), source="prediction"), Verdict(3, ord("d"))) is None  # not from the cursor


def test_a_sampled_request_with_a_prediction_keeps_the_answer():
    from localspec.engine.sampling import SamplingParams

    st_done = run(engine_for(), prediction=EDITED, sampling=SamplingParams(temperature=0.8, seed=3))[1]
    assert st_done.text == EDITED  # the scripted model is sure of every token: any sampler follows it
    assert st_done.stats.prediction_accepted > 0


def test_a_prediction_longer_than_the_context_is_refused():
    engine = scripted_engine(script=scripted(default="OK."), n_ctx=128, parallel=1)
    with pytest.raises(PredictionTooLongError, match="129 tokens but the context holds 128"):
        engine.submit(GenerationRequest(prompt="hi", prediction="x" * 129))


class MergingRuntime(ScriptedRuntime):
    """A tokenizer that merges more than the model writes: the prediction's "<|fim_prefix|>" becomes
    one token while the model spells it byte by byte, as a BPE tokenizer may merge a word the model
    writes in pieces."""

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return super().tokenize(text, add_special, parse_special=True)


def test_the_engine_drafts_again_after_the_output_spells_a_predicted_token_differently():
    merged = "def f():\n    return '<|fim_prefix|>'\n\n\nprint(f(), f(), f(), f(), f(), f())\n"
    engine = Engine(target=MergingRuntime(scripted(default=merged), n_seq_max=1),
                    config=EngineConfig(parallel=1, mode="lookup", pinned_prefix_cells=0))
    prediction = prepare(merged, engine.target, n_ctx=engine.config.n_ctx)
    assert SPECIAL["<|fim_prefix|>"] in prediction.tokens
    tokens, done = run(engine, prediction=merged)
    assert done.text == merged
    st = done.stats
    tail = len("'\n\n\nprint(f(), f(), f(), f(), f(), f())\n")
    assert st.prediction_rejected >= 1  # the merged token itself: the model writes "<" instead
    # Realigned by text: the prediction's tokens after the merged one are drafted and kept (at most
    # the 20 before it could be without; each pass's own last token is the target's, not accepted).
    assert st.prediction_accepted > len("def f():\n    return '") + tail // 2


# ---------------------------------------------------------------- edits that recur


def test_the_output_leaving_the_prediction_at_a_token_lowers_its_odds_there_each_time():
    p = byte_prediction("x = f(path)\ny = f(path)\nz = f(path)\n")
    out = "x = f(self.path)\ny = f("
    p.follow(list(out.encode()))  # left at "p" of the first "path", realigned on ")\ny = f("
    assert p.aligned and p.left[ord("p")] == 1 and p.followed[ord("p")] == 0
    assert p.follow_odds(3) == [1 / 3, 1.0, 1.0]  # "pat": only "p" was ever left
    out += "self.path)\nz = f("
    p.follow(list(out.encode()))
    assert p.aligned and p.left[ord("p")] == 2 and p.follow_odds(1) == [1 / 4]


def test_a_token_the_output_followed_regains_its_odds():
    p = byte_prediction("a = g(path)\nb = g(path)\nc = g(path)\nd = g(path)\n")
    p.follow(list(b"a = g(path)\nb = g(path)\nc = g(self.path)\nd = g("))
    assert (p.followed[ord("p")], p.left[ord("p")]) == (2, 1)  # followed twice, left once
    assert p.follow_odds(2) == [3 / 5, 1.0] and len(p.follow_odds(64)) == len("path)\n")
    p.follow(list(b"a = g(path)\nb = g(path)\nc = g(self.path)\nd = g(x"))
    assert not p.aligned and p.follow_odds(4) == []  # lost: nothing to propose, no odds


def odds_controller(shape: list[float]) -> Controller:
    costs = Costs(verify=[0.035 * s for s in shape], draft_step=0.01, draft_row=0.005, pinned=True)
    ctl = Controller(costs, k_max=8, has_draft_model=False, book=AcceptanceBook())
    for _ in range(20):
        ctl.prediction.observe(16, 16)
    return ctl


def test_on_a_cpu_auto_stops_a_prediction_draft_before_a_likely_edit_and_on_a_gpu_drafts_through():
    """A draft kept up to a recurring edit gives the same tokens for a shorter verify: worth stopping
    for where rows cost (this CPU's curve), not where they are nearly free (a GPU's)."""
    odds = [1.0] * 6 + [1 / 4] + [1.0] * 33  # the 7th token is one the output left twice and never followed
    ask = dict(prediction_available=40, prediction_cap=16, explore=False)
    cpu = odds_controller(CPU_SHAPE)
    assert cpu.choose(0, 0, 0, 64, **ask).k >= 12  # believed right throughout: a long draft
    choice = cpu.choose(0, 0, 0, 64, prediction_odds=odds, **ask)
    assert choice.drafter == "prediction" and 1 <= choice.k <= 6  # before the edit (4: the curve's step at 5 rows)
    gpu = odds_controller([1.0 + 0.01 * n for n in range(17)])
    assert gpu.choose(0, 0, 0, 64, prediction_odds=odds, **ask).k == 16
