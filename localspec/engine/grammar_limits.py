"""How large a JSON schema or a grammar may be before anything compiles it.

llama.cpp's grammar parser recurses once per nested group, and a schema repetition becomes one
nested group per repeat: `{"type": "string", "maxLength": 20000}` turned into 20,000 nested groups
and a segfault on an 8 MiB thread stack. So every quantity that a schema turns into grammar size
or depth is bounded here, in one place (SECURITY.md lists these numbers), and checked twice:

* on the schema, before conversion, so the error names the field and the limit;
* on the GBNF text, before llama.cpp parses it, so no other source of grammar can get past;

and llama.cpp parses on a thread with a large stack (`grammar.py`), a margin on top of the bounds.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from localspec.errors import RequestError


@dataclass(frozen=True)
class GrammarLimits:
    max_depth: int = 128  # nested objects/arrays/combinators in a schema (each level is a rule, not a nested group)
    max_nodes: int = 4096  # subschemas in one schema, all levels together
    max_properties: int = 256  # properties of one object
    max_string_length: int = 1000  # maxLength / minLength: each repeat is one nested group
    max_items: int = 256  # maxItems / minItems
    max_enum: int = 1024  # enum values (and oneOf/anyOf branches) in one subschema
    max_pattern_length: int = 1000  # characters of one `pattern`
    max_pattern_repeat: int = 1000  # m and n of one `{m,n}` in a pattern
    max_pattern_expansion: int = 4096  # nested `{m,n}` counts multiplied together
    max_pattern_depth: int = 32  # nested groups in a pattern: each is a nested group in the grammar
    max_grammar_bytes: int = 512 << 10  # the GBNF text
    max_grammar_rules: int = 8192
    max_grammar_depth: int = 2000  # nested groups in the GBNF (max_string_length plus the JSON around it)
    # Alternatives one place in the GBNF opens at once, through the rules it names (each is a parse stack
    # llama.cpp keeps, dedups pairwise when it parses and walks for every token of the vocabulary at each
    # sampled token): 4 schema enums of max_enum side by side.
    max_grammar_fanout: int = 4096


LIMITS = GrammarLimits()


class GrammarTooLarge(RequestError):
    """A schema or grammar over one of the bounds; `field` is where, in the schema's own terms."""

    def __init__(self, field: str, what: str, value: int, limit: int) -> None:
        super().__init__(
            f"{field}: {what} is {value}, over this server's limit of {limit}.",
            f"Keep {what} at or below {limit} "
            "(the bounds that keep grammar compilation safe are listed in SECURITY.md).",
        )
        self.field = field
        self.limit = limit


class GrammarUnparsable(RequestError):
    """A GBNF text llama.cpp's parser refused (bad syntax, no `root` rule, a rule named and not defined,
    left recursion), or one it must never be given (`check_gbnf`). Its own type so a face can name the
    field a client's grammar came in."""


_COMBINATORS = ("anyOf", "oneOf", "allOf")
_NESTED_DICTS = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
                 "additionalItems", "unevaluatedItems", "unevaluatedProperties")
_NESTED_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # name -> schema
_REPEAT_RE = re.compile(r"\{(\d*)(?:,(\d*))?\}")
_GBNF_REPEAT_RE = re.compile(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}")


def subschemas(schema: dict[str, Any], field: str) -> Iterator[tuple[Any, str]]:
    """A schema's direct subschemas, each with its path: only where JSON Schema puts schemas, so an
    annotation or an extension (`x-meta`) holding a dict is not read as one."""
    for key in _NESTED_MAPS:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                yield sub, f"{field}.{key}.{name}"
    for key in _NESTED_DICTS:
        if isinstance(schema.get(key), dict):
            yield schema[key], f"{field}.{key}"
    for key in (*_COMBINATORS, "prefixItems", "items"):  # "items" as a list: the older tuple form
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                yield sub, f"{field}.{key}[{i}]"


def _count(schema: dict[str, Any], key: str) -> int | None:
    value = schema.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(min(value, 1 << 62))


def check_pattern(pattern: str, field: str, limits: GrammarLimits = LIMITS) -> None:
    """Bound a regex's length, group nesting, each `{m,n}` and nested repeats multiplied together."""
    if len(pattern) > limits.max_pattern_length:
        raise GrammarTooLarge(field, "the pattern's length", len(pattern), limits.max_pattern_length)
    depth = max_depth = 0
    widest = [1]  # per open group: the largest expansion of anything inside it so far
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "[":  # a character class: nothing inside it nests or repeats
            j = pattern.find("]", i + 2)
            i = len(pattern) if j < 0 else j + 1
            continue
        expansion = None
        if ch == "(":
            depth += 1
            max_depth = max(max_depth, depth)
            widest.append(1)
        elif ch == ")" and len(widest) > 1:
            depth -= 1
            inner = widest.pop()
            m = _REPEAT_RE.match(pattern, i + 1)
            expansion = inner * _repeat(m, field, limits) if m else inner  # a repeated group multiplies its inside
        elif ch == "{" and (m := _REPEAT_RE.match(pattern, i)):
            expansion = _repeat(m, field, limits)
        if expansion is not None:
            if expansion > limits.max_pattern_expansion:
                raise GrammarTooLarge(field, "the pattern's nested repetition", expansion, limits.max_pattern_expansion)
            widest[-1] = max(widest[-1], expansion)
        i += 1
    if max_depth > limits.max_pattern_depth:
        raise GrammarTooLarge(field, "the pattern's group nesting", max_depth, limits.max_pattern_depth)


def _repeat(m: re.Match[str], field: str, limits: GrammarLimits) -> int:
    counts = [int(g) for g in m.groups() if g]
    n = max(counts, default=0)
    if n > limits.max_pattern_repeat:
        raise GrammarTooLarge(field, "a {m,n} repetition count in the pattern", n, limits.max_pattern_repeat)
    return max(n, 1)


def check_schema(schema: Any, field: str, limits: GrammarLimits = LIMITS) -> None:
    """Raise GrammarTooLarge for the first bound the schema exceeds (iteratively: no recursion)."""
    nodes = 0
    todo: list[tuple[Any, str, int]] = [(schema, field, 1)]
    while todo:
        node, where, depth = todo.pop()
        if not isinstance(node, dict):
            continue
        nodes += 1
        if nodes > limits.max_nodes:
            raise GrammarTooLarge(field, "the number of subschemas", nodes, limits.max_nodes)
        if depth > limits.max_depth:
            raise GrammarTooLarge(where, "the schema's nesting depth", depth, limits.max_depth)
        for key, bound, what in (("maxLength", limits.max_string_length, "maxLength"),
                                 ("minLength", limits.max_string_length, "minLength"),
                                 ("maxItems", limits.max_items, "maxItems"),
                                 ("minItems", limits.max_items, "minItems")):
            n = _count(node, key)
            if n is not None and n > bound:
                raise GrammarTooLarge(f"{where}.{key}", what, n, bound)
        props = node.get("properties")
        if isinstance(props, dict) and len(props) > limits.max_properties:
            raise GrammarTooLarge(f"{where}.properties", "the number of properties", len(props), limits.max_properties)
        for key in ("enum", *_COMBINATORS, "prefixItems"):
            values = node.get(key)
            if isinstance(values, list) and len(values) > limits.max_enum:
                raise GrammarTooLarge(f"{where}.{key}", f"the number of {key} entries", len(values), limits.max_enum)
        if isinstance(node.get("pattern"), str):
            check_pattern(node["pattern"], f"{where}.pattern", limits)
        todo.extend((sub, sub_where, depth + 1) for sub, sub_where in subschemas(node, where))


def check_gbnf(gbnf: str, limits: GrammarLimits = LIMITS) -> None:
    """Bound a GBNF text's size, rule count and group nesting before llama.cpp parses it."""
    if len(gbnf) > limits.max_grammar_bytes:
        raise GrammarTooLarge("grammar", "the grammar's size in bytes", len(gbnf), limits.max_grammar_bytes)
    rules = gbnf.count("::=")
    if rules > limits.max_grammar_rules:
        raise GrammarTooLarge("grammar", "the number of grammar rules", rules, limits.max_grammar_rules)
    depth = max_depth = 0
    i, n = 0, len(gbnf)
    while i < n:
        ch = gbnf[i]
        if ch in "\"[":  # a literal or a character class: skip it, escapes included
            close = '"' if ch == '"' else "]"
            i += 1
            while i < n and gbnf[i] != close:
                i += 2 if gbnf[i] == "\\" else 1
        elif ch == "#":  # a comment runs to the end of the line
            while i < n and gbnf[i] not in "\r\n":
                i += 1
        elif ch == "(":
            depth += 1
            max_depth = max(max_depth, depth)
        elif ch == ")":
            depth -= 1
        elif ch == "{" and (m := _GBNF_REPEAT_RE.match(gbnf, i)) and int(m[1]) > int(m[2]):
            # llama.cpp's parser takes `x{5,2}` for a repeat count near 2**64 and allocates until the
            # process is killed (out of memory): refused here, before it ever sees one.
            raise GrammarUnparsable(
                f"the repetition {m[0]} at character {i} has a minimum ({m[1]}) above its maximum ({m[2]}).",
                f"Write {{min,max}} with min <= max (here {{{m[2]},{m[1]}}}, or {{{m[1]}}} for exactly {m[1]}).")
        i += 1
    if max_depth > limits.max_grammar_depth:
        raise GrammarTooLarge("grammar", "the grammar's group nesting", max_depth, limits.max_grammar_depth)
    if "|" in gbnf:  # a grammar without alternatives opens one stack at a time
        try:
            fanout, where = _widest_fanout(gbnf)
        except RecursionError:  # groups or rules nested past Python's recursion limit: not estimated
            return
        if fanout > limits.max_grammar_fanout:
            raise GrammarTooLarge("grammar", f"the alternatives open at once in rule '{where}' (through the rules it "
                                  "names)", fanout, limits.max_grammar_fanout)


_GBNF_TOKEN_RE = re.compile(r"""
    (?P<lit>"(?:\\.|[^"\\])*") | (?P<cls>\[(?:\\.|[^\]\\])*\]) | (?P<tok>!?<[^>\n]*>)
  | (?P<comment>\#[^\r\n]*) | (?P<define>::=) | (?P<name>[A-Za-z0-9_-]+) | (?P<quant>[*+?]|\{[^}]*\})
  | (?P<punct>[|()]) | (?P<space>\s+) | (?P<other>.)""", re.VERBOSE | re.DOTALL)


def _widest_fanout(gbnf: str) -> tuple[int, str]:
    """How many parse stacks one place in the grammar can open at once, and the rule where the most do: per
    rule, its alternatives' first elements counted through the rules they name (a nullable first element, x?
    x* x{0,n}, lets the next one count too). A rule named while its own count is being taken counts 1. An
    estimate for bounding, not llama.cpp's exact count: `a ::= b "1" | b "2" ...` over `b ::= c "1" | ...`
    over `c ::= "x1" | ...`, 40 of each in 1 KB, is 64,000 stacks: 7 s to parse, 25 min at 100 of each."""
    rules: dict[str, list[tuple[str, str]]] = {}
    tokens = [(m.lastgroup or "other", m.group()) for m in _GBNF_TOKEN_RE.finditer(gbnf)]
    tokens = [t for t in tokens if t[0] not in ("space", "comment")]
    current: list[tuple[str, str]] | None = None
    for i, tok in enumerate(tokens):
        if tok[0] == "name" and i + 1 < len(tokens) and tokens[i + 1][0] == "define":
            current = rules.setdefault(tok[1], [])
        elif tok[0] != "define" and current is not None:
            current.append(tok)
    memo: dict[str, tuple[int, bool]] = {}
    busy: set[str] = set()

    def alternatives(toks: list[tuple[str, str]], i: int) -> tuple[int, bool, int]:
        """(fan-out, nullable, index after) of the alternatives from toks[i] to a ')' or the end."""
        total, nullable, first, seq_null = 0, False, True, True
        while i < len(toks) and toks[i] != ("punct", ")"):
            kind, text = toks[i]
            if kind == "punct" and text == "|":
                nullable |= seq_null
                first, seq_null = True, True
                i += 1
                continue
            if kind == "punct" and text == "(":
                fan, null, i = alternatives(toks, i + 1)
                i += 1  # the ')'
            else:
                fan, null = (rule(text) if kind == "name" else (1, kind == "lit" and text == '""'))
                i += 1
            if i < len(toks) and toks[i][0] == "quant":
                q = toks[i][1]
                null |= q in ("*", "?") or q.replace(" ", "").startswith(("{0,", "{0}", "{,"))
                i += 1
            if first:
                total = min(total + fan, 1 << 40)
            first = first and null
            seq_null = seq_null and null
        return total, nullable or seq_null, i

    def rule(name: str) -> tuple[int, bool]:
        if name in memo:
            return memo[name]
        if name in busy or name not in rules:  # recursion, or a rule llama.cpp will name as undefined
            return 1, False
        busy.add(name)
        fan, null, _ = alternatives(rules[name], 0)
        busy.discard(name)
        memo[name] = (max(fan, 1), null)
        return memo[name]

    widest = max(((rule(name)[0], name) for name in rules), default=(0, ""))
    return widest

