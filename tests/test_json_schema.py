"""A client's JSON schema before the grammar converter: refs re-rooted, an integer's and a number's bounds
as digit ranges.

The ranges are checked by brute force: the same alternatives written as a regex (here, in the test) must
match exactly the integers (numbers) within the bounds, each written as JSON writes it.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import llama_cpp
import pytest

from localspec.engine.json_schema import (Bound, Digits, bounded_ranges, integer_alternatives, integer_gbnf, number_bounds,
                                          number_gbnf, with_range_rules)


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
    ranged, rules = bounded_ranges(schema, "schema")
    assert list(rules.values()) == [integer_gbnf(2, 3)] and ranged["properties"]["n"] == {"const": next(iter(rules))}
    assert ranged["properties"]["tagged"] == schema["properties"]["tagged"] and schema["properties"]["n"]["minimum"] == 1.5
    marker = next(iter(rules))
    assert with_range_rules(f'n ::= "\\"{marker}\\""\n', rules) == f"n ::= {integer_gbnf(2, 3)} space\n"


def test_a_marker_the_converter_wrote_otherwise_is_not_left_for_the_model_to_write(monkeypatch):
    """Left in place, a marker constant would be the one value the grammar lets the model write: the
    grammar is then the converter's own, and the reply names the bounds it does not keep."""
    from localspec.server import translate
    from localspec.server.schemas import ChatCompletionRequest

    _, rules = bounded_ranges({"type": "integer", "minimum": 1}, "schema")
    marker = next(iter(rules))
    assert with_range_rules(f"n ::= \"{marker}\"\n", rules) is None  # written without the JSON quotes
    monkeypatch.setattr(translate, "with_range_rules", lambda gbnf, rules: None)
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}}}
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
    plan = translate.chat_plan(ChatCompletionRequest.model_validate(body), 16)
    assert "localspec-range" not in (plan.request.grammar or "") and plan.grammar_kept == "partial"
    assert [p.rsplit(".", 1)[-1] for p in plan.grammar_unenforced] == ["minimum", "maximum"]


# ---------------------------------------------------------------- number ranges


def _number_matcher(rule: str) -> re.Pattern[str]:
    """The number rule as a regex: it is built of literals, classes, groups, `?` and `{m,n}` only."""
    return re.compile(re.sub(r'"(.)"', lambda m: re.escape(m.group(1)), rule).replace(" ", ""))


def _near(values: list[Decimal]) -> set[str]:
    """Numbers around each value and zero, in steps from 1 down to 0.0001, each written several ways
    (trailing zeros, no fraction) as JSON writes a number without an exponent."""
    out = set()
    for centre in [*values, Decimal(0)]:
        for step in (Decimal(1), Decimal("0.1"), Decimal("0.01"), Decimal("0.001"), Decimal("0.0001")):
            for k in range(-30, 31):
                v = centre + k * step
                out.update(text for text in (f"{v:f}", f"{v:.4f}", f"{v:.6f}", f"{v:.0f}")
                           if not (text.startswith("-") and Decimal(text) == 0))  # "-0": JSON, and no bound's business
    return out


def _b(value: str, strict: bool = False) -> Bound:
    return Bound(Decimal(value), strict)


NUMBER_BOUNDS = [(_b("0"), _b("1")), (_b("0"), None), (_b("0", True), None), (None, _b("0")), (None, _b("0", True)),
                 (_b("-1.5"), _b("2.25")), (_b("0.1"), _b("0.2")), (_b("0.15"), _b("0.15")),
                 (_b("-3.75", True), _b("-1.05", True)), (_b("12.5"), _b("130.007")), (_b("-0.001"), _b("0.001", True)),
                 (None, _b("-2.5")), (_b("99.99"), None), (_b("0.5", True), _b("1", True)), (_b("1e-10"), _b("1")),
                 (_b("7", True), _b("8", True)), (_b("-5"), _b("-5"))]


@pytest.mark.parametrize(("lo", "hi"), NUMBER_BOUNDS)
def test_a_number_rule_matches_exactly_the_numbers_within_the_bounds(lo, hi):
    rule = number_gbnf(lo, hi)
    assert rule is not None
    matcher = _number_matcher(rule)
    for text in _near([b.value for b in (lo, hi) if b is not None]):
        value = Decimal(text)
        inside = (lo is None or value > lo.value or (value == lo.value and not lo.strict)) and (
            hi is None or value < hi.value or (value == hi.value and not hi.strict))
        assert bool(matcher.fullmatch(text)) is inside, (lo, hi, text)
    for text in ("-0", "-0.0", "00", "01", "1.", ".5", "1e3", "1E-2", "+1", "", "-", "0." + "0" * 17):
        assert not matcher.fullmatch(text), (lo, hi, text)  # not JSON, or an exponent, "-0", 17 decimals
    llama_cpp.LlamaGrammar.from_string(f"root ::= {rule}\n", verbose=False)


@pytest.mark.parametrize(("lo", "hi"), [(_b("0.15", True), _b("0.15")), (_b("2"), _b("1")), (_b("0", True), _b("0"))])
def test_bounds_that_leave_no_number_have_no_rule(lo, hi):
    assert number_gbnf(lo, hi) is None


def test_a_numbers_bounds_are_the_tightest_and_exact():
    """0.1 is the decimal the client wrote, not its binary float; of two bounds at one value, the exclusive."""
    lo, hi = number_bounds({"type": "number", "minimum": 0.1, "exclusiveMinimum": 0.1, "maximum": 3, "exclusiveMaximum": 2.5})
    assert lo == _b("0.1", True) and hi == _b("2.5", True)


def test_a_bounded_number_in_a_schema_becomes_its_rule_and_unkeepable_bounds_stay():
    """pydantic's Field(ge=0, le=1) on a float; bounds with more decimals than the grammar's fraction, or
    draft 4's boolean exclusiveMinimum, stay for the converter and are named as not kept."""
    schema: dict[str, Any] = {"type": "object", "properties": {
        "p": {"type": "number", "minimum": 0, "maximum": 1, "title": "P"},
        "fine": {"type": "number", "minimum": 0.12345678901234566},
        "draft4": {"type": "number", "minimum": 0, "exclusiveMinimum": True}}}
    ranged, rules = bounded_ranges(schema, "schema")
    assert list(rules.values()) == [number_gbnf(_b("0"), _b("1"))] and ranged["properties"]["p"] == {"const": next(iter(rules))}
    assert ranged["properties"]["fine"] == schema["properties"]["fine"]
    assert ranged["properties"]["draft4"] == schema["properties"]["draft4"]


def test_a_root_ref_to_a_bounded_number_keeps_its_bounds_or_names_them():
    """A root `$ref` is inlined beside its `$defs`, so the inlined copy was no plain bounded node: the
    converter's unbounded number was served, while the bounds (read where the original holds them, in
    $defs) were counted as kept: "grammar: enforced" and 7.5 against 0..1."""
    from localspec.server.translate import schema_grammar

    for kind, rule in (("number", number_gbnf(_b("0"), _b("1"))), ("integer", integer_gbnf(0, 1))):
        schema = {"$ref": "#/$defs/P", "$defs": {"P": {"type": kind, "minimum": 0, "maximum": 1}}}
        got = schema_grammar(schema)
        assert f"root ::= {rule} space" in got.gbnf or got.unenforced, (kind, got)


def test_bounds_whose_rules_outgrow_the_grammar_are_named_not_refused():
    """A number's rule is up to a few KB (its fraction digit by digit): 400 bounded numbers, served
    yesterday with their bounds named ("partial"), became a 400 schema_too_large. Past the grammar's
    size, the bounds are not kept but named, as where they cannot be placed."""
    from localspec.server.translate import schema_grammar

    def group() -> dict[str, Any]:
        return {"type": "object", "properties": {
            f"p{i}": {"type": "number", "minimum": -123456.789, "maximum": 98765.4321} for i in range(200)}}

    got = schema_grammar({"type": "object", "properties": {"a": group(), "b": group()}})
    assert "localspec-range" not in got.gbnf and len(got.unenforced) == 800
    assert "response_format.json_schema.schema.properties.a.properties.p0.minimum" in got.unenforced
    one = schema_grammar({"type": "object", "properties": {"a": group()}})  # fits: kept
    assert one.unenforced == () and number_gbnf(_b("-123456.789"), _b("98765.4321")) in one.gbnf


def test_bounds_with_room_only_past_16_decimals_are_named_not_refused():
    """Between 0.1234567890123456 and ...457 (both exclusive) lie numbers, all with 17 decimals or more,
    which the rule cannot write: that was a 400 "no number meets", a valid schema refused. Its bounds
    are not kept but named; bounds with no number at all between them stay a 400."""
    from localspec.server.errors import APIError
    from localspec.server.translate import schema_grammar

    tight = {"type": "number", "exclusiveMinimum": 0.1234567890123456, "exclusiveMaximum": 0.1234567890123457}
    got = schema_grammar(tight)
    assert sorted(p.rsplit(".", 1)[-1] for p in got.unenforced) == ["exclusiveMaximum", "exclusiveMinimum"]
    with pytest.raises(APIError, match="no number meets"):
        schema_grammar({"type": "number", "exclusiveMinimum": 0.5, "maximum": 0.5})


@pytest.mark.parametrize("schema", [
    {"type": ["string", "null"]}, {"type": "object", "additionalProperties": False, "properties": {"a": {}}},
    {"type": "array", "prefixItems": [{"type": "integer"}], "items": False}, {"type": "object", "not": True},
    {"type": "object", "patternProperties": {"^x": True}}, {"type": "string", "minLength": 1, "maxLength": 3},
])
def test_a_schema_the_converter_reads_passes_the_shape_check(schema):
    """check_shapes refuses only what the converter failed on with a Python error: these compiled before it."""
    from localspec.server.translate import schema_grammar

    assert schema_grammar(schema).gbnf


@pytest.mark.parametrize(("schema", "named"), [
    ({"type": "array", "items": 5}, "s.items is a number, not a schema."),
    ({"anyOf": [None]}, "s.anyOf[0] is null, not a schema."),
    ({"type": "object", "properties": {"a": True}}, "s.properties.a is a boolean, not a schema."),
    ({"type": "object", "properties": []}, "s.properties is a list, not an object."),
    ({"enum": "abc"}, "s.enum is a string, not a list."),  # was taken as its characters
    ({"type": ["string", 5]}, "s.type is a list holding a number, not a type name."),
    ({"type": "string", "minLength": 2.0}, "s.minLength is 2.0, not an integer."),
    ({"type": "string", "pattern": 5}, "s.pattern is a number, not a string."),
])
def test_a_value_of_the_wrong_json_type_in_a_schema_is_named_by_its_path(schema, named):
    from localspec.engine.json_schema import SchemaInvalid, check_shapes

    with pytest.raises(SchemaInvalid) as err:
        check_shapes(schema, "s")
    assert str(err.value).startswith(named) and "Fix: " in str(err.value)
