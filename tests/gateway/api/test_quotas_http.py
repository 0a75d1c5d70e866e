"""Quota limits through HTTP: an in-process gateway on the real Redis with one real worker (tiny
model) for the module; its quota keys live under a prefix of their own. The official openai client
waits out a 429 and its retry succeeds; x-ratelimit-* headers on every response; max_tokens capped
by the quota; the admin quota API. Settlement and refunds: test_quota_settlement_http.py."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
from gateway_test_helpers import admin_headers, assert_openai_error, inproc_gateway
from quota_gateway import QuotaGateway

# The tiny random-weight Llama of tests/gateway/conftest.py (256 positions).


@pytest.fixture
async def gw(quota_settings, quota_worker):
    async with inproc_gateway(quota_settings, QuotaGateway) as gateway:
        yield gateway


async def test_openai_client_waits_out_a_429_then_succeeds(gw):
    # 240 tokens/min: one token every 0.25 s, burst 240. A 231-token request (230 prompt ids +
    # max_tokens 1) leaves 9; the client's chat (20 prompt tokens + 2) must wait ~3.25 s.
    tenant, key, _ = await gw.tenant(tokens_per_minute=240)
    first = await gw.complete(key, [7] * 230, max_tokens=1)
    assert first.status_code == 200, first.text
    assert first.headers["x-ratelimit-limit-tokens"] == "240"
    assert int(first.headers["x-ratelimit-remaining-tokens"]) <= 9 + 4  # a few refilled meanwhile

    seen: list[httpx.Response] = []

    async def record(response: httpx.Response) -> None:
        seen.append(response)

    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=gw.app), event_hooks={"response": [record]})
    client = openai.AsyncOpenAI(base_url="http://gateway/v1", api_key=key, http_client=http, max_retries=2)
    started = time.monotonic()
    completion = await client.chat.completions.create(
        model=gw.settings.model_name, max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
    )
    elapsed = time.monotonic() - started
    await client.close()
    assert [r.status_code for r in seen] == [429, 200]
    refused = seen[0]
    await refused.aread()
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    wait_s = int(refused.headers["retry-after-ms"]) / 1000
    assert 1.0 < wait_s < 4.0 and refused.headers["retry-after"] == str(int(-(-wait_s // 1)))
    assert refused.headers["x-ratelimit-limit-tokens"] == "240"
    assert elapsed >= wait_s and completion.usage.total_tokens == 20 + completion.usage.completion_tokens


async def test_ratelimit_headers_on_every_response(gw):
    tenant, key, key_id = await gw.tenant(
        requests_per_minute=100, tokens_per_minute=100_000, max_tokens_per_request=50
    )
    response = await gw.chat(key)
    assert response.status_code == 200, response.text
    h = response.headers
    assert (h["x-ratelimit-limit-requests"], h["x-ratelimit-remaining-requests"]) == ("100", "99")
    assert h["x-ratelimit-reset-requests"].endswith("ms") and h["x-ratelimit-limit-tokens"] == "100000"
    assert int(h["x-ratelimit-remaining-tokens"]) <= 100_000 - 24  # 20 prompt + 4 reserved
    assert "retry-after" not in h

    stream = await gw.chat(key, stream=True)
    assert stream.status_code == 200 and stream.headers["x-ratelimit-remaining-requests"] == "98"
    assert stream.text.rstrip().endswith("data: [DONE]")

    refused = await gw.chat(key, max_tokens=60)  # above max_tokens_per_request
    assert_openai_error(refused, 400, param="max_tokens")
    over_context = await gw.complete(key, [1] * 250, max_tokens=40)  # refused before admission: no headers
    assert_openai_error(over_context, 400, code="context_length_exceeded")
    assert "x-ratelimit-limit-requests" not in over_context.headers
    no_tokenizer = await gw.complete(
        key, [1] * 4, stop=["x"]
    )  # the worker refuses (random weights, no tokenizer)
    assert_openai_error(no_tokenizer, 400, param="stop")
    assert no_tokenizer.headers["x-ratelimit-limit-requests"] == "100"  # after admission: headers

    response = await gw.http.put(
        f"/admin/keys/{key_id}/quota", json={"requests_per_minute": 3}, headers=admin_headers()
    )
    assert response.status_code == 200, response.text
    statuses = [(await gw.chat(key, max_tokens=1)) for _ in range(4)]
    assert [r.status_code for r in statuses] == [200, 200, 200, 429]  # the key's own 3/min, in force at once
    limited = statuses[-1]
    assert_openai_error(limited, 429, code="rate_limit_exceeded")
    assert limited.headers["x-ratelimit-limit-requests"] == "3" and int(limited.headers["retry-after"]) >= 1
    assert limited.headers["x-ratelimit-remaining-requests"] == "0" and "retry-after-ms" in limited.headers


async def test_a_request_without_max_tokens_gets_the_default_capped_by_the_quota(gw):
    """The server default (8 here) is capped at the stricter max_tokens_per_request of the tenant (5)
    and the key (3) instead of being refused; a lowered cap applies at the next request."""
    tenant, key, key_id = await gw.tenant(max_tokens_per_request=5)
    put = await gw.http.put(
        f"/admin/keys/{key_id}/quota", json={"max_tokens_per_request": 3}, headers=admin_headers()
    )
    assert put.status_code == 200, put.text
    response = await gw.chat(key, max_tokens=None)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 3
    put = await gw.http.put(
        f"/admin/keys/{key_id}/quota", json={"max_tokens_per_request": 2}, headers=admin_headers()
    )
    assert put.status_code == 200, put.text
    assert (await gw.chat(key, max_tokens=None)).json()["usage"]["completion_tokens"] == 2
    error = assert_openai_error(await gw.chat(key, max_tokens=3), 400, param="max_tokens")  # asked explicitly
    assert "max_tokens, 3 over all its choices" in error["message"]
    error = assert_openai_error(await gw.chat(key, max_tokens=1, n=3), 400, param="max_tokens")
    assert "max_tokens, 3 over all its choices (n)" in error["message"]  # the cap is on the total


async def test_admin_quota_set_get_usage_round_trip(gw):
    tenant, key, key_id = await gw.tenant()
    tid, admin = tenant["id"], admin_headers()
    empty = (await gw.http.get(f"/admin/tenants/{tid}/quota", headers=admin)).json()
    assert empty["configured"] is False and empty["requests_per_minute"] is None

    quota = {
        "requests_per_minute": 10,
        "tokens_per_minute": 5000,
        "max_concurrency": 4,
        "daily_token_budget": 100_000,
        "monthly_token_budget": 1_000_000,
        "max_tokens_per_request": 64,
        "allowed_tiers": ["standard", "batch"],
        "tier_shares": {"batch": 0.5},
    }
    put = await gw.http.put(f"/admin/tenants/{tid}/quota", json=quota, headers=admin)
    assert put.status_code == 200, put.text
    got = (await gw.http.get(f"/admin/tenants/{tid}/quota", headers=admin)).json()
    assert {k: got[k] for k in quota} == quota and got["configured"] and got["key_id"] is None

    key_quota = (
        await gw.http.put(f"/admin/keys/{key_id}/quota", json={"daily_token_budget": 500}, headers=admin)
    ).json()
    assert key_quota["tenant_id"] == tid and key_quota["key_id"] == key_id
    got_key = (await gw.http.get(f"/admin/keys/{key_id}/quota", headers=admin)).json()
    assert got_key["daily_token_budget"] == 500 and got_key["requests_per_minute"] is None

    response = await gw.chat(key)
    assert response.status_code == 200, response.text
    used = response.json()["usage"]["total_tokens"]
    usage = await gw.quota_usage(tid)
    assert usage["configured"] and usage["in_flight"] == 0 and usage["max_concurrency"] == 4
    assert usage["requests"]["limit"] == 10 and usage["requests"]["remaining"] == 9
    assert usage["daily"] == {
        "used": used,
        "remaining": 100_000 - used,
        "reset_after_s": usage["daily"]["reset_after_s"],
    }
    assert 0 < usage["daily"]["reset_after_s"] <= 86_400 and usage["monthly"]["used"] == used
    key_usage = (await gw.http.get(f"/admin/keys/{key_id}/quota/usage", headers=admin)).json()
    assert key_usage["key_id"] == key_id and key_usage["daily"]["remaining"] == 500 - used

    # Changes are in force at the next request: the tier and the key's budget.
    # The tenant may use priority, its quota may not: the code a tier not allowed has everywhere.
    refused = await gw.chat(key, service_tier="priority")
    assert_openai_error(refused, 403, param="service_tier", code="tier_not_allowed")
    assert "service_tier 'priority'" in refused.json()["error"]["message"]
    await gw.http.put(f"/admin/keys/{key_id}/quota", json={"daily_token_budget": used}, headers=admin)
    spent = await gw.chat(key)
    assert_openai_error(spent, 429, code="insufficient_quota")
    assert spent.json()["error"]["type"] == "insufficient_quota" and int(spent.headers["retry-after"]) >= 1
    assert "renews at the end of the UTC day" in spent.json()["error"]["message"]

    for path, body, status in [
        (f"/admin/tenants/{tid}/quota", {"allowed_tiers": ["gold"]}, 422),
        (f"/admin/tenants/{tid}/quota", {"requests_per_minute": -1}, 422),
        (f"/admin/tenants/{tid}/quota", {"tier_shares": {"batch": 1.5}}, 422),
        (f"/admin/tenants/{tid}/quota", {"rpm": 3}, 422),
        ("/admin/tenants/999999/quota", {}, 404),
        ("/admin/keys/999999/quota", {}, 404),
    ]:
        assert_openai_error(await gw.http.put(path, json=body, headers=admin), status)
    for body, param in [
        ({"allowed_tiers": ["gold"]}, "allowed_tiers"),
        ({"tier_shares": {"gold": 0.5}}, "tier_shares"),
    ]:
        refused = await gw.http.put(f"/admin/tenants/{tid}/quota", json=body, headers=admin)
        assert_openai_error(refused, 422, param=param)  # the field with the unknown tier
    assert_openai_error(await gw.http.get("/admin/keys/999999/quota/usage", headers=admin), 404)
    assert_openai_error(await gw.http.get(f"/admin/tenants/{tid}/quota"), 401)
    assert_openai_error(
        await gw.http.put(f"/admin/tenants/{tid}/quota", json={}, headers={"Authorization": "Bearer nope"}),
        401,
    )


async def test_a_budget_spent_before_redis_lost_the_counters_stays_spent(gw):
    """Redis restarted empty (here the tenant's quota keys deleted, as a restart loses them): the
    next request finds no limits, and the day's use comes back from the usage records with them,
    so a budget spent before the loss stays spent."""
    tenant, key, _ = await gw.tenant(daily_token_budget=60)  # a chat reserves 20 + 4 tokens
    for _ in range(2):
        response = await gw.chat(key)
        assert response.status_code == 200, response.text
    for _ in range(100):  # the usage records are written in batches, after the responses
        if len(gw.records(tenant["id"])) == 2:
            break
        await asyncio.sleep(0.05)
    spent = sum(r.prompt_tokens + r.completion_tokens for r in gw.records(tenant["id"]))
    assert spent == 48 and (await gw.quota_usage(tenant["id"]))["daily"]["used"] == 48
    limiter = gw.app.state.gateway.quota_service.limiter
    assert await limiter.store.clear(str(tenant["id"])) > 0
    assert not (await gw.quota_usage(tenant["id"]))["configured"]  # Redis knows nothing of it now

    refused = await gw.chat(key)  # 48 + 24 > 60
    assert_openai_error(refused, 429, code="insufficient_quota")
    daily = (await gw.quota_usage(tenant["id"]))["daily"]
    assert (daily["used"], daily["remaining"]) == (48, 12)


async def test_a_budget_set_during_the_day_counts_the_days_tokens_before_it(gw):
    tenant, key, _ = await gw.tenant()  # no quota yet
    assert (await gw.chat(key)).status_code == 200
    for _ in range(100):
        if gw.records(tenant["id"]):
            break
        await asyncio.sleep(0.05)
    put = await gw.http.put(
        f"/admin/tenants/{tenant['id']}/quota", json={"daily_token_budget": 30}, headers=admin_headers()
    )
    assert put.status_code == 200, put.text
    assert (await gw.quota_usage(tenant["id"]))["daily"]["used"] == 24
    assert_openai_error(await gw.chat(key), 429, code="insufficient_quota")  # 24 + 24 > 30
