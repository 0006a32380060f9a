"""scripts/replay_auto.py: auto's choices replayed over recorded answers, on a byte tokenizer."""

from __future__ import annotations

import pytest

from localspec.engine.costs import Costs
from scripts.replay_auto import FIXED_RULES, Recorded, ceiling_table, fixed_rule, lookup_ceiling, replay, summary

# A GPU-like curve: 17 rows cost 1.3 single steps, so a copy kept whole pays at once.
FLAT = Costs(verify=[0.02 * (1 + 0.02 * n) for n in range(17)], draft_step=0.004, draft_row=0.0002, pinned=True)
# A steep CPU curve: a pass of n rows costs n single steps, so no draft can pay.
STEEP = Costs(verify=[0.03 * n for n in range(1, 18)], draft_step=0.02, draft_row=0.01, pinned=True)

CODE = "".join(f"def f{i}(x):\n    return x * {i} + {i * i}\n\n" for i in range(12))


class Bytes:
    """One token per byte: the prediction's cursor and lookup's n-grams work on any tokenizer."""

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return list(text.encode())

    def piece(self, token: int) -> bytes:
        return bytes([token])


def _item(answer: str, prediction: str, key: str = "copy") -> Recorded:
    prompt = list(f"Rename nothing in this file:\n{CODE}\n".encode())
    return Recorded(suite="predicted", key=key, prompt=prompt, answer=list(answer.encode()), prediction=prediction)


def test_a_copy_replays_faster_than_plain_decoding_where_verifying_is_cheap():
    runs = replay([_item(CODE, CODE)], FLAT, Bytes(), seed=1)
    table = summary(runs)
    assert table["predicted", "auto+prediction"]["copy"] > 5.0
    assert table["predicted", "auto"]["copy"] > 2.0
    drafted = runs["predicted", "copy", "auto+prediction"][0].drafts
    assert drafted and drafted[0].startswith("p m=")


def test_where_no_draft_can_pay_auto_replays_at_plain_speed():
    runs = replay([_item(CODE, CODE)], STEEP, Bytes(), seed=1, explore=0.0)
    assert summary(runs)["predicted", "auto+prediction"]["copy"] <= 1.0 + 1e-9
    assert summary(runs)["predicted", "auto"]["copy"] == 1.0


def test_a_wrong_prediction_still_replays_the_answer():
    answer = "class Nothing:\n    pass\n" * 20
    runs = replay([_item(answer, CODE, key="wrong")], FLAT, Bytes(), seed=3)
    for r in runs["predicted", "wrong", "auto+prediction"]:
        assert 0.5 < r.speedup < 20


def test_the_ceiling_is_above_every_fixed_rule_and_plain_decoding():
    """The ceiling knows where each copy ends: no rule that drafts blind can beat it."""
    edited = CODE.replace("return x * 3", "return x * 30").replace("def f7", "def g7")
    item = _item(edited, "")
    bound = lookup_ceiling(item, FLAT)
    assert bound > 3.0  # most of the answer is a copy of the prompt, and 17 rows cost 1.3 steps
    for k, m in FIXED_RULES:
        assert fixed_rule(item, FLAT, k=k, min_match=m) <= bound + 1e-9


def test_where_a_pass_of_n_rows_costs_n_steps_the_ceiling_is_plain_decoding():
    item = _item(CODE, "")
    assert abs(lookup_ceiling(item, STEEP) - 1.0) < 1e-9
    assert fixed_rule(item, STEEP, k=16, min_match=16) <= 1.0 + 1e-9


def test_items_without_a_prediction_replay_auto_alone_and_the_table_names_each_row():
    item = Recorded(suite="code", key="0", prompt=list(b"Write a function."), answer=list(CODE.encode()),
                    prediction="")
    runs = replay([item], FLAT, Bytes(), seed=1)
    assert set(runs) == {("code", "0", "auto")}
    lines = ceiling_table([item], FLAT, summary(runs))
    assert lines[0] == "code: 0" and lines[1].lstrip().startswith("ceiling")
    assert any(line.lstrip().startswith("auto (replay)") for line in lines)


def test_an_ask_is_priced_by_its_passes_on_the_curve():
    from localspec.engine.events import Stats
    from scripts.replay_auto import modeled_steps

    costs = Costs(verify=[0.03 * s for s in (1, 1.5, 2, 2.5, 3, 3.5)], draft_step=0.0, draft_row=0.0, pinned=True)
    s = Stats(target_passes=6)
    for drafted, kept in ((5, 5), (2, 0), (2, 2)):  # three drafts, then three plain passes
        s.record_position(drafted, kept)
    # 3 plain passes at 1 step, two drafts of 2 at verify(3) = 2 steps, one of 5 at verify(6) = 3.5 steps.
    assert modeled_steps(s, costs) == pytest.approx(3 * 1 + 2 * 2 + 3.5)
