"""A client's JSON schema, made ready for llama-cpp-python's schema-to-grammar converter.

The converter enforces type, properties, required, additionalProperties, items, prefixItems,
minItems/maxItems, enum, const, anyOf/oneOf/allOf, $ref, pattern, minLength/maxLength and string
formats. Two things it gets wrong are fixed here, and one is refused:

* a root that is itself a `$ref` (pydantic's schema for a recursive model) resolves that one ref and
  never reads the `$defs` beside it: a KeyError on the first nested ref. The root is inlined.
* a schema nested under another (a tool's parameters under the forced call's `arguments`) keeps
  refs like `#/$defs/Addr` that point at the new root. Its definitions move there (`hoisted`).
* keywords that restrict values and that it drops without a word (`minimum`, `uniqueItems`, ...):
  the reply said "grammar: enforced" while `{"n": 5}` broke `"minimum": 100`. They are refused,
  naming the keyword, rather than promised and not kept.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from localspec.errors import RequestError

# Keywords that narrow what is valid and that the converter ignores. Annotations (title, description,
# default, examples, $comment, deprecated, unknown formats) change nothing and pass.
UNENFORCED = (
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "uniqueItems",
    "minProperties", "maxProperties", "not", "if", "then", "else", "contains", "minContains", "maxContains",
    "dependentRequired", "dependentSchemas", "dependencies", "patternProperties", "propertyNames",
    "unevaluatedProperties", "unevaluatedItems",
)
_SCHEMA_MAPS = ("properties", "$defs", "definitions")  # name -> subschema: the names are data, not keywords


class SchemaNotEnforceable(RequestError):
    """A schema keyword the grammar would not keep; `field` is where, in the schema's own terms."""

    def __init__(self, field: str, keyword: str) -> None:
        super().__init__(
            f"{field}.{keyword}: this server's grammar cannot enforce '{keyword}', so the reply could break it.",
            f"Remove '{keyword}' from the schema and check the value after the reply (enforced: type, "
            "properties, required, enum, const, pattern, lengths, item counts, anyOf/oneOf/allOf, $ref).",
        )
        self.field = field
        self.keyword = keyword


def _subschemas(node: Any, where: str) -> Iterator[tuple[dict[str, Any], str]]:
    """Every schema object under `node` (itself included), with its path; iterative."""
    todo: list[tuple[Any, str]] = [(node, where)]
    while todo:
        value, path = todo.pop()
        if isinstance(value, list):
            todo.extend((v, f"{path}[{i}]") for i, v in enumerate(value))
            continue
        if not isinstance(value, dict):
            continue
        yield value, path
        for key, sub in value.items():
            if key in _SCHEMA_MAPS and isinstance(sub, dict):
                todo.extend((s, f"{path}.{key}.{name}") for name, s in sub.items())
            elif key not in ("enum", "const", "default", "examples"):  # values, not schemas
                todo.append((sub, f"{path}.{key}"))


class SchemaRefBroken(RequestError):
    """A local `$ref` that points at nothing, or only at refs in a loop."""


def check_enforceable(schema: Any, field: str) -> None:
    """Raise SchemaNotEnforceable for the first keyword the grammar would silently drop, and
    SchemaRefBroken for a local ref that leads nowhere (the converter wrote a rule that names an
    undefined one, which only the engine's grammar parser refused)."""
    for node, where in _subschemas(schema, field):
        for keyword in UNENFORCED:
            if keyword in node:
                raise SchemaNotEnforceable(where, keyword)
        ref, seen = node.get("$ref"), set()
        while isinstance(ref, str) and ref.startswith("#"):
            if ref in seen:
                raise SchemaRefBroken(f"{where}.$ref: '{ref}' leads only to refs in a loop.",
                                      "Point the $ref at a schema that says what the value is.")
            seen.add(ref)
            target = _pointer(schema, ref)
            if not isinstance(target, (dict, bool)):
                raise SchemaRefBroken(f"{where}.$ref: '{ref}' points at nothing in the schema.",
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

    for node, _ in _subschemas(list(out.values()), ""):
        ref = node.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            node["$ref"] = rerooted(ref)
    return out
