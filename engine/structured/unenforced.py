"""JSON Schema keywords that xgrammar 0.2 accepts and then does not enforce. Plain Python.

xgrammar compiles a schema that uses them without a word (or with a warning on stderr) and the
grammar simply ignores them, so an output that ends with ``stop`` may not validate: ``not``,
``if``/``then``/``else``, ``dependentRequired``/``dependentSchemas``/``dependencies``,
``uniqueItems: true``, ``minContains``/``maxContains``, ``allOf`` with more than one member (only
one is kept), ``$dynamicRef``/``$recursiveRef``, and ``multipleOf`` anywhere but on an integer
with an integer divisor. A schema using one is refused, naming it and where it is, rather than
answered with output that breaks it (OpenAI refuses keywords its strict mode does not support).
Annotations (``format`` values it does not know, ``contentEncoding``) are not assertions and pass.
"""

from __future__ import annotations

from typing import Any

UNENFORCED = (
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "minContains",
    "maxContains",
    "$dynamicRef",
    "$recursiveRef",
)
# keywords whose value is one subschema, a name -> subschema map, or a list of subschemas
ONE = (
    "items",
    "additionalItems",
    "contains",
    "additionalProperties",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
)
MAP = ("properties", "patternProperties", "$defs", "definitions")
LIST = ("anyOf", "oneOf", "allOf", "prefixItems", "items")


def unenforced_keyword(schema: Any, path: str = "#") -> str | None:
    """Where `schema` first uses a keyword xgrammar would ignore ("#/properties/tags: uniqueItems"),
    or None. Only schema positions are read: a property named "not" is a name, not a keyword."""
    if not isinstance(schema, dict):
        return None
    for keyword in UNENFORCED:
        if keyword in schema:
            return f"{path}: {keyword}"
    if schema.get("uniqueItems") is True:
        return f"{path}: uniqueItems"
    if "multipleOf" in schema and not _integer_multiple(schema):
        return f"{path}: multipleOf (enforced only on an integer type, by an integer)"
    if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1:
        return f"{path}: allOf with more than one schema"
    for keyword in ONE:
        found = unenforced_keyword(schema.get(keyword), f"{path}/{keyword}")
        if found:
            return found
    for keyword in MAP:
        members = schema.get(keyword)
        if isinstance(members, dict):
            for name, sub in members.items():
                found = unenforced_keyword(sub, f"{path}/{keyword}/{name}")
                if found:
                    return found
    for keyword in LIST:
        members = schema.get(keyword)
        if isinstance(members, list):
            for i, sub in enumerate(members):
                found = unenforced_keyword(sub, f"{path}/{keyword}/{i}")
                if found:
                    return found
    return None


def _integer_multiple(schema: dict[str, Any]) -> bool:
    kind, divisor = schema.get("type"), schema.get("multipleOf")
    integer = kind == "integer" or (isinstance(kind, list) and "integer" in kind and "number" not in kind)
    return integer and isinstance(divisor, int) and not isinstance(divisor, bool)
