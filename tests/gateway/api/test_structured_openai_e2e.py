"""Structured outputs through the official openai client against a live `fairlane serve --dev` with
the real SmolLM2: response_format json_schema (sent together, so the worker batches them), streamed,
the client's own parse(), vLLM's guided_regex, and the refusals (400, nothing charged)."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel
from serve_process import free_port, request_usage_records, start, wait_ready

pytestmark = pytest.mark.real_model

MODEL = "smollm2"
MESSAGES = [{"role": "user", "content": "Give a small JSON example about a person, a color or a point."}]


def _obj(required: dict, optional: dict | None = None) -> dict:
    return {
        "type": "object",
        "properties": {**required, **(optional or {})},
        "required": list(required),
        "additionalProperties": False,
    }


def _str(n: int) -> dict:
    return {"type": "string", "maxLength": n}


def _int(lo: int, hi: int) -> dict:
    return {"type": "integer", "minimum": lo, "maximum": hi}


POINT = _obj({"x": _int(-9, 9), "y": _int(-9, 9)})
# Twenty bounded schemas (short strings, enums, integer ranges, few items), so that every output
# ends within max_tokens: nested objects, arrays, enums, booleans, numbers, optional fields, anyOf.
SCHEMAS = {
    "person": _obj({"name": _str(12), "age": _int(0, 120)}),
    "color": _obj({"color": {"enum": ["red", "green", "blue"]}, "bright": {"type": "boolean"}}),
    "point": POINT,
    "polyline": {"type": "array", "items": POINT, "minItems": 1, "maxItems": 3},
    "address": _obj(
        {"street": _str(16), "city": _str(12), "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}
    ),
    "book": _obj(
        {
            "title": _str(20),
            "year": _int(1900, 2025),
            "genres": {"type": "array", "items": {"enum": ["novel", "poetry", "essay"]}, "maxItems": 2},
        }
    ),
    "flags": _obj({"read": {"type": "boolean"}, "write": {"type": "boolean"}, "admin": {"type": "boolean"}}),
    "measure": _obj(
        {"value": {"type": "number", "minimum": 0, "maximum": 100}, "unit": {"enum": ["cm", "m", "km"]}}
    ),
    "profile": _obj({"name": _str(10)}, {"nickname": _str(8), "age": _int(0, 99)}),
    "ident": _obj({"id": {"anyOf": [_int(0, 999), _str(6)]}}),
    "account": _obj({"user": _obj({"name": _str(10), "email": _str(16)}), "active": {"type": "boolean"}}),
    "grid": {
        "type": "array",
        "items": {"type": "array", "items": _int(0, 9), "minItems": 1, "maxItems": 3},
        "minItems": 1,
        "maxItems": 2,
    },
    "order": _obj(
        {"item": {"enum": ["tea", "coffee", "cake"]}, "quantity": _int(1, 10), "express": {"type": "boolean"}}
    ),
    "weather": _obj(
        {"city": _str(12), "celsius": _int(-40, 50), "sky": {"enum": ["clear", "cloudy", "rain"]}}
    ),
    "tags": _obj({"tags": {"type": "array", "items": _str(8), "minItems": 1, "maxItems": 3}}),
    "rgb": _obj({"r": _int(0, 255), "g": _int(0, 255), "b": _int(0, 255)}),
    "event": _obj(
        {
            "name": _str(14),
            "day": {"enum": ["mon", "tue", "wed", "thu", "fri"]},
            "hour": _int(0, 23),
            "online": {"type": "boolean"},
        }
    ),
    "letters": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 4},
    "note": _obj({"title": _str(10), "body": {"anyOf": [_str(12), {"type": "null"}]}}),
    "shape": _obj(
        {
            "shape": {
                "anyOf": [
                    _obj({"kind": {"const": "circle"}, "radius": _int(1, 9)}),
                    _obj({"kind": {"const": "square"}, "side": _int(1, 9)}),
                ]
            }
        }
    ),
}
SEEDS = (1, 2, 3)


def _format(name: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


def _preemptions(server) -> float:
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    return sum(
        float(v) for v in re.findall(r"^fairlane_engine_preemptions_total\{[^}]*\} (\S+)$", text, re.M)
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve-structured")
    port = free_port()
    # 22 blocks of 16 tokens for up to 16 sequences: the concurrent sweep below runs out and preempts
    env = {
        "FAIRLANE_DATABASE_URL": f"sqlite:///{tmp / 'fairlane.db'}",
        "FAIRLANE_ENGINE__MODEL": MODEL,
        "FAIRLANE_ENGINE__NUM_THREADS": "1",
        "FAIRLANE_ENGINE__MAX_NUM_SEQS": "16",
        "FAIRLANE_ENGINE__DTYPE": "float32",
        "FAIRLANE_ENGINE__NUM_KV_BLOCKS": "22",
        "FAIRLANE_CONFIG": "",
        "FAIRLANE_REDIS_URL": "",
    }
    served = start(["serve", "--dev", "--port", str(port)], env, str(tmp / "serve.log"), port=port)
    served.extra["database_url"] = env["FAIRLANE_DATABASE_URL"]
    try:
        yield wait_ready(served, timeout_s=240)
    finally:
        served.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, max_retries=0)


async def test_twenty_schemas_three_seeds_sampled_together_under_preemption(server):
    """60 requests at temperature 1, sent at once so that the worker batches them and, with its
    small KV cache, preempts some: every output parses and validates; each schema's third seed is
    streamed."""
    client = openai.AsyncOpenAI(
        base_url=server.base_url + "/v1", api_key=server.api_key, max_retries=0, timeout=600
    )

    async def ask(name: str, seed: int) -> tuple[str, str | None]:
        messages = [{"role": "user", "content": f"Reply with JSON example number {seed} of a {name}."}]
        kwargs = dict(
            model=MODEL,
            messages=messages,
            max_tokens=128,
            temperature=1.0,
            seed=seed,
            response_format=_format(name),
        )
        if seed != SEEDS[-1]:
            choice = (await client.chat.completions.create(**kwargs)).choices[0]
            return choice.message.content, choice.finish_reason
        stream = await client.chat.completions.create(**kwargs, stream=True)
        text, reason = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                reason = chunk.choices[0].finish_reason or reason
        return text, reason

    before = _preemptions(server)
    jobs = [(name, seed) for name in SCHEMAS for seed in SEEDS]
    replies = await asyncio.gather(*[ask(name, seed) for name, seed in jobs])
    await client.close()
    metrics = httpx.get(server.base_url + "/metrics", timeout=10).text
    assert _preemptions(server) > before, [line for line in metrics.splitlines() if "preempt" in line]
    for (name, seed), (text, reason) in zip(jobs, replies):
        assert reason == "stop", (name, seed, text)
        jsonschema.validate(json.loads(text), SCHEMAS[name])
    varied = [
        name for name in SCHEMAS if len({text for (n, _), (text, _) in zip(jobs, replies) if n == name}) > 1
    ]
    assert len(varied) >= 15, varied  # seeds differ, so outputs do (a schema of few values may repeat one)


def test_streamed_json_schema_equals_the_whole_answer(client):
    whole = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=48, temperature=0, response_format=_format("person")
    )
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=48,
        temperature=0,
        response_format=_format("person"),
        stream=True,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), SCHEMAS["person"])


def test_the_clients_parse_helper_gets_its_model(client):
    class Point(BaseModel):
        x: int
        y: int

    parsed = client.chat.completions.parse(
        model=MODEL, messages=MESSAGES, max_tokens=48, temperature=0, response_format=Point
    )
    point = parsed.choices[0].message.parsed
    assert isinstance(point, Point) and parsed.choices[0].finish_reason == "stop"


def test_guided_regex_and_completions(client):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=24,
        temperature=0,
        extra_body={"guided_regex": r"\d{3}-\d{4}"},
    )
    assert re.fullmatch(r"\d{3}-\d{4}", reply.choices[0].message.content)
    completion = client.completions.create(
        model=MODEL,
        prompt="Is the sky blue? Answer:",
        max_tokens=8,
        temperature=0,
        extra_body={"guided_grammar": 'root ::= " " ("yes" | "no")'},
    )
    assert completion.choices[0].text in (" yes", " no") and completion.choices[0].finish_reason == "stop"
    picked = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=8,
        temperature=1.0,
        seed=2,
        extra_body={"guided_choice": ["red", "green", "blue"]},
    )
    assert picked.choices[0].message.content in ("red", "green", "blue")


def test_a_schema_xgrammar_refuses_is_a_400_and_charges_nothing(server, client):
    bad = {
        "type": "json_schema",
        "json_schema": {"name": "bad", "schema": {"type": "integer", "minimum": 9, "maximum": 1}},
    }
    with pytest.raises(openai.BadRequestError, match="minimum greater than maximum") as err:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, response_format=bad)
    assert err.value.param == "response_format"
    records = request_usage_records(server, err.value.response.headers["x-request-id"])
    assert [(r.prompt_tokens, r.completion_tokens) for r in records] == [(0, 0)]  # refunded in full
    with pytest.raises(openai.BadRequestError, match="must be a JSON Schema object") as err:
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": "integer"}},
        )
    assert err.value.param == "response_format.json_schema.schema"
    assert (
        request_usage_records(server, err.value.response.headers["x-request-id"]) == []
    )  # refused before the quota
    # the same schema as a forced tool's parameters: the error names that tool's field
    tools = [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "g", "parameters": bad["json_schema"]["schema"]}},
    ]
    for choice, param in (
        ({"type": "function", "function": {"name": "g"}}, "tools[1].function.parameters"),
        ("required", "tools"),
    ):
        with pytest.raises(openai.BadRequestError, match="minimum greater than maximum") as err:
            client.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=8, tools=tools, tool_choice=choice
            )
        assert err.value.param == param


WEATHER_ARGS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": WEATHER_ARGS,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The time in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def test_named_tool_choice_calls_it_with_valid_arguments(client):
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice=NAMED, max_tokens=48, temperature=1.0, seed=3
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_ARGS)
    # the call and its result go back in the next request: role "tool" is accepted
    follow = client.chat.completions.create(
        model=MODEL,
        max_tokens=8,
        temperature=0,
        tools=TOOLS,
        messages=[
            *ASK,
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "unit": "celsius"}'},
        ],
    )
    assert follow.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_required_tool_choice_streams_delta_tool_calls(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=48,
        temperature=0,
        stream=True,
    )
    chunks = [c for c in stream if c.choices]
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].function.name in ("get_weather", "get_time")
    schema = TOOLS[0 if calls[0].function.name == "get_weather" else 1]["function"]["parameters"]
    jsonschema.validate(json.loads(calls[0].function.arguments), schema)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tools_on_completions_stay_a_400(client):
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=4, extra_body={"tools": TOOLS})


def test_named_tool_choice_streamed_calls_it_with_valid_arguments(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice=NAMED,
        max_tokens=48,
        temperature=1.0,
        seed=4,
        stream=True,
    )
    chunks = [c for c in stream if c.choices]
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "get_weather" and calls[0].id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER_ARGS)
    assert not any(c.choices[0].delta.content for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
