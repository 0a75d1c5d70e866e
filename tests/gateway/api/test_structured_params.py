"""response_format and vLLM's guided_* fields → the engine's StructuredSpec, checked in the gateway
(torch-free) before anything is admitted."""

from __future__ import annotations

import json

import pytest

from engine import StructuredSpec
from gateway.api.errors import InvalidRequest
from gateway.api.schemas.openai import ChatCompletionRequest, CompletionRequest

SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
MESSAGES = [{"role": "user", "content": "hi"}]


def _spec(**fields):
    return ChatCompletionRequest(model="m", messages=MESSAGES, **fields).sampling_options()["structured"]


def test_the_ways_to_ask():
    assert _spec() is None and _spec(response_format={"type": "text"}) is None
    assert _spec(response_format={"type": "json_object"}) == StructuredSpec("json_object")
    by_format = _spec(
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "p", "schema": SCHEMA, "strict": True},
        }
    )
    assert by_format == StructuredSpec("json_schema", json.dumps(SCHEMA))
    assert _spec(guided_json=SCHEMA) == by_format == _spec(guided_json=json.dumps(SCHEMA))
    assert _spec(guided_regex="[0-9]+") == StructuredSpec("regex", "[0-9]+")
    assert _spec(guided_grammar='root ::= "a"') == StructuredSpec("grammar", 'root ::= "a"')
    choice = _spec(guided_choice=["yes", 'he said "no"', "café\n"])
    assert choice == StructuredSpec("grammar", 'root ::= "yes" | "he said \\"no\\"" | "café\\n"')
    from engine.structured import check

    check(choice)  # a grammar xgrammar takes
    completion = CompletionRequest(model="m", prompt="p", guided_regex="a|b").sampling_options()["structured"]
    assert completion == StructuredSpec("regex", "a|b")


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
            "response_format.json_schema.name",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": SCHEMA}}},
            "response_format.json_schema.name",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "p"}}},
            "response_format.json_schema.schema",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": [1]}}},
            "response_format.json_schema.schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "p", "schema": SCHEMA, "strict": "yes"},
                }
            },
            "response_format.json_schema.strict",
        ),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_regex": ""}, "guided_regex"),
        ({"guided_grammar": "   "}, "guided_grammar"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_choice": ["a", ""]}, "guided_choice"),
        ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex"),
    ],
)
def test_malformed_is_a_400_naming_the_field(fields, param):
    with pytest.raises(InvalidRequest) as err:
        _spec(**fields)
    assert err.value.param == param and err.value.message


@pytest.mark.parametrize(
    "field, value",
    [
        ("tools", [{"type": "function", "function": {"name": "f"}}]),
        ("tool_choice", "required"),
        ("parallel_tool_calls", False),
    ],
)
def test_tools_on_completions_stay_a_clear_400(field, value):
    with pytest.raises(InvalidRequest) as err:
        CompletionRequest(model="m", prompt="p", **{field: value}).sampling_options()
    assert err.value.param == field
