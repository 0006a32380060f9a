"""A client's JSON schema before the grammar converter: refs re-rooted, an integer's bounds as digit ranges.

The integer ranges are checked by brute force: the same alternatives written as a regex (here, in the
test) must match exactly the integers within the bounds, each written as JSON writes it.
"""

from __future__ import annotations

import re
from typing import Any

import llama_cpp
import pytest

from localspec.engine.json_schema import Digits, integer_alternatives, integer_gbnf, integer_ranges, with_integer_rules


def _regex(alternatives: list[Digits]) -> str:
    def one(d: Digits) -> str:
        return "".join(f"[{a}-{b}]" for a, b in d.classes) + ("[0-9]*" if d.more else "")

    return "|".join(one(d) for d in alternatives)


def _matcher(lo: int | None, hi: int | None) -> re.Pattern[str]:
    negative, rest = integer_alternatives(lo, hi)
    parts = ([f"-(?:{_regex(negative)})"] if negative else []) + ([f"(?:{_regex(rest)})"] if rest else [])
    return re.compile("(?:" + "|".join(parts) + ")")


BOUNDS = [(0, 0), (7, 7), (0, 9), (1, 10), (100, 200), (5, 1234), (19, 91), (-5, 12), (-1000, -999), (-37, -3),
          (0, None), (1, None), (42, None), (999, None), (None, -3), (None, 0), (None, 250), (-20, None),
          (10**17, 10**17 + 11)]


@pytest.mark.parametrize(("lo", "hi"), BOUNDS)
def test_the_alternatives_match_exactly_the_integers_within_the_bounds(lo, hi):
    matcher = _matcher(lo, hi)
    centre = lo if lo is not None else hi if hi is not None else 0
    for n in range(centre - 1500, centre + 1500):
        inside = (lo is None or n >= lo) and (hi is None or n <= hi)
        assert bool(matcher.fullmatch(str(n))) is inside, (lo, hi, n)
    for text in ("007", "-0", "00", "-", "", "1.5", "+3"):  # not JSON integers, or not integers
        assert not matcher.fullmatch(text), (lo, hi, text)


@pytest.mark.parametrize(("lo", "hi"), BOUNDS)
def test_each_range_is_a_grammar_llama_cpp_parses(lo, hi):
    llama_cpp.LlamaGrammar.from_string(f"root ::= {integer_gbnf(lo, hi)}\n", verbose=False)


def test_a_bounded_integer_in_a_schema_becomes_its_rule_and_other_nodes_stay():
    schema: dict[str, Any] = {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 1.5, "exclusiveMaximum": 4, "description": "kept out"},
        "tagged": {"type": "integer", "minimum": 0, "enum": [0, 1]},  # not plain: left to the refusal
        "free": {"type": "integer"}}}
    ranged, rules = integer_ranges(schema, "schema")
    assert list(rules.values()) == [integer_gbnf(2, 3)] and ranged["properties"]["n"] == {"const": next(iter(rules))}
    assert ranged["properties"]["tagged"] == schema["properties"]["tagged"] and schema["properties"]["n"]["minimum"] == 1.5
    marker = next(iter(rules))
    assert with_integer_rules(f'n ::= "\\"{marker}\\""\n', rules) == f"n ::= {integer_gbnf(2, 3)} space\n"


def test_a_marker_the_converter_wrote_otherwise_is_not_left_for_the_model_to_write(monkeypatch):
    """Left in place, a marker constant would be the one value the grammar lets the model write: the
    grammar is then the converter's own, and the reply names the bounds it does not keep."""
    from localspec.server import translate
    from localspec.server.schemas import ChatCompletionRequest

    _, rules = integer_ranges({"type": "integer", "minimum": 1}, "schema")
    marker = next(iter(rules))
    assert with_integer_rules(f"n ::= \"{marker}\"\n", rules) is None  # written without the JSON quotes
    monkeypatch.setattr(translate, "with_integer_rules", lambda gbnf, rules: None)
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}}}
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
    plan = translate.chat_plan(ChatCompletionRequest.model_validate(body), 16)
    assert "localspec-integer" not in (plan.request.grammar or "") and plan.grammar_kept == "partial"
    assert [p.rsplit(".", 1)[-1] for p in plan.grammar_unenforced] == ["minimum", "maximum"]
