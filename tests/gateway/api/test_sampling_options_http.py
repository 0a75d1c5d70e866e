"""Penalties, logit_bias, logprobs, echo and usage details over HTTP: an in-process gateway, real
Redis, one real worker on the tiny random-weight model for the module. Response shapes, streamed
and not; bad values are a 400 in OpenAI's error shape that charges no quota and records nothing."""

from __future__ import annotations

import json
import uuid

import pytest
import redis as redislib
from gateway_test_helpers import (
    ADMIN_TOKEN,
    TINY,
    TINY_ENGINE,
    InProcessGateway,
    admin_headers,
    assert_openai_error,
    inproc_gateway,
    inproc_worker,
    make_tenant_key,
)

from tenancy import upgrade

VOCAB = TINY["vocab_size"]


@pytest.fixture(scope="module")
def module_settings(tmp_path_factory, redis_url):
    from gateway.settings import ApiSettings

    database_url = f"sqlite:///{tmp_path_factory.mktemp('sampling') / 'fairlane.db'}"
    upgrade(database_url)
    prefix = f"fltest:sampling:{uuid.uuid4().hex[:10]}"
    yield ApiSettings(
        admin_token=ADMIN_TOKEN,
        redis_url=redis_url,
        database_url=database_url,
        engine=TINY_ENGINE,
        served_model_name=f"test-{uuid.uuid4().hex[:10]}",
        max_tokens_default=8,
        request_timeout_s=30,
        quota_key_prefix=prefix,
    )
    client = redislib.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        client.delete(key)
    client.close()


@pytest.fixture(scope="module")
def module_worker(module_settings, tiny_engine_factory):
    model = module_settings.model_name
    with inproc_worker(tiny_engine_factory(num_threads=None), module_settings) as (worker, _client):
        yield worker
    client = redislib.Redis.from_url(module_settings.redis_url)  # the worker has stopped: its lanes can go
    for pattern in (f"lanes:{model}:*", f"workers:{model}", f"model:{model}", f"worker:{model}:*"):
        for key in client.scan_iter(match=pattern, count=1000):
            client.delete(key)
    client.close()


@pytest.fixture
async def gw(module_settings, module_worker):
    async with inproc_gateway(module_settings, InProcessGateway) as gateway:
        yield gateway


@pytest.fixture
async def tenant(gw):
    tenant, key = await make_tenant_key(gw.http, f"t{uuid.uuid4().hex[:8]}")
    response = await gw.http.put(
        f"/admin/tenants/{tenant['id']}/quota",
        headers=admin_headers(),
        json={"requests_per_minute": 100, "daily_token_budget": 100_000},
    )
    assert response.status_code == 200, response.text
    return tenant["id"], key


def _events(text: str) -> list[dict]:
    lines = [line[len("data: ") :] for line in text.split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


CHAT_BAD = [
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {" 1": 1}}, "logit_bias"),  # only ASCII decimal digits name a token
    ({"logit_bias": {"1 ": 1}}, "logit_bias"),
    ({"logit_bias": {"\uff11": 1}}, "logit_bias"),  # a full-width 1
    ({"logit_bias": {"\u00b2": 1}}, "logit_bias"),  # a superscript 2
    ({"logit_bias": {"+1": 1}}, "logit_bias"),
    ({"logit_bias": {"1_0": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {str(VOCAB): 1}}, "logit_bias"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "n": 2}, "n"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "json_object"}, "n": 2}, "n"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ({"reasoning_effort": "low"}, "reasoning_effort"),
    ({"web_search_options": {}}, "web_search_options"),
    ({"store": True}, "store"),
    ({"foo": 1}, "foo"),  # unknown: OpenAI's "Unrecognized request argument supplied"
    ({"best_of": 2}, "best_of"),  # parameters of /v1/completions only
    ({"echo": True}, "echo"),
    ({"suffix": "end"}, "suffix"),
    ({"min_p": 0.1}, "min_p"),  # a vLLM extension this server does not implement
]
COMPLETION_BAD = [
    ({"top_logprobs": 2}, "top_logprobs"),  # a chat parameter
    ({"tools": []}, "tools"),
    ({"tool_choice": "none"}, "tool_choice"),
    ({"metadata": {"a": "b"}}, "metadata"),
    ({"foo": None}, "foo"),
    ({"logprobs": 6}, "logprobs"),
    ({"logprobs": -1}, "logprobs"),
    ({"best_of": 2, "n": 3}, "best_of"),
    ({"best_of": 3, "stream": True}, "best_of"),
    ({"suffix": "end"}, "suffix"),
    ({"n": 2, "max_tokens": 0, "echo": True}, "n"),
]


async def test_bad_values_are_400_and_charge_nothing(gw, tenant):
    tenant_id, key = tenant
    for extra, param in CHAT_BAD:
        assert_openai_error(await gw.chat(key, **extra), 400, param=param)
    for extra, param in COMPLETION_BAD:
        assert_openai_error(await gw.complete(key, "hello", **extra), 400, param=param)
    usage = await gw.quota_usage(tenant_id)
    assert usage["requests"]["remaining"] == 100 and usage["daily"]["used"] == 0 and usage["in_flight"] == 0
    assert gw.records(tenant_id) == []


async def test_unknown_fields_name_the_field(gw, tenant):
    _, key = tenant
    error = assert_openai_error(await gw.chat(key, foo=1), 400, param="foo", code="unknown_parameter")
    assert error["message"] == "Unrecognized request argument supplied: foo"
    assert error["type"] == "invalid_request_error"
    error = assert_openai_error(await gw.chat(key, echo=True), 400, param="echo")
    assert "not supported" in error["message"] and error["code"] == "unsupported_parameter"


CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
USER = {"role": "user", "content": "Hi"}
MESSAGES_BAD = [
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "system", "content": None}, USER], "messages[0].content"),
    ([USER, {"role": "developer"}], "messages[1].content"),
    ([USER, {"role": "assistant"}], "messages[1].content"),
    ([USER, {"role": "assistant", "content": None, "tool_calls": []}], "messages[1].content"),
    ([USER, {"role": "user", "content": []}], "messages[1].content"),
    ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0].text"),
    ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content[0].type"),
    ([{"role": "user", "content": "Hi", "tool_calls": [CALL]}], "messages[0].tool_calls"),
    (
        [USER, {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "content": "1"}],
        "messages[2].tool_call_id",
    ),
    (
        [USER, {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "call_1"}],
        "messages[2].content",
    ),
    ([USER, {"role": "tool", "tool_call_id": "call_1", "content": "1"}], "messages[1].role"),
]


async def test_bad_messages_are_400_naming_the_message(gw, tenant):
    tenant_id, key = tenant
    for messages, param in MESSAGES_BAD:
        assert_openai_error(await gw.chat(key, messages=messages), 400, param=param)
    usage = await gw.quota_usage(tenant_id)
    assert usage["requests"]["remaining"] == 100 and usage["daily"]["used"] == 0
    good = [
        [{"role": "system", "content": ""}, USER],
        [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        [
            USER,
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            *[{"role": "tool", "tool_call_id": "call_1", "content": c} for c in ("1", "2")],
        ],
        [
            USER,
            {"role": "assistant", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "1"},
        ],
    ]
    for messages in good:
        response = await gw.chat(key, messages=messages, max_tokens=1)
        assert response.status_code == 200, (messages, response.text)


async def test_fields_with_no_effect_are_accepted(gw, tenant):
    """OpenAI's fields that cannot change the output, the defaults of /v1/completions-only fields
    on chat, and the extensions this server implements: a 200 each."""
    _, key = tenant
    chat_ok = {
        "user": "u",
        "metadata": {"k": "v"},
        "store": False,
        "safety_identifier": "s",
        "prompt_cache_key": "p",
        "best_of": 1,
        "echo": False,
        "suffix": None,
        "top_k": 5,
        "repetition_penalty": 1.1,
        "min_tokens": 1,
        "ignore_eos": True,
        "stream_options": None,
    }
    for name, value in chat_ok.items():
        response = await gw.chat(key, max_tokens=2, **{name: value})
        assert response.status_code == 200, (name, response.text)
    response = await gw.complete(
        key, "hello", max_tokens=2, user="u", best_of=1, echo=False, top_k=5, min_tokens=1, seed=3
    )
    assert response.status_code == 200, response.text


async def test_chat_logprobs_shape_streamed_and_not(gw, tenant):
    _, key = tenant
    body = (await gw.chat(key, max_tokens=5, logprobs=True, top_logprobs=3)).json()
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 5 and body["choices"][0]["message"]["content"] == "".join(
        e["token"] for e in content
    )
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"} and entry["logprob"] <= 0
        assert bytes(entry["bytes"]).decode() == entry["token"]
        tops = entry["top_logprobs"]
        assert len(tops) == 3 and [t["logprob"] for t in tops] == sorted(
            (t["logprob"] for t in tops), reverse=True
        )
        assert tops[0]["token"] == entry["token"]  # greedy: the chosen token is the most likely one
    response = await gw.chat(key, max_tokens=5, logprobs=True, top_logprobs=3, stream=True)
    streamed = [
        e
        for event in _events(response.text)
        for c in event["choices"]
        if c["logprobs"]
        for e in c["logprobs"]["content"]
    ]
    assert streamed == content
    plain = (await gw.chat(key, max_tokens=5)).json()["choices"][0]
    assert plain["logprobs"] is None
    none_top = (await gw.chat(key, max_tokens=2, logprobs=True)).json()["choices"][0]["logprobs"]["content"]
    assert [e["top_logprobs"] for e in none_top] == [[], []]


async def test_completion_logprobs_zero_is_not_null(gw, tenant):
    _, key = tenant
    choice = (await gw.complete(key, "hello", max_tokens=3, logprobs=0)).json()["choices"][0]
    lp = choice["logprobs"]
    assert (
        len(lp["tokens"]) == 3
        and all(v <= 0 for v in lp["token_logprobs"])
        and lp["top_logprobs"] == [None] * 3
    )
    assert lp["text_offset"] == [0, len(lp["tokens"][0]), len(lp["tokens"][0]) + len(lp["tokens"][1])]


async def test_echo_with_and_without_generation(gw, tenant):
    _, key = tenant
    prompt = "hello world"  # the tiny model's byte tokenizer: one token per byte
    scored = (await gw.complete(key, prompt, max_tokens=0, echo=True, logprobs=2)).json()
    choice = scored["choices"][0]
    assert choice["text"] == prompt and scored["usage"]["completion_tokens"] == 0
    assert choice["finish_reason"] == "length"
    lp = choice["logprobs"]
    assert (
        len(lp["tokens"]) == len(prompt) and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    )
    assert all(v <= 0 for v in lp["token_logprobs"][1:]) and all(len(t) >= 2 for t in lp["top_logprobs"][1:])
    more = (await gw.complete(key, prompt, max_tokens=2, echo=True, logprobs=2)).json()["choices"][0]
    assert more["text"].startswith(prompt) and len(more["logprobs"]["tokens"]) == len(prompt) + 2
    assert more["logprobs"]["token_logprobs"][: len(prompt)] == pytest.approx(lp["token_logprobs"], abs=1e-5)
    plain_echo = (await gw.complete(key, prompt, max_tokens=2, echo=True)).json()["choices"][0]
    assert plain_echo["text"] == more["text"] and plain_echo["logprobs"] is None
    response = await gw.complete(key, prompt, max_tokens=2, echo=True, logprobs=2, stream=True)
    events = _events(response.text)
    assert "".join(c["text"] for e in events for c in e["choices"]) == more["text"]
    tokens = [t for e in events for c in e["choices"] if c["logprobs"] for t in c["logprobs"]["tokens"]]
    offsets = [o for e in events for c in e["choices"] if c["logprobs"] for o in c["logprobs"]["text_offset"]]
    assert tokens == more["logprobs"]["tokens"] and offsets == more["logprobs"]["text_offset"]


async def test_logit_bias_forces_a_token(gw, tenant):
    _, key = tenant
    body = (await gw.complete(key, "hello", max_tokens=4, logit_bias={"77": 100})).json()
    assert body["choices"][0]["text"] == " t77" * 4


async def test_usage_reports_cached_prompt_tokens(gw, tenant):
    _, key = tenant
    prompt = "a prompt long enough to fill a few blocks of sixteen tokens " * 2
    first = (await gw.complete(key, prompt, max_tokens=1)).json()["usage"]
    second = (await gw.complete(key, prompt, max_tokens=1)).json()["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and cached % 16 == 0 and cached < second["prompt_tokens"]
    assert second["completion_tokens_details"]["reasoning_tokens"] == 0


async def test_n_choices_streamed_and_not(gw, tenant):
    tenant_id, key = tenant
    body = (await gw.complete(key, "hello", max_tokens=4, n=3, temperature=1.0, seed=5, logprobs=0)).json()
    choices = body["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2] and len({c["text"] for c in choices}) == 3
    assert all(len(c["logprobs"]["tokens"]) == 4 for c in choices)
    prompt_tokens = body["usage"]["prompt_tokens"]
    assert (
        prompt_tokens == len("hello") and body["usage"]["completion_tokens"] == 12
    )  # the prompt counts once
    response = await gw.chat(
        key, max_tokens=4, n=3, temperature=1.0, seed=5, stream=True, stream_options={"include_usage": True}
    )
    events = _events(response.text)
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    for event in events[:-1]:
        for c in event["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["delta"].get("content", "")
            if c["finish_reason"]:
                reasons[c["index"]] = c["finish_reason"]
    assert sorted(texts) == [0, 1, 2] and reasons == {0: "length", 1: "length", 2: "length"}
    plain = (await gw.chat(key, max_tokens=4, n=3, temperature=1.0, seed=5)).json()
    assert [texts[i] for i in range(3)] == [c["message"]["content"] for c in plain["choices"]]
    assert events[-1]["usage"]["completion_tokens"] == 12
    records = gw.records(tenant_id)
    assert sorted(r.completion_tokens for r in records) == [12, 12, 12]
    chat_prompt = plain["usage"]["prompt_tokens"]
    assert sorted(r.prompt_tokens for r in records) == sorted([prompt_tokens, chat_prompt, chat_prompt])


async def test_best_of_returns_the_n_most_likely(gw, tenant):
    _, key = tenant
    every = (await gw.complete(key, "hello", max_tokens=3, n=4, temperature=1.0, seed=9, logprobs=0)).json()
    totals = sorted((sum(c["logprobs"]["token_logprobs"]) for c in every["choices"]), reverse=True)
    best = (await gw.complete(key, "hello", max_tokens=3, n=2, best_of=4, temperature=1.0, seed=9)).json()
    assert [c["index"] for c in best["choices"]] == [0, 1] and all(
        c["logprobs"] is None for c in best["choices"]
    )
    by_text = {c["text"]: sum(c["logprobs"]["token_logprobs"]) for c in every["choices"]}
    assert sorted((by_text[c["text"]] for c in best["choices"]), reverse=True) == pytest.approx(totals[:2])
    assert best["usage"]["completion_tokens"] == 12  # every candidate is billed
