"""A client's JSON schema, made ready for llama-cpp-python's schema-to-grammar converter.

The converter enforces type, properties, required, additionalProperties, items, prefixItems,
minItems/maxItems, enum, const, anyOf/oneOf/allOf, $ref, pattern, minLength/maxLength and string
formats. Two things it gets wrong are fixed here, and one is refused:

* a root that is itself a `$ref` (pydantic's schema for a recursive model) resolves that one ref and
  never reads the `$defs` beside it: a KeyError on the first nested ref. The root is inlined.
* a schema nested under another (a tool's parameters under the forced call's `arguments`) keeps
  refs like `#/$defs/Addr` that point at the new root. Its definitions move there (`hoisted`).
* keywords that restrict values and that it drops without a word (`minimum`, `uniqueItems`, ...):
  the reply said "grammar: enforced" while `{"n": 5}` broke `"minimum": 100`. An integer's or a
  number's bounds become a rule of our own (`bounded_ranges`); the rest are named (`unenforced`), and
  the reply says "grammar: partial" with their paths rather than promise them.
"""

from __future__ import annotations

import copy
import json
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from localspec.engine.grammar_limits import _COMBINATORS, _NESTED_DICTS, _NESTED_MAPS, subschemas
from localspec.errors import RequestError

# Keywords that narrow what is valid and that the converter ignores. Annotations (title, description,
# default, examples, $comment, deprecated, unknown formats) change nothing and pass. An integer's and a
# number's bounds are kept by a grammar of our own (`bounded_ranges`).
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
INTEGER_LIMIT = 10**18  # bounds past this are not enforced: each digit of a bound is a group in the grammar
FRACTION_DIGITS = 16  # digits after a bounded number's point, as many as the converter's own numbers have
UNENFORCED = (
    *BOUNDS, "multipleOf", "uniqueItems",
    "minProperties", "maxProperties", "not", "if", "then", "else", "contains", "minContains", "maxContains",
    "dependentRequired", "dependentSchemas", "dependencies", "patternProperties", "propertyNames",
    "unevaluatedProperties", "unevaluatedItems",
)


def _subschemas(node: Any, where: str) -> Iterator[tuple[dict[str, Any], str]]:
    """Every schema object under `node` (itself included), with its path; iterative."""
    todo: list[tuple[Any, str]] = [(node, where)]
    while todo:
        value, path = todo.pop()
        if isinstance(value, dict):
            yield value, path
            todo.extend(subschemas(value, path))


class SchemaInvalid(RequestError):
    """A schema that says nothing as written: a local `$ref` to nothing or round a loop of refs, an
    integer or a number whose bounds leave no value."""


def unenforced(schema: Any, field: str, *, bounds_kept: bool = True) -> list[str]:
    """Where the schema holds a keyword the grammar will not keep (an integer's or a number's bounds are
    kept, unless `bounds_kept` is False), as paths: `properties.tags.uniqueItems`. A pydantic model writes
    them (`set[str]`, `Field(multiple_of=5)`): the request is served, and the reply says which."""
    return [f"{where}.{keyword}" for node, where in _subschemas(schema, field) for keyword in UNENFORCED
            if keyword in node and not (bounds_kept and keyword in BOUNDS and _bounded(node))]


_SCHEMA_FIX = 'Send a schema object ({"type": ...}, or {} for any value)'


def _kind(value: Any) -> str:
    """What a JSON value is, in words, for an error that names what came instead of a schema."""
    kinds = ((type(None), "null"), (bool, "a boolean"), (int | float, "a number"), (str, "a string"), (list, "a list"))
    return next((words for kind, words in kinds if isinstance(value, kind)), "an object")


def check_shapes(schema: Any, field: str) -> None:
    """SchemaInvalid for a keyword whose value has the wrong JSON type where the converter reads it (a
    number where a schema goes, a string for a list of them, a non-string pattern): it raised a Python
    error that the 400 named instead ("'int' object has no attribute 'get'"). A boolean schema (`true`)
    is one where the converter takes it (additionalProperties, `items: false` after prefixItems) or ignores it."""
    for node, where in _subschemas(schema, field):
        for key, value in node.items():
            at = f"{where}.{key}"
            if key in _NESTED_MAPS:
                if not isinstance(value, dict):
                    raise SchemaInvalid(f"{at} is {_kind(value)}, not an object.", "Send an object of names, each "
                                        f"with its schema ({key}: {{\"name\": {{\"type\": ...}}}}).")
                bad = next(((name, sub) for name, sub in value.items()  # true/false: where the converter ignores them
                            if not (isinstance(sub, dict) or (isinstance(sub, bool) and key != "properties"))), None)
                if bad is not None:
                    raise SchemaInvalid(f"{at}.{bad[0]} is {_kind(bad[1])}, not a schema.", f"{_SCHEMA_FIX}.")
            elif key in (*_COMBINATORS, "prefixItems") or (key == "items" and isinstance(value, list)):
                if not isinstance(value, list):
                    raise SchemaInvalid(f"{at} is {_kind(value)}, not a list of schemas.", f"{_SCHEMA_FIX} in a list.")
                bad = next(((i, sub) for i, sub in enumerate(value) if not isinstance(sub, dict)), None)
                if bad is not None:
                    raise SchemaInvalid(f"{at}[{bad[0]}] is {_kind(bad[1])}, not a schema.", f"{_SCHEMA_FIX}.")
            elif key in _NESTED_DICTS and not (isinstance(value, dict) or value is False
                                               or (value is True and key != "items")):
                raise SchemaInvalid(f"{at} is {_kind(value)}, not a schema.", f"{_SCHEMA_FIX}.")
            elif key in ("$ref", "pattern", "format") and not isinstance(value, str):
                raise SchemaInvalid(f"{at} is {_kind(value)}, not a string.", f"Send {key} as a string.")
            elif key == "enum" and not isinstance(value, list):
                raise SchemaInvalid(f"{at} is {_kind(value)}, not a list.", "Send the allowed values in a list.")
            elif key in ("minLength", "maxLength", "minItems", "maxItems") and (
                    isinstance(value, bool) or not isinstance(value, int)):
                shown = json.dumps(value) if isinstance(value, float) else _kind(value)
                raise SchemaInvalid(f"{at} is {shown}, not an integer.", f"Send {key} as a whole number (2, not 2.0).")
            elif key == "type" and not isinstance(value, str):
                bad = next((t for t in value if not isinstance(t, str)), None) if isinstance(value, list) else value
                what = ("an empty list" if value == [] else f"a list holding {_kind(bad)}" if isinstance(value, list)
                        else _kind(value))
                if value == [] or bad is not None:
                    raise SchemaInvalid(f"{at} is {what}, not a type name.", 'Send a type name ("string", '
                                        '"object", ...) or a list of them.')


def check_refs(schema: Any, field: str) -> None:
    """SchemaInvalid for a local ref that leads nowhere, only round a loop of refs, or to an anchor: the
    converter wrote a rule naming an undefined one, which only the engine's grammar parser refused."""
    for node, where in _subschemas(schema, field):
        ref, seen = node.get("$ref"), set()
        while isinstance(ref, str) and ref.startswith("#"):
            if ref != "#" and not ref.startswith("#/"):
                raise SchemaInvalid(f"{where}.$ref: '{ref}' is an anchor, which this server does not resolve.",
                                    "Point the $ref at a path, such as #/$defs/Name.")
            if ref in seen:
                raise SchemaInvalid(f"{where}.$ref: '{ref}' leads only to refs in a loop.",
                                    "Point the $ref at a schema that says what the value is.")
            seen.add(ref)
            target = _pointer(schema, ref)
            if not isinstance(target, (dict, bool)):
                raise SchemaInvalid(f"{where}.$ref: '{ref}' points at nothing in the schema.",
                                    "Point the $ref at a definition under $defs.")
            ref = target.get("$ref") if isinstance(target, dict) else None


def _pointer(schema: dict[str, Any], ref: str) -> Any:
    target: Any = schema
    for part in ref.removeprefix("#").split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(target, dict) or part not in target:
            return None
        target = target[part]
    return target


def root_ref_inlined(schema: Any) -> Any:
    """A root that is a local `$ref` replaced by what it points to, its `$defs` kept beside it."""
    if not isinstance(schema, dict) or not isinstance(ref := schema.get("$ref"), str) or not ref.startswith("#/"):
        return schema
    target = _pointer(schema, ref)
    if not isinstance(target, dict) or "$ref" in target:  # a chain of refs: left for the converter to refuse
        return schema
    return {**{k: v for k, v in schema.items() if k != "$ref"}, **target}


def hoisted(schema: Any, name: str) -> dict[str, Any]:
    """`schema` as entries of another schema's `$defs`: itself as `name`, each of its own definitions as
    `name_<definition>`, every local ref re-rooted to where it now stands. Nested as they were
    (`#/$defs/tool0/$defs/Addr`), two tools' `Addr` became one grammar rule: the converter names a
    ref's rule by its last part."""
    body = copy.deepcopy(schema)
    if not isinstance(body, dict):
        return {name: body}
    out: dict[str, Any] = {}
    for key in ("$defs", "definitions"):
        if isinstance(defs := body.get(key), dict):
            del body[key]
            out.update({f"{name}_{d}": sub for d, sub in defs.items()})
    out[name] = body

    def rerooted(ref: str) -> str:
        for key in ("$defs", "definitions"):
            if ref.startswith(f"#/{key}/"):
                return f"#/$defs/{name}_" + ref.removeprefix(f"#/{key}/")
        return f"#/$defs/{name}" + ref.removeprefix("#")

    for definition in out.values():
        for node, _ in _subschemas(definition, ""):
            ref = node.get("$ref")
            if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
                node["$ref"] = rerooted(ref)
    return out


# ---------------------------------------------------------------- integer and number ranges


_ANNOTATIONS = {"title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly",
                "format"}


def _bound_value(b: Any, *, integer: bool) -> Decimal | None:
    """A bound as the exact decimal the client wrote (0.1 is 0.1, not its binary float), or None where the
    grammar cannot keep it: not a number, not finite, past ±INTEGER_LIMIT or, for a number, with more
    decimals than a fraction may have here (an integer's bound is rounded inwards, so any will do)."""
    if not isinstance(b, (int, float)) or isinstance(b, bool) or not math.isfinite(b) or abs(b) > INTEGER_LIMIT:
        return None
    value = Decimal(str(b))
    exponent = value.normalize().as_tuple().exponent
    decimals = -exponent if isinstance(exponent, int) and exponent < 0 else 0
    return value if integer or decimals <= FRACTION_DIGITS else None


def _bounded(node: dict[str, Any]) -> bool:
    """An integer or a number with bounds the grammar can keep and nothing else that narrows it (an enum, a
    combinator): the ones `bounded_ranges` keeps, replacing the node."""
    bounds = [node[k] for k in BOUNDS if k in node]
    plain = set(node) <= {"type", *BOUNDS, *_ANNOTATIONS}
    kind = node.get("type")
    keepable = plain and kind in ("integer", "number") and bool(bounds) and all(
        _bound_value(b, integer=kind == "integer") is not None for b in bounds)
    return keepable and (kind == "integer" or _writable(*number_bounds(node)))


def _writable(lo: Bound | None, hi: Bound | None) -> bool:
    """Some number between the bounds has at most FRACTION_DIGITS decimals, or none at all does (a 400):
    bounds with room only for longer fractions (0.1234567890123456 < x < ...457) cannot be kept."""
    if lo is None or hi is None or number_gbnf(lo, hi) is not None:
        return True
    return lo.value > hi.value or (lo.value == hi.value and (lo.strict or hi.strict))


def integer_bounds(node: dict[str, Any]) -> tuple[int | None, int | None]:
    """The smallest and largest integer the node allows (None: no bound on that side)."""
    los = [math.ceil(node["minimum"])] if "minimum" in node else []
    los += [math.floor(node["exclusiveMinimum"]) + 1] if "exclusiveMinimum" in node else []
    his = [math.floor(node["maximum"])] if "maximum" in node else []
    his += [math.ceil(node["exclusiveMaximum"]) - 1] if "exclusiveMaximum" in node else []
    return max(los, default=None), min(his, default=None)


@dataclass(frozen=True)
class Bound:
    """One end of a number's range: its value, and whether the value itself is excluded."""

    value: Decimal
    strict: bool = False


def number_bounds(node: dict[str, Any]) -> tuple[Bound | None, Bound | None]:
    """The tightest lower and upper bound of a number node (None: no bound on that side); of a minimum and
    an exclusiveMinimum at the same value, the exclusive one."""
    def tightest(inclusive: str, exclusive: str, pick: Any) -> Bound | None:
        bounds = ([Bound(Decimal(str(node[inclusive])))] if inclusive in node else []) + (
            [Bound(Decimal(str(node[exclusive])), strict=True)] if exclusive in node else [])
        return pick(bounds, key=lambda b: (b.value, b.strict if pick is max else not b.strict), default=None)

    return tightest("minimum", "exclusiveMinimum", max), tightest("maximum", "exclusiveMaximum", min)


@dataclass(frozen=True)
class Digits:
    """One alternative of an integer range, written without a sign: a digit class (lowest, highest) per
    position, then any number of further digits when `more`."""

    classes: tuple[tuple[int, int], ...]
    more: bool = False


def _same_length(a: str, b: str) -> list[tuple[tuple[int, int], ...]]:
    """The numbers from a to b, both of the same length (a <= b), as digit-class sequences: the first
    digit's run split where the rest is not the full 0..9 range."""
    if not a:
        return [()]
    first, last, rest = int(a[0]), int(b[0]), len(a) - 1
    if first == last:
        return [((first, first), *tail) for tail in _same_length(a[1:], b[1:])]
    out: list[tuple[tuple[int, int], ...]] = []
    from_zero, to_nine = a[1:] == "0" * rest, b[1:] == "9" * rest
    if not from_zero:
        out += [((first, first), *tail) for tail in _same_length(a[1:], "9" * rest)]
    middle = (first if from_zero else first + 1, last if to_nine else last - 1)
    if middle[0] <= middle[1]:
        out.append((middle, *[(0, 9)] * rest))
    if not to_nine:
        out += [((last, last), *tail) for tail in _same_length("0" * rest, b[1:])]
    return out


def naturals(lo: int, hi: int | None) -> list[Digits]:
    """The integers lo..hi (0 <= lo; hi None: no end), written without leading zeros."""
    widest = len(str(lo)) if hi is None else len(str(hi))
    out = []
    for length in range(len(str(lo)), widest + 1):
        top = 10**length - 1  # the largest number of this many digits
        a, b = max(lo, 10 ** (length - 1) if length > 1 else 0), top if hi is None else min(hi, top)
        if a <= b:
            out += [Digits(c) for c in _same_length(str(a), str(b))]
    if hi is None:  # any number with more digits than lo
        out.append(Digits(((1, 9), *[(0, 9)] * widest), more=True))
    return out


def integer_alternatives(lo: int | None, hi: int | None) -> tuple[list[Digits], list[Digits]]:
    """lo..hi as (the negative numbers' digits after the sign, the others' digits)."""
    negative = []
    if lo is None or lo < 0:
        negative = naturals(1 if hi is None or hi >= 0 else -hi, None if lo is None else -lo)
    rest = [] if hi is not None and hi < 0 else naturals(max(lo or 0, 0), hi)
    return negative, rest


def _gbnf(alternatives: list[Digits]) -> str:
    def one(d: Digits) -> str:
        classes = [f"[{a}]" if a == b else f"[{a}-{b}]" for a, b in d.classes]
        return " ".join(classes + (["[0-9]*"] if d.more else []))

    return " | ".join(one(d) for d in alternatives)


def integer_gbnf(lo: int | None, hi: int | None) -> str:
    """A GBNF expression for the JSON integers lo..hi (lo <= hi)."""
    negative, rest = integer_alternatives(lo, hi)
    parts = ([f'"-" ({_gbnf(negative)})'] if negative else []) + ([f"({_gbnf(rest)})"] if rest else [])
    return "(" + " | ".join(parts) + ")"


# ---------------------------------------------------------------- number ranges
#
# A number between bounds, written as JSON writes it without an exponent: an integer part I (no leading
# zeros) and, after a point, a fraction F of 1..FRACTION_DIGITS digits. Its range on the magnitudes splits
# by integer part: lo = A.α, hi = B.β give I = A with 0.F >= 0.α, I in A+1..B-1 with any F, and I = B with
# 0.F <= 0.β (I = A = B: both). The fractions are digit strings compared digit by digit (`_fraction`).


@dataclass(frozen=True)
class _Side:
    """One bound on a fraction 0.F: its digits after the point (trailing zeros dropped) and whether the
    value itself is excluded."""

    digits: str
    strict: bool


_FAILS = "fails"


def _after(digit: int, lo: _Side | None, hi: _Side | None) -> tuple[_Side | None, _Side | None] | str:
    """The bounds on the rest of a fraction once its next digit is `digit`: a side is met for good (None)
    when the digit passes the bound's own, carried on when it equals it, and fails when it falls short."""
    def rest(side: _Side | None, *, lower: bool) -> _Side | None | str:
        if side is None:
            return None
        own = int(side.digits[0]) if side.digits else 0
        if digit == own:
            return _Side(side.digits[1:], side.strict)
        return None if (digit > own) == lower else _FAILS

    lo_rest, hi_rest = rest(lo, lower=True), rest(hi, lower=False)
    if isinstance(lo_rest, str) or isinstance(hi_rest, str):
        return _FAILS
    return lo_rest, hi_rest


def _fraction(lo: _Side | None, hi: _Side | None, room: int) -> tuple[bool, str | None]:
    """The digit strings F of at most `room` digits with lo <= 0.F <= hi (strictly, where a side says so):
    whether the empty one (no point: 0) is among them, and a GBNF expression for the others (None: none)."""
    if lo is not None and lo.digits == "" and not lo.strict:
        lo = None  # 0.F >= 0 holds for every F
    empty = lo is None and not (hi is not None and hi.digits == "" and hi.strict)
    if room == 0:
        return empty, None
    if lo is None and hi is None:
        return empty, f"[0-9]{{1,{room}}}"
    if lo is None and hi == _Side("", strict=False):  # 0.F <= 0: zeros only (a digit at a time, 16 groups deep)
        return empty, f'"0"{{1,{room}}}'
    digits_by_rest: dict[tuple[_Side | None, _Side | None], list[int]] = {}
    for digit in range(10):  # each outcome's digits are a run: the bounds' own digits split 0..9 in order
        if not isinstance(rest := _after(digit, lo, hi), str):
            digits_by_rest.setdefault(rest, []).append(digit)
    alternatives = []
    for (lo_rest, hi_rest), digits in digits_by_rest.items():
        tail_empty, tail = _fraction(lo_rest, hi_rest, room - 1)
        first = f"[{digits[0]}]" if len(digits) == 1 else f"[{digits[0]}-{digits[-1]}]"
        if tail is None:
            alternatives += [first] if tail_empty else []
        else:
            alternatives.append(f"{first} ({tail})" + ("?" if tail_empty else ""))
    return empty, " | ".join(alternatives) or None


def _parts(value: Decimal) -> tuple[int, str]:
    """A non-negative decimal's integer part and its digits after the point, trailing zeros dropped."""
    whole, _, fraction = f"{value:f}".partition(".")
    return int(whole), fraction.rstrip("0")


def _magnitudes(lo: Bound, hi: Bound | None) -> list[str]:
    """GBNF alternatives for the non-negative numbers from lo to hi (None: no end), unsigned."""
    low, low_fraction = _parts(lo.value)
    pieces: list[tuple[list[Digits], _Side | None, _Side | None]] = [
        (naturals(low, low), _Side(low_fraction, lo.strict), None)]
    if hi is None:
        pieces.append((naturals(low + 1, None), None, None))
    else:
        high, high_fraction = _parts(hi.value)
        if high == low:
            pieces = [(naturals(low, low), _Side(low_fraction, lo.strict), _Side(high_fraction, hi.strict))]
        else:
            pieces += [(naturals(low + 1, high - 1), None, None)] if low + 1 <= high - 1 else []
            pieces.append((naturals(high, high), None, _Side(high_fraction, hi.strict)))
    out = []
    for whole, lo_side, hi_side in pieces:
        empty, fraction = _fraction(lo_side, hi_side, FRACTION_DIGITS)
        point = "" if fraction is None else f' "." ({fraction})'
        if fraction is not None and empty:
            point = f' ("." ({fraction}))?'
        if fraction is not None or empty:
            out.append(f"({_gbnf(whole)}){point}")
    return out


def number_gbnf(lo: Bound | None, hi: Bound | None) -> str | None:
    """A GBNF expression for the JSON numbers from lo to hi, written without an exponent; None when no
    number is between them. Negative numbers are their magnitudes after a sign (never "-0")."""
    zero = Decimal(0)
    positive: list[str] = []
    if hi is None or hi.value > zero or (hi.value == zero and not hi.strict):
        floor = lo if lo is not None and lo.value >= zero else Bound(zero)
        if hi is None or floor.value < hi.value or (floor.value == hi.value and not (floor.strict or hi.strict)):
            positive = _magnitudes(floor, hi)
    negative: list[str] = []
    if lo is None or lo.value < zero:
        nearest = Bound(-hi.value, hi.strict) if hi is not None and hi.value < zero else Bound(zero, strict=True)
        farthest = None if lo is None else Bound(-lo.value, lo.strict)
        if farthest is None or nearest.value < farthest.value or (
                nearest.value == farthest.value and not (nearest.strict or farthest.strict)):
            negative = _magnitudes(nearest, farthest)
    parts = ([f'"-" ({" | ".join(negative)})'] if negative else []) + positive
    return "(" + " | ".join(parts) + ")" if parts else None


def _range_rule(node: dict[str, Any], where: str) -> str:
    """The GBNF for a bounded integer or number node; SchemaInvalid where no value is within its bounds."""
    if node.get("type") == "integer":
        lo, hi = integer_bounds(node)
        if lo is not None and hi is not None and lo > hi:
            raise SchemaInvalid(f"{where}: no integer is from {lo} to {hi}, so no reply could be valid.",
                                "Give bounds with at least one integer between them.")
        return integer_gbnf(lo, hi)
    low, high = number_bounds(node)
    if (rule := number_gbnf(low, high)) is None:
        said = ", ".join(f"{k} {node[k]}" for k in BOUNDS if k in node)
        raise SchemaInvalid(f"{where}: no number meets {said}, so no reply could be valid.",
                            "Give bounds with room for a number between them.")
    return rule


def bounded_ranges(schema: Any, field: str) -> tuple[Any, dict[str, str]]:
    """`schema` with each bounded integer and number replaced by a marker constant, and the GBNF each
    marker's literal stands for: the converter writes numbers without their bounds, so their rule is ours.
    SchemaInvalid where no value is within a node's bounds."""
    out = copy.deepcopy(schema)
    rules: dict[str, str] = {}
    for node, where in _subschemas(out, field):
        if not _bounded(node):
            continue
        marker = f"localspec-range-{uuid.uuid4().hex}"
        rules[marker] = _range_rule(node, where)
        node.clear()
        node["const"] = marker
    return out, rules


def with_range_rules(gbnf: str, rules: dict[str, str]) -> str | None:
    """The converter's grammar with each marker constant's literal replaced by its range rule; None if
    a marker is left (a converter that writes constants otherwise), where the model would be made to
    write the marker itself."""
    for marker, rule in rules.items():
        gbnf = gbnf.replace(f'"\\"{marker}\\""', f"{rule} space")
    return None if any(marker in gbnf for marker in rules) else gbnf
