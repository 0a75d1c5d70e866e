"""The OpenAI surface over HTTP (in-process gateway, real Redis, real worker on a tiny model):
response shapes, SSE, and bad input → the OpenAI error shape with a 4xx, never a 500."""

from __future__ import annotations

import json
from datetime import UTC

import pytest
from gateway_test_helpers import admin_headers, assert_openai_error, chat_body, make_tenant_key


@pytest.fixture
async def key(app_client):
    _tenant, key = await make_tenant_key(app_client, "acme")
    return key


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _events(text: str) -> list:
    lines = [line[len("data: ") :] for line in text.split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


async def test_chat_completion_with_usage(app_client, running_worker, settings, key):
    response = await app_client.post("/v1/chat/completions", headers=_auth(key), json=chat_body(settings))
    assert response.status_code == 200, response.text
    body = response.json()
    assert (
        body["object"] == "chat.completion" and body["id"] == "chatcmpl-" + response.headers["x-request-id"]
    )
    assert (
        body["choices"][0]["finish_reason"] == "length" and body["service_tier"] == "default"
    )  # OpenAI's name of our standard tier
    assert body["choices"][0]["message"]["content"].count(" t") == 4  # the tiny model's ids as text
    assert (
        body["usage"]["completion_tokens"] == 4
        and body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 4
    )


async def test_streamed_chat_with_include_usage(app_client, running_worker, settings, key):
    payload = chat_body(settings, stream=True, stream_options={"include_usage": True}, service_tier="batch")
    response = await app_client.post("/v1/chat/completions", headers=_auth(key), json=payload)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = _events(response.text)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(e["usage"] is None for e in events[:-1]) and all(e["service_tier"] == "flex" for e in events)
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 4
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
    answered = await app_client.post("/v1/chat/completions", headers=_auth(key), json=chat_body(settings))
    plain = answered.json()
    assert text == plain["choices"][0]["message"]["content"]  # greedy: same answer either way


async def test_streamed_completion_with_continuous_usage(app_client, running_worker, settings, key):
    payload = {
        "model": settings.model_name,
        "prompt": "abc",
        "max_tokens": 3,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    response = await app_client.post("/v1/completions", headers=_auth(key), json=payload)
    events = _events(response.text)
    assert [e["usage"]["completion_tokens"] for e in events[:-1]] == [1, 2, 3]
    assert events[-1]["choices"] == [] and events[-1]["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 3,
        "total_tokens": 6,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


async def test_continuous_usage_stats_alone_sends_no_usage(app_client, running_worker, settings, key):
    """vLLM's rule: continuous_usage_stats adds usage to every chunk only with include_usage."""
    for path, body in (
        ("/v1/completions", {"prompt": "abc"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
    ):
        payload = body | {
            "model": settings.model_name,
            "max_tokens": 3,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"continuous_usage_stats": True},
        }
        response = await app_client.post(path, headers=_auth(key), json=payload)
        assert response.status_code == 200, response.text
        events = _events(response.text)
        assert all(e.get("usage") is None for e in events), events
        assert all(e["choices"] for e in events)  # no usage-only chunk at the end


async def test_completion_accepts_token_ids(app_client, running_worker, settings, key):
    payload = {"model": settings.model_name, "prompt": [5, 6, 7], "max_tokens": 2, "ignore_eos": True}
    body = (await app_client.post("/v1/completions", headers=_auth(key), json=payload)).json()
    assert body["object"] == "text_completion" and body["usage"]["prompt_tokens"] == 3


async def test_models_and_health(app_client, running_worker, settings, key):
    models = (await app_client.get("/v1/models", headers=_auth(key))).json()
    assert [m["id"] for m in models["data"]] == [settings.model_name]
    health = await app_client.get("/health")
    assert health.json() == {"status": "ok"} and health.headers["x-request-id"]
    ready = await app_client.get("/ready")
    assert ready.status_code == 200 and ready.json()["checks"] == {
        "redis": True,
        "database": True,
        "worker": True,
    }


async def test_no_worker_is_503_and_not_ready(app_client, settings, key):
    assert_openai_error(
        await app_client.post("/v1/chat/completions", headers=_auth(key), json=chat_body(settings)),
        503,
        code="service_unavailable",
    )
    assert (await app_client.get("/ready")).status_code == 503


async def test_auth_errors(app_client, settings, key):
    assert_openai_error(
        await app_client.post("/v1/chat/completions", json=chat_body(settings)), 401, code="missing_api_key"
    )
    assert_openai_error(
        await app_client.post(
            "/v1/chat/completions", headers=_auth(key[:-2] + "zz"), json=chat_body(settings)
        ),
        401,
        code="invalid_api_key",
    )


async def test_a_key_without_the_inference_scope_may_not_call_the_api(app_client, settings):
    tenant, _key = await make_tenant_key(app_client, "scoped")
    keys = f"/admin/tenants/{tenant['id']}/keys"
    created = await app_client.post(keys, json={"scopes": ["adapters"]}, headers=admin_headers())
    assert created.status_code == 201, created.text
    adapters_only = created.json()["key"]
    for call in (
        app_client.post("/v1/chat/completions", headers=_auth(adapters_only), json=chat_body(settings)),
        app_client.get("/v1/models", headers=_auth(adapters_only)),
    ):
        assert_openai_error(await call, 403, code="missing_scope")
    for scopes in (["admin"], ["inference", "everything"]):  # only known scopes are given out
        refused = await app_client.post(keys, json={"scopes": scopes}, headers=admin_headers())
        assert refused.status_code == 422 and refused.json()["error"]["param"] == "scopes"


async def test_tier_errors(app_client, settings, key):
    error = assert_openai_error(
        await app_client.post(
            "/v1/chat/completions", headers=_auth(key), json=chat_body(settings, service_tier="priority")
        ),
        403,
        param="service_tier",
        code="tier_not_allowed",
    )
    assert "priority" in error["message"]
    assert_openai_error(
        await app_client.post(
            "/v1/chat/completions", headers=_auth(key), json=chat_body(settings, service_tier="platinum")
        ),
        400,
        param="service_tier",
    )


@pytest.mark.parametrize(
    "payload, status, param",
    [
        ({"messages": [{"role": "user", "content": "x"}]}, 422, "model"),
        ({"model": "M", "messages": []}, 422, "messages"),
        ({"model": "M", "messages": [{"role": "wizard", "content": "x"}]}, 422, "messages.0.role"),
        (
            {"model": "M", "messages": [{"role": "user", "content": "x"}], "max_tokens": "many"},
            422,
            "max_tokens",
        ),
        (
            {"model": "M", "messages": [{"role": "user", "content": "x"}], "temperature": 7},
            422,
            "temperature",
        ),
        ({"model": "M", "messages": [{"role": "user", "content": "x"}], "n": 129}, 422, "n"),
        (
            {"model": "M", "messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]},
            400,
            "stop",
        ),
        ({"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
        (
            {"model": "M", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
            400,
            "top_logprobs",
        ),
        (
            {"model": "M", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
            400,
            "tools[0]",
        ),
        (
            {
                "model": "M",
                "messages": [{"role": "user", "content": "x"}],
                "stream_options": {"include_usage": True},
            },
            400,
            "stream_options",
        ),
        ([1, 2, 3], 422, None),
    ],
)
async def test_bad_chat_bodies(app_client, running_worker, settings, key, payload, status, param):
    if isinstance(payload, dict) and payload.get("model") == "M":
        payload["model"] = settings.model_name
    error = assert_openai_error(
        await app_client.post("/v1/chat/completions", headers=_auth(key), json=payload), status, param=param
    )
    assert "input_value" not in error["message"] and "errors.pydantic.dev" not in error["message"]


async def test_malformed_json_and_wrong_content(app_client, key):
    headers = {**_auth(key), "content-type": "application/json"}
    assert_openai_error(
        await app_client.post("/v1/chat/completions", headers=headers, content=b'{"model": '),
        400,
        code="invalid_json",
    )
    assert_openai_error(await app_client.post("/v1/completions", headers=headers, content=b"\xff\xfe"), 400)
    # no body at all, and one nested deeper than the JSON parser goes (it raises RecursionError)
    assert_openai_error(
        await app_client.post("/v1/chat/completions", headers=headers, content=b""), 400, code="invalid_json"
    )
    deep = b'{"model": "m", "messages": [], "metadata": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert_openai_error(
        await app_client.post("/v1/chat/completions", headers=headers, content=deep), 400, code="invalid_json"
    )


async def test_a_bad_key_is_401_whatever_the_body(app_client):
    headers = {**_auth("fl-abcdefgh_" + "x" * 43), "content-type": "application/json"}
    for content in (b'{"model": ', b"", b"[" * 100_000):
        assert_openai_error(
            await app_client.post("/v1/chat/completions", headers=headers, content=content), 401
        )


async def test_prompt_over_the_context(app_client, running_worker, settings, key):
    long_prompt = {"model": settings.model_name, "prompt": "x" * 300, "max_tokens": 4}  # 256-token model
    assert_openai_error(
        await app_client.post("/v1/completions", headers=_auth(key), json=long_prompt),
        400,
        param="prompt",
        code="context_length_exceeded",
    )
    too_many = {
        "model": settings.model_name,
        "prompt": "x" * 200,
        "max_tokens": 100,
    }  # refused before admission
    error = assert_openai_error(
        await app_client.post("/v1/completions", headers=_auth(key), json=too_many),
        400,
        param="max_tokens",
        code="context_length_exceeded",
    )
    assert "maximum context length is 256" in error["message"]


async def test_oversized_bodies_are_413(app_client, settings, key):
    big = json.dumps({"model": settings.model_name, "prompt": "x" * (settings.max_body_bytes + 10)}).encode()
    headers = {**_auth(key), "content-type": "application/json"}
    assert_openai_error(await app_client.post("/v1/completions", headers=headers, content=big), 413)

    async def chunked():
        for start in range(0, len(big), 65536):
            yield big[start : start + 65536]

    assert_openai_error(await app_client.post("/v1/completions", headers=headers, content=chunked()), 413)


async def test_unknown_routes_and_methods_use_the_error_shape(app_client, key):
    assert_openai_error(await app_client.get("/v1/nothing-here", headers=_auth(key)), 404)
    assert_openai_error(await app_client.get("/v1/chat/completions", headers=_auth(key)), 405)


async def test_redis_down_is_503_not_500(settings, free_tcp_port):
    import httpx

    from gateway.api.app import create_app

    app = create_app(settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{free_tcp_port}/0"}))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as client:
            response = await client.get("/v1/models", headers=_auth("fl-abcdefgh_" + "x" * 43))
            assert_openai_error(response, 503, code="service_unavailable")
            assert response.headers["retry-after"] == "2"
            assert (await client.get("/ready")).json()["checks"]["redis"] is False


@pytest.mark.parametrize("on_error, ready", [("closed", False), ("open", True)])
async def test_a_separate_quota_redis_that_is_down_is_not_ready_when_it_refuses(
    settings, free_tcp_port, on_error, ready
):
    """Quotas on a Redis of their own that does not answer: with quota_on_redis_error closed every
    request is refused (503), so the replica is not ready (it said ready, and a load balancer kept
    sending it traffic); open admits without quotas, and it is."""
    import httpx

    from gateway.api.app import create_app

    down = f"redis://127.0.0.1:{free_tcp_port}/0"
    app = create_app(settings.model_copy(update={"quota_redis_url": down, "quota_on_redis_error": on_error}))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as client:
            checks = (await client.get("/ready")).json()["checks"]
    assert checks["redis"] is True and checks.get("quota_redis", True) is ready


async def test_lane_entry_carries_tenant_tier_and_trace_context(app_client, settings, redis):
    import asyncio
    import time

    from gateway.lanes.keys import lane_key
    from gateway.lanes.messages import LaneRequest

    tenant, key = await make_tenant_key(app_client, "lane-acme")
    redis.zadd(f"workers:{settings.model_name}", {"announced-only": time.time()})  # nobody consumes
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    request = asyncio.create_task(
        app_client.post(
            "/v1/chat/completions",
            json=chat_body(settings, service_tier="batch", max_tokens=5),
            headers={**_auth(key), "traceparent": traceparent},
        )
    )
    lane = lane_key(settings.model_name, "batch")
    for _ in range(100):
        entries = redis.xrange(lane)
        if entries:
            break
        await asyncio.sleep(0.05)
    request.cancel()
    ((entry_id, fields),) = entries
    queued = LaneRequest.decode(fields)
    assert (queued.tenant, queued.tier, queued.traceparent) == (str(tenant["id"]), "batch", traceparent)
    assert queued.sampling.max_tokens == 5 and queued.sampling.temperature == 0 and queued.prompt_token_ids
    for _ in range(100):  # the cancelled handler marks it as it unwinds (at once; seconds on a busy machine)
        if redis.exists(f"cancel:{queued.request_id}"):
            break
        await asyncio.sleep(0.05)
    assert redis.exists(f"cancel:{queued.request_id}")  # the abandoned request is marked for cancel


async def test_usage_record_has_timings_and_outcome(app_client, running_worker, settings, key):
    from datetime import datetime, timedelta

    from tenancy import (
        get_tenant_by_name,
        list_usage,
        make_engine,
        make_session_factory,
    )

    response = await app_client.post(
        "/v1/chat/completions", headers=_auth(key), json=chat_body(settings, service_tier="batch")
    )
    assert response.status_code == 200
    engine = make_engine(settings.database_url)
    now = datetime.now(UTC)
    with make_session_factory(engine)() as session:
        tenant = get_tenant_by_name(session, name="acme")
        (record,) = list_usage(session, tenant_id=tenant.id, since=now - timedelta(minutes=5), until=now)
    engine.dispose()
    assert record.request_id == response.headers["x-request-id"]
    assert (record.model, record.tier, record.status, record.completion_tokens) == (
        settings.model_name,
        "batch",
        "length",
        4,
    )
    assert 0 < record.ttft_ms <= record.latency_ms
