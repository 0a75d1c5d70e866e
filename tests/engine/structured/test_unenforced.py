"""Schema keywords xgrammar compiles and then ignores are refused by check(), naming the keyword
and where it is; what it enforces, and annotations, still pass. The grammar xgrammar builds for
each refused schema is shown to accept a value that breaks it: the output it would have allowed."""

import json

import pytest
import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string

from engine import InvalidRequestError, StructuredSpec
from engine.structured import check

INTS = {"type": "array", "items": {"type": "integer"}}
OBJ_A = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}

# (schema, where the refusal points, a value that breaks the schema and xgrammar's grammar accepts)
IGNORED = [
    ({**INTS, "uniqueItems": True}, "#: uniqueItems", "[1, 1]"),
    ({"type": "integer", "not": {"const": 1}}, "#: not", "1"),
    ({**OBJ_A, "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}}, "#: if", '{"a": 1}'),
    ({**OBJ_A, "dependentRequired": {"a": ["b"]}}, "#: dependentRequired", '{"a": 1}'),
    ({**OBJ_A, "dependentSchemas": {"a": {"required": ["b"]}}}, "#: dependentSchemas", '{"a": 1}'),
    ({**INTS, "contains": {"const": 3}, "maxContains": 1}, "#: maxContains", "[3, 3]"),
    ({"type": "number", "multipleOf": 0.5}, "#: multipleOf", "0.3"),
    ({"multipleOf": 3}, "#: multipleOf", "4"),
    ({"allOf": [{"type": "integer", "minimum": 5}, {"type": "integer", "maximum": 10}]}, "#: allOf", "11"),
    (
        {"type": "object", "properties": {"tags": {**INTS, "uniqueItems": True}}, "required": ["tags"]},
        "#/properties/tags: uniqueItems",
        '{"tags": [2, 2]}',
    ),
    (
        {"$defs": {"odd": {"type": "integer", "not": {"multipleOf": 2}}}, "$ref": "#/$defs/odd"},
        "#/$defs/odd: not",
        "2",
    ),
    ({"anyOf": [{"type": "string"}, {**INTS, "uniqueItems": True}]}, "#/anyOf/1: uniqueItems", "[0, 0]"),
]

ENFORCED = [
    {"type": "string", "format": "email"},
    {"type": "string", "format": "not-a-known-format"},  # an annotation
    {"type": "integer", "multipleOf": 3},
    {"type": ["integer", "null"], "multipleOf": 3},
    {**INTS, "uniqueItems": False, "minItems": 1, "maxItems": 3},
    {"allOf": [{"type": "integer", "minimum": 5}]},
    {"type": "object", "properties": {"not": {"type": "string"}, "if": {"enum": ["not"]}}},  # names
    {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    {"type": "string", "pattern": "^[a-z]+$", "minLength": 2},
]


@pytest.mark.parametrize("schema, where, breaking", IGNORED)
def test_a_keyword_xgrammar_ignores_is_refused(schema, where, breaking):
    grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=True)
    assert _is_grammar_accept_string(grammar, breaking)  # what the output could have been
    with pytest.raises(InvalidRequestError) as err:
        check(StructuredSpec.json_schema(schema))
    assert where in err.value.message and err.value.param == "response_format"


@pytest.mark.parametrize("schema", ENFORCED)
def test_what_xgrammar_enforces_passes(schema):
    check(StructuredSpec.json_schema(schema))
