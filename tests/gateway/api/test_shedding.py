"""Overload shedding through HTTP: a replica bound to two admissions in flight refuses the third at
once with 503, the OpenAI error body and retry-after, charges its tenant nothing and counts it in
/metrics. The model's worker is registered as alive but runs nowhere, so admitted requests wait for
their first results and stay in flight."""

from __future__ import annotations

import asyncio
import re

import pytest
from gateway_test_helpers import assert_openai_error, inproc_gateway
from quota_gateway import QuotaGateway

from gateway.lanes.keys import lane_key, workers_key

BOUND = 2


@pytest.fixture
async def gw(settings, redis):
    now_s, _ = redis.time()
    redis.zadd(workers_key(settings.model_name), {"a-worker-that-never-takes": now_s})
    bound = settings.model_copy(update={"max_inflight_admissions": BOUND})
    async with inproc_gateway(bound, QuotaGateway) as gateway:
        yield gateway


def _shed_count(text: str) -> float:
    match = re.search(r'^fairlane_gateway_shed_total\{reason="admissions"\} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


async def test_admissions_over_the_bound_are_shed_with_503_and_nothing_charged(gw, redis):
    tenant, key, _ = await gw.tenant(requests_per_minute=60, tokens_per_minute=600, max_concurrency=10)
    waiting = [asyncio.create_task(gw.complete(key, "hello there", max_tokens=4)) for _ in range(BOUND)]
    try:
        while redis.xlen(lane_key(gw.model, "standard")) < BOUND:
            await asyncio.sleep(0.01)  # both admitted and queued, waiting for their first results
        before = await gw.quota_usage(tenant["id"])
        shed_before = _shed_count((await gw.http.get("/metrics")).text)

        response = await gw.complete(key, "one too many", max_tokens=4)

        error = assert_openai_error(response, 503, code="overloaded")
        assert error["type"] == "server_error" and "overloaded" in error["message"]
        assert response.headers["retry-after"] == "1"
        after = await gw.quota_usage(tenant["id"])  # nothing charged (the buckets only refill)
        assert after["in_flight"] == before["in_flight"] == BOUND
        assert after["requests"]["remaining"] >= before["requests"]["remaining"]
        assert after["tokens"]["remaining"] >= before["tokens"]["remaining"]
        assert redis.xlen(lane_key(gw.model, "standard")) == BOUND  # nothing queued
        assert _shed_count((await gw.http.get("/metrics")).text) == shed_before + 1
        assert not any(task.done() for task in waiting)
    finally:
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
    assert gw.app.state.gateway.admissions.inflight == 0  # the cancelled admissions left the count


async def test_a_replica_whose_redis_pool_is_nearly_spent_sheds(redis_url):
    from gateway.api.shedding import AdmissionBound, Overloaded
    from gateway.lanes.connect import async_client

    client = async_client(redis_url, max_connections=8)
    bound = AdmissionBound(client, max_inflight=100, pool_fraction=0.25, retry_after_s=3)  # 2 of 8
    pool = client.connection_pool
    held = [await pool.get_connection() for _ in range(2)]  # two commands in flight
    try:
        with bound.held(), pytest.raises(Overloaded) as refused:
            bound.check()
        assert refused.value.status_code == 503 and refused.value.headers == {"retry-after": "3"}
        await pool.release(held.pop())
        with bound.held():
            bound.check()  # one in use: under the bound
    finally:
        for connection in held:
            await pool.release(connection)
        await client.aclose()
