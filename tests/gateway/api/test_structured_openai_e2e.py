"""Structured outputs through the official openai client against a live `fairlane serve --dev` with
the real SmolLM2: response_format json_schema (sent together, so the worker batches them), streamed,
the client's own parse(), vLLM's guided_regex, and the refusals (400, nothing charged)."""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import openai
import pytest
from pydantic import BaseModel
from serve_process import free_port, start, wait_ready
from sqlalchemy import select

from tenancy import UsageRecord, make_engine, make_session_factory

pytestmark = pytest.mark.real_model

MODEL = "smollm2"
MESSAGES = [{"role": "user", "content": "Give a small JSON example about a person, a color or a point."}]
SCHEMAS = {
    "person": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                "age": {"type": "integer", "minimum": 0, "maximum": 120}},
               "required": ["name", "age"], "additionalProperties": False},
    "color": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "bright": {"type": "boolean"}},
              "required": ["color", "bright"], "additionalProperties": False},
    "point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                               "y": {"type": "integer", "minimum": -9, "maximum": 9}},
              "required": ["x", "y"], "additionalProperties": False},
}


def _format(name: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve-structured")
    port = free_port()
    env = {"FAIRLANE_DATABASE_URL": f"sqlite:///{tmp / 'fairlane.db'}", "FAIRLANE_ENGINE__MODEL": MODEL,
           "FAIRLANE_ENGINE__NUM_THREADS": "1", "FAIRLANE_ENGINE__MAX_NUM_SEQS": "8",
           "FAIRLANE_ENGINE__NUM_KV_BLOCKS": "128", "FAIRLANE_CONFIG": "/nonexistent.yaml", "FAIRLANE_REDIS_URL": ""}
    served = start(["serve", "--dev", "--port", str(port)], env, str(tmp / "serve.log"), port=port)
    served.extra["database_url"] = env["FAIRLANE_DATABASE_URL"]
    try:
        yield wait_ready(served, timeout_s=240)
    finally:
        served.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, max_retries=0)


def _records(server, request_id: str) -> list[UsageRecord]:
    engine = make_engine(server.extra["database_url"])
    with make_session_factory(engine)() as session:
        rows = session.scalars(select(UsageRecord).where(UsageRecord.request_id == request_id)).all()
    engine.dispose()
    return list(rows)


async def test_json_schema_outputs_validate_sampled_together(server):
    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, max_retries=0)
    jobs = [(name, seed) for name in SCHEMAS for seed in (1, 2)]
    replies = await asyncio.gather(*[
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=48, temperature=1.0, seed=seed,
                                       response_format=_format(name)) for name, seed in jobs])
    await client.close()
    for (name, _), reply in zip(jobs, replies):
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), SCHEMAS[name])


def test_streamed_json_schema_equals_the_whole_answer(client):
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=48, temperature=0,
                                           response_format=_format("person"))
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=48, temperature=0,
                                            response_format=_format("person"), stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), SCHEMAS["person"])


def test_the_clients_parse_helper_gets_its_model(client):
    class Point(BaseModel):
        x: int
        y: int

    parsed = client.chat.completions.parse(model=MODEL, messages=MESSAGES, max_tokens=48, temperature=0,
                                           response_format=Point)
    point = parsed.choices[0].message.parsed
    assert isinstance(point, Point) and parsed.choices[0].finish_reason == "stop"


def test_guided_regex_and_completions(client):
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0,
                                           extra_body={"guided_regex": r"\d{3}-\d{4}"})
    assert re.fullmatch(r"\d{3}-\d{4}", reply.choices[0].message.content)
    completion = client.completions.create(model=MODEL, prompt="Is the sky blue? Answer:", max_tokens=8, temperature=0,
                                           extra_body={"guided_grammar": 'root ::= " " ("yes" | "no")'})
    assert completion.choices[0].text in (" yes", " no") and completion.choices[0].finish_reason == "stop"
    picked = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=1.0, seed=2,
                                            extra_body={"guided_choice": ["red", "green", "blue"]})
    assert picked.choices[0].message.content in ("red", "green", "blue")


def test_a_schema_xgrammar_refuses_is_a_400_and_charges_nothing(server, client):
    bad = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "integer", "minimum": 9, "maximum": 1}}}
    with pytest.raises(openai.BadRequestError, match="minimum greater than maximum") as err:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, response_format=bad)
    assert err.value.param == "response_format"
    records = _records(server, err.value.response.headers["x-request-id"])
    assert [(r.prompt_tokens, r.completion_tokens) for r in records] == [(0, 0)]  # refunded in full
    with pytest.raises(openai.BadRequestError, match="must be a JSON Schema object") as err:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "bad", "schema": "integer"}})
    assert err.value.param == "response_format.json_schema.schema"
    assert _records(server, err.value.response.headers["x-request-id"]) == []  # refused before the quota


WEATHER_ARGS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                 "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER_ARGS}},
         {"type": "function", "function": {"name": "get_time", "description": "The time in a city", "parameters": {
             "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
             "additionalProperties": False}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def test_named_tool_choice_calls_it_with_valid_arguments(client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=NAMED, max_tokens=48,
                                           temperature=1.0, seed=3)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_ARGS)
    # the call and its result go back in the next request: role "tool" is accepted
    follow = client.chat.completions.create(model=MODEL, max_tokens=8, temperature=0, tools=TOOLS, messages=[
        *ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "unit": "celsius"}'}])
    assert follow.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_required_tool_choice_streams_delta_tool_calls(client):
    stream = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                            max_tokens=48, temperature=0, stream=True)
    chunks = [c for c in stream if c.choices]
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].function.name in ("get_weather", "get_time")
    schema = TOOLS[0 if calls[0].function.name == "get_weather" else 1]["function"]["parameters"]
    jsonschema.validate(json.loads(calls[0].function.arguments), schema)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tools_on_completions_stay_a_400(client):
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=4, extra_body={"tools": TOOLS})
