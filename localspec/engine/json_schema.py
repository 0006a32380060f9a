"""A client's JSON schema, made ready for llama-cpp-python's schema-to-grammar converter.

The converter enforces type, properties, required, additionalProperties, items, prefixItems,
minItems/maxItems, enum, const, anyOf/oneOf/allOf, $ref, pattern, minLength/maxLength and string
formats. Two things it gets wrong are fixed here, and one is refused:

* a root that is itself a `$ref` (pydantic's schema for a recursive model) resolves that one ref and
  never reads the `$defs` beside it: a KeyError on the first nested ref. The root is inlined.
* a schema nested under another (a tool's parameters under the forced call's `arguments`) keeps
  refs like `#/$defs/Addr` that point at the new root. Its definitions move there (`hoisted`).
* keywords that restrict values and that it drops without a word (`minimum`, `uniqueItems`, ...):
  the reply said "grammar: enforced" while `{"n": 5}` broke `"minimum": 100`. An integer's bounds
  become a rule of our own (`integer_ranges`); the rest are named (`unenforced`), and the reply says
  "grammar: partial" with their paths rather than promise them.
"""

from __future__ import annotations

import copy
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from localspec.engine.grammar_limits import subschemas
from localspec.errors import RequestError

# Keywords that narrow what is valid and that the converter ignores. Annotations (title, description,
# default, examples, $comment, deprecated, unknown formats) change nothing and pass. An integer's bounds
# are kept by a grammar of our own (`integer_ranges`); a number's are not.
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
INTEGER_LIMIT = 10**18  # bounds past this are not enforced: each digit of a bound is a group in the grammar
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
    integer whose bounds leave no value."""


def unenforced(schema: Any, field: str, *, integer_bounds: bool = True) -> list[str]:
    """Where the schema holds a keyword the grammar will not keep (an integer's bounds are kept, unless
    `integer_bounds` is False), as paths: `properties.confidence.minimum`. A pydantic model writes them
    everywhere (`Field(ge=0)` on a float, `set[str]`): the request is served, and the reply says which."""
    return [f"{where}.{keyword}" for node, where in _subschemas(schema, field) for keyword in UNENFORCED
            if keyword in node and not (integer_bounds and keyword in BOUNDS and _bounded_integer(node))]


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


# ---------------------------------------------------------------- integer ranges


_ANNOTATIONS = {"title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly",
                "format"}


def _bounded_integer(node: dict[str, Any]) -> bool:
    """An integer with numeric bounds within ±INTEGER_LIMIT and nothing else that narrows it (an enum, a
    combinator): the ones `integer_ranges` keeps, replacing the node."""
    bounds = [node[k] for k in BOUNDS if k in node]
    plain = set(node) <= {"type", *BOUNDS, *_ANNOTATIONS}
    return plain and node.get("type") == "integer" and bool(bounds) and all(
        isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b) and abs(b) <= INTEGER_LIMIT
        for b in bounds)


def integer_bounds(node: dict[str, Any]) -> tuple[int | None, int | None]:
    """The smallest and largest integer the node allows (None: no bound on that side)."""
    los = [math.ceil(node["minimum"])] if "minimum" in node else []
    los += [math.floor(node["exclusiveMinimum"]) + 1] if "exclusiveMinimum" in node else []
    his = [math.floor(node["maximum"])] if "maximum" in node else []
    his += [math.ceil(node["exclusiveMaximum"]) - 1] if "exclusiveMaximum" in node else []
    return max(los, default=None), min(his, default=None)


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


def integer_ranges(schema: Any, field: str) -> tuple[Any, dict[str, str]]:
    """`schema` with each bounded integer replaced by a marker constant, and the GBNF each marker's
    literal stands for: the converter writes integers without their bounds, so their rule is ours.
    SchemaInvalid where no integer is within the bounds."""
    out = copy.deepcopy(schema)
    rules: dict[str, str] = {}
    for node, where in _subschemas(out, field):
        if not _bounded_integer(node):
            continue
        lo, hi = integer_bounds(node)
        if lo is not None and hi is not None and lo > hi:
            raise SchemaInvalid(f"{where}: no integer is from {lo} to {hi}, so no reply could be valid.",
                                "Give bounds with at least one integer between them.")
        marker = f"localspec-integer-{uuid.uuid4().hex}"
        rules[marker] = integer_gbnf(lo, hi)
        node.clear()
        node["const"] = marker
    return out, rules


def with_integer_rules(gbnf: str, rules: dict[str, str]) -> str | None:
    """The converter's grammar with each marker constant's literal replaced by its integer rule; None if
    a marker is left (a converter that writes constants otherwise), where the model would be made to
    write the marker itself."""
    for marker, rule in rules.items():
        gbnf = gbnf.replace(f'"\\"{marker}\\""', f"{rule} space")
    return None if any(marker in gbnf for marker in rules) else gbnf
