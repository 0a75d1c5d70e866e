"""Quota settlement through HTTP: an in-process gateway on the real Redis with one real worker
(tiny model) for the module. Settlement charges exactly what the usage records say; fail-closed
503 and fail-open when the quota Redis is down; lease renewal while a request waits; refunds when
the client leaves; several prompts in one admission. Limits and headers: test_quotas_http.py."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from gateway_test_helpers import assert_openai_error, inproc_gateway, usage_records
from quota_gateway import QuotaGateway, leave_a_stream


@pytest.fixture
async def gw(quota_settings, quota_worker):
    async with inproc_gateway(quota_settings, QuotaGateway) as gateway:
        yield gateway


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
    await leave_a_stream(gw, key, "abc", 200, settled=lambda records: len(records) == 4, tenant_id=tid)

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
async def test_quota_redis_down(quota_settings, quota_worker, start_valkey, mode):
    """Fail-closed: 503 quota_unavailable with retry-after; fail-open: served, unchecked."""
    server = start_valkey()
    settings = quota_settings.model_copy(
        update={"quota_redis_url": server.connection_url, "quota_on_redis_error": mode}
    )
    try:
        async with inproc_gateway(settings, QuotaGateway) as gw:
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


async def test_open_request_keeps_its_lease_and_is_refunded_when_the_client_leaves(quota_settings, redis):
    """A request waiting in its lane past lease_ttl keeps its concurrency slot (renewed); the client
    leaving before it starts refunds everything."""
    model = f"test-{uuid.uuid4().hex[:10]}"
    redis.zadd(f"workers:{model}", {"announced-only": time.time()})  # nobody consumes the lane
    settings = quota_settings.model_copy(update={"served_model_name": model, "quota_lease_ttl_s": 0.6})
    try:
        async with inproc_gateway(settings, QuotaGateway) as gw:
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


async def test_several_prompts_share_one_admission_and_a_disconnect_aborts_them_all(gw, quota_worker):
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
    await leave_a_stream(gw, key, prompts, 240, settled=bool, tenant_id=tenant["id"])
    (record,) = gw.records(tenant["id"])
    assert record.status == "cancelled" and record.prompt_tokens == 9 and record.completion_tokens < 3 * 240
    assert (await gw.quota_usage(tenant["id"]))["daily"]["used"] == 9 + record.completion_tokens
    for _ in range(50):  # every prompt's engine request was aborted (within a step or two)
        if not quota_worker.engine.has_unfinished():
            break
        await asyncio.sleep(0.1)
    assert not quota_worker.engine.has_unfinished()


async def test_several_prompts_reserve_for_all_and_are_refunded_when_none_ran(quota_settings, redis):
    """Prompts waiting in a lane that no worker reads: the admission reserved every prompt and every
    choice's max_tokens; the client leaving refunds all of it."""
    model = f"test-{uuid.uuid4().hex[:10]}"
    redis.zadd(f"workers:{model}", {"announced-only": time.time()})  # nobody consumes the lane
    settings = quota_settings.model_copy(update={"served_model_name": model})
    try:
        async with inproc_gateway(settings, QuotaGateway) as gw:
            tenant, key, _ = await gw.tenant(max_concurrency=1, daily_token_budget=10**6)
            waiting = asyncio.create_task(gw.complete(key, ["abc", "de", "fghi"], n=2, max_tokens=4))
            for _ in range(100):  # every prompt queued: an entry each
                if sum(redis.xlen(k) for k in redis.scan_iter(match=f"lanes:{model}:*", _type="stream")) == 3:
                    break
                await asyncio.sleep(0.05)
            assert sum(redis.xlen(k) for k in redis.scan_iter(match=f"lanes:{model}:*", _type="stream")) == 3
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


async def test_the_worker_settles_a_one_choice_request_with_its_last_result(gw, monkeypatch):
    """A one-choice request is settled by its worker in the transaction that publishes its last
    result: the gateway sends no settlement of its own, its concurrency slot is free as the response
    arrives (a limit of 1, back to back), and the charge is still exactly the usage records'. A
    request of several choices or several prompts is the gateway's to settle."""
    tenant, key, _ = await gw.tenant(daily_token_budget=10**9, monthly_token_budget=10**10, max_concurrency=1)
    tid = tenant["id"]
    limiter = gw.app.state.gateway.quota_service.limiter
    by_gateway: list[str] = []
    settle = limiter._settle

    async def counted(reservation, used, now):  # the limiter's own settlement, counted
        by_gateway.append(reservation.id)
        return await settle(reservation, used, now)

    monkeypatch.setattr(limiter, "_settle", counted)
    for _ in range(3):
        assert (await gw.chat(key, max_tokens=3)).status_code == 200
        assert (await gw.quota_usage(tid))["in_flight"] == 0  # released before the response
    assert (await gw.chat(key, max_tokens=3, stream=True)).status_code == 200
    assert (await gw.complete(key, "abc", max_tokens=2)).status_code == 200
    assert by_gateway == []
    assert (await gw.complete(key, "abc", max_tokens=2, n=2)).status_code == 200
    assert (await gw.complete(key, ["abc", "abd"], max_tokens=2)).status_code == 200
    assert len(by_gateway) == 2
    records = gw.records(tid)
    assert len(records) == 7 and all(r.completion_tokens > 0 for r in records)
    usage = await gw.quota_usage(tid)
    assert usage["in_flight"] == 0
    assert usage["daily"]["used"] == sum(r.prompt_tokens + r.completion_tokens for r in records)
