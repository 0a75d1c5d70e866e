"""tools / tool_choice → the conversation, the constraint and the parsed calls (gateway/api/tools.py)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from engine import StructuredSpec
from gateway.api import tools
from gateway.api.errors import InvalidRequest

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}


def test_none_and_no_tools_change_nothing():
    assert (
        tools.plan(None, None) is None
        and tools.plan([WEATHER], "none") is None
        and tools.plan(None, "auto") is None
    )


def test_named_choice_constrains_to_that_function():
    plan = tools.plan([WEATHER, TIME], {"type": "function", "function": {"name": "get_weather"}})
    spec = plan.structured()
    assert spec.kind == "json_schema"
    schema = json.loads(spec.value)
    jsonschema.validate({"name": "get_weather", "arguments": {"city": "Paris"}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "get_time", "arguments": {}}, schema)
    content, calls = plan.parse('{"name": "get_weather", "arguments": {"city": "Paris"}}')
    assert content is None and calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_required_allows_any_function_and_auto_is_unconstrained():
    schema = json.loads(tools.plan([WEATHER, TIME], "required").structured().value)
    assert len(schema["anyOf"]) == 2
    auto = tools.plan([WEATHER], None)
    assert auto.choice == "auto" and auto.structured() is None
    text = 'Let me check. <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    content, calls = auto.parse(text)
    assert content == "Let me check." and json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    assert auto.parse("Just text.") == ("Just text.", [])
    two = text + '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
    assert (
        len(auto.parse(two)[1]) == 2 and len(tools.plan([WEATHER], None, parallel=False).parse(two)[1]) == 1
    )
    assert auto.parse('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>')[1] == []  # unknown: text


def test_render_describes_tools_and_replays_history():
    plan = tools.plan([WEATHER], "auto")
    rendered = plan.render(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]
    )
    assert rendered[0]["content"].startswith("Be brief.") and "get_weather" in rendered[0]["content"]
    assert len(rendered) == 2
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    replayed = tools.render_history({"role": "assistant", "content": ""}, [call])
    assert (
        replayed["content"] == '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    )
    delta = tools.stream_delta(plan, replayed["content"])
    assert plan.called and delta["tool_calls"][0]["index"] == 0


@pytest.mark.parametrize(
    "tool_list, choice, param",
    [
        ([{"type": "retrieval"}], None, "tools[0]"),
        ([{"type": "function", "function": {"name": "bad name"}}], None, "tools[0].function.name"),
        ([WEATHER, WEATHER], None, "tools"),
        ([WEATHER], "sometimes", "tool_choice"),
        ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
        (None, "required", "tool_choice"),
    ],
)
def test_malformed_is_a_400_naming_the_field(tool_list, choice, param):
    with pytest.raises(InvalidRequest) as err:
        tools.plan(tool_list, choice)
    assert err.value.param == param


def test_the_constraint_is_one_xgrammar_accepts():
    from engine.structured import check

    check(tools.plan([WEATHER, TIME], "required").structured())
    assert isinstance(
        tools.plan([WEATHER], {"type": "function", "function": {"name": "get_weather"}}).structured(),
        StructuredSpec,
    )
