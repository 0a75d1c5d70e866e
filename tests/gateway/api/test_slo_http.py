"""SLO-aware admission through HTTP: an in-process gateway on the real Redis and a real worker (tiny
model, priority+slo). A request that cannot meet its TTFT target is a 503 ``slo_unattainable`` with
``retry-after``, whether the gateway refuses it at the door or the engine on arrival or at a step
start; nothing is charged for it. With a generous target everything is served as usual.

Most tests drive a "parked" worker by hand (its run_once in a thread) so that the engine's state
and step-cost model are exactly what the test set up; the last ones use a running worker."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid

import httpx
import openai
import pytest
from gateway_test_helpers import (
    InProcessGateway,
    admin_headers,
    assert_openai_error,
    inproc_gateway,
    inproc_worker,
    make_tenant_key,
)

from engine import SamplingParams
from gateway.lanes.keys import lane_key, model_info_key, workers_key
from gateway.lanes.messages import LaneRequest
from gateway.worker.loop import Worker

SLOW_PRIOR = dict(cost_step_s=0.01, cost_prefill_token_s=0.0005, cost_decode_seq_s=0.001)
ALL_TIERS = ["priority", "standard", "batch"]


@pytest.fixture
def slo_settings(settings, redis):
    """Tight TTFT targets (0.1 s) on the priority and standard lanes; quota keys of their own."""
    prefix = f"fltest:slo:{uuid.uuid4().hex[:10]}"
    yield settings.model_copy(
        update={
            "engine": dataclasses.replace(settings.engine, policy="priority+slo"),
            "quota_key_prefix": prefix,
            "tier_ttft_targets": {"priority": 0.1, "standard": 0.1},
            "tier_tpot_targets": {"standard": 2.0},
        }
    )
    for key in redis.scan_iter(match=f"{prefix}:*", count=1000):
        redis.delete(key)


class Gateway(InProcessGateway):
    async def tenant(self, **fields) -> tuple[dict, str]:
        """A tenant allowed every tier, with a key, a daily budget and a request rate (so charges show)."""
        tenant, key = await make_tenant_key(
            self.http, f"t{uuid.uuid4().hex[:8]}", allowed_tiers=ALL_TIERS, **fields
        )
        response = await self.http.put(
            f"/admin/tenants/{tenant['id']}/quota",
            headers=admin_headers(),
            json={"daily_token_budget": 10**6, "requests_per_minute": 1000},
        )
        assert response.status_code == 200, response.text
        return tenant, key

    async def charged(self, tenant_id: int) -> tuple[int, int]:
        """(tokens charged today, requests in flight) from the quota Redis."""
        usage = await self.quota_usage(tenant_id)
        return usage["daily"]["used"], usage["in_flight"]


def _parked_worker(engine, settings, redis) -> Worker:
    """A real Worker announced to the gateways, whose loop the test runs by hand."""
    worker = Worker(
        engine, redis, model=settings.model_name, tiers=settings.tiers, worker_id="parked", block_ms=10
    )
    worker.setup()
    redis.zadd(workers_key(settings.model_name), {"parked": time.time()})
    redis.hset(model_info_key(settings.model_name), "max_model_len", engine.max_model_len)
    return worker


def _backlog(engine, *, priority=2, n=4, prompt_len=200) -> None:
    """Work straight in the engine ahead of newcomers (no lane, no target)."""
    for i in range(n):
        engine.add_request(
            f"backlog-{uuid.uuid4().hex[:6]}",
            [3 + i] * prompt_len,
            SamplingParams(max_tokens=4, ignore_eos=True),
            priority=priority,
        )


async def _until_queued(redis, model: str, tier: str = "standard") -> None:
    for _ in range(500):
        if redis.xlen(lane_key(model, tier)):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the request was never queued")


def _assert_slo_refusal(response: httpx.Response) -> None:
    error = assert_openai_error(response, 503, code="slo_unattainable")
    assert error["type"] == "server_error" and "time-to-first-token" in error["message"]
    assert int(response.headers["retry-after"]) >= 1
    assert response.headers["x-ratelimit-limit-requests"] == "1000"  # it went through the quota check
    # refunded before the answer: its headers count it back (they said 999 left, the usage API 1000)
    assert response.headers["x-ratelimit-remaining-requests"] == "1000"
    assert response.headers["x-ratelimit-reset-requests"] == "0ms"


def _assert_refunded(records, charged) -> None:
    assert charged == (0, 0)  # no tokens, no lease
    (record,) = records
    assert (record.status, record.prompt_tokens, record.completion_tokens) == ("slo_unattainable", 0, 0)


async def test_refused_at_the_door_when_the_backlog_cannot_meet_the_target(
    slo_settings, tiny_engine_factory, redis
):
    engine = tiny_engine_factory(policy="priority+slo", max_num_batched_tokens=128, **SLOW_PRIOR)
    worker = _parked_worker(engine, slo_settings, redis)
    _backlog(engine)  # 800 standard tokens ahead: 7 steps of 74 ms, over the 0.1 s target
    worker.publish_load(force=True)
    async with inproc_gateway(slo_settings, Gateway) as gw:
        tenant, key = await gw.tenant()
        _assert_slo_refusal(await gw.chat(key))
        _assert_slo_refusal(await gw.chat(key, stream=True))  # refused before any stream starts
        assert redis.xlen(lane_key(gw.model, "standard")) == 0  # nothing was queued
        charged = await gw.charged(tenant["id"])
        records = gw.records(tenant["id"])
        assert charged == (0, 0) and [r.status for r in records] == ["slo_unattainable"] * 2
        assert all(r.prompt_tokens == r.completion_tokens == 0 for r in records)
        assert (await gw.quota_usage(tenant["id"]))["requests"]["remaining"] == 1000  # the count, too

        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=gw.app))
        client = openai.AsyncOpenAI(
            base_url="http://gateway/v1", api_key=key, http_client=http, max_retries=0
        )
        with pytest.raises(openai.InternalServerError) as refused:
            await client.chat.completions.create(
                model=gw.model, max_tokens=4, messages=[{"role": "user", "content": "Hi"}]
            )
        await client.close()
        error = refused.value
        assert error.status_code == 503 and error.code == "slo_unattainable"
        assert int(error.response.headers["retry-after"]) >= 1
        assert await gw.charged(tenant["id"]) == (0, 0)


async def test_refused_by_the_engine_on_arrival(slo_settings, tiny_engine_factory, redis):
    engine = tiny_engine_factory(policy="priority+slo", max_num_batched_tokens=128, **SLOW_PRIOR)
    worker = _parked_worker(engine, slo_settings, redis)
    worker.publish_load(force=True)  # idle: the door lets the request in
    _backlog(engine)  # ...but the engine has work the gateways have not seen yet
    async with inproc_gateway(slo_settings, Gateway) as gw:
        tenant, key = await gw.tenant()
        request = asyncio.create_task(gw.chat(key))
        await _until_queued(redis, gw.model)
        await asyncio.to_thread(worker.run_once)  # the engine refuses it in add_request
        _assert_slo_refusal(await request)
        _assert_refunded(gw.records(tenant["id"]), await gw.charged(tenant["id"]))
    assert not worker.inflight and redis.xlen(lane_key(slo_settings.model_name, "standard")) == 0
    while engine.has_unfinished():
        engine.step()
    assert engine.num_free_blocks == engine.num_total_blocks  # nothing of it was left behind


async def test_refused_by_the_engine_at_a_step_start(slo_settings, tiny_engine_factory, redis):
    # A near-zero cost prior predicts it in time on arrival; then it waits behind 800 priority
    # tokens (64 a step) past its 1 s target, and the next step start refuses it.
    settings = slo_settings.model_copy(update={"tier_ttft_targets": {"standard": 1.0}})
    engine = tiny_engine_factory(
        policy="priority+slo",
        max_num_batched_tokens=64,
        cost_step_s=1e-4,
        cost_prefill_token_s=1e-6,
        cost_decode_seq_s=1e-6,
    )
    worker = _parked_worker(engine, settings, redis)
    _backlog(engine, priority=3)
    worker.publish_load(force=True)
    async with inproc_gateway(settings, Gateway) as gw:
        tenant, key = await gw.tenant()
        request = asyncio.create_task(gw.chat(key))
        await _until_queued(redis, gw.model)
        await asyncio.to_thread(worker.run_once)  # admitted, waiting behind the priority work
        assert len(worker.inflight) == 1 and not request.done()
        await asyncio.sleep(1.1)
        await asyncio.to_thread(worker.run_once)
        _assert_slo_refusal(await request)
        _assert_refunded(gw.records(tenant["id"]), await gw.charged(tenant["id"]))
    assert not worker.inflight
    while engine.has_unfinished():
        engine.step()
    assert engine.num_free_blocks == engine.num_total_blocks


async def test_the_lane_request_carries_the_tenants_or_the_tiers_targets(slo_settings, redis):
    settings = slo_settings.model_copy(update={"tier_ttft_targets": {"standard": 30.0}})
    redis.zadd(workers_key(settings.model_name), {"announced-only": time.time()})  # nobody reads the lane
    async with inproc_gateway(settings, Gateway) as gw:
        plain_tenant, plain = await gw.tenant()
        own_tenant, own = await gw.tenant(ttft_target_s=20.0, tpot_target_s=0.5)
        assert (own_tenant["ttft_target_s"], own_tenant["tpot_target_s"]) == (20.0, 0.5)
        for key in (plain, own):
            request = asyncio.create_task(gw.chat(key))
            await _until_queued(redis, gw.model)
            ((entry_id, fields),) = redis.xrange(lane_key(gw.model, "standard"))
            redis.xdel(lane_key(gw.model, "standard"), entry_id)
            queued = LaneRequest.decode(fields)
            request.cancel()
            await asyncio.gather(request, return_exceptions=True)
            expected = (30.0, 2.0) if key == plain else (20.0, 0.5)
            assert (queued.ttft_target_s, queued.tpot_target_s) == expected
        cleared = await gw.http.patch(
            f"/admin/tenants/{own_tenant['id']}", json={"ttft_target_s": None}, headers=admin_headers()
        )
        assert cleared.json()["ttft_target_s"] is None and cleared.json()["tpot_target_s"] == 0.5
        bad = await gw.http.patch(
            f"/admin/tenants/{own_tenant['id']}", json={"ttft_target_s": 0}, headers=admin_headers()
        )
        assert_openai_error(bad, 422, param="ttft_target_s")


async def test_generous_targets_are_served_as_usual(slo_settings, tiny_engine_factory):
    settings = slo_settings.model_copy(update={"tier_ttft_targets": {"priority": 30.0, "standard": 30.0}})
    with inproc_worker(tiny_engine_factory(policy="priority+slo", num_threads=None), settings) as (worker, _):
        async with inproc_gateway(settings, Gateway) as gw:
            tenant, key = await gw.tenant()
            for extra in ({}, {"stream": True}, {"service_tier": "priority"}, {"service_tier": "batch"}):
                response = await gw.chat(key, **extra)
                assert response.status_code == 200, response.text
            plain = (await gw.chat(key)).json()
            assert (
                plain["choices"][0]["finish_reason"] == "length" and plain["usage"]["completion_tokens"] == 4
            )
            records = gw.records(tenant["id"])
            assert len(records) == 5 and {r.status for r in records} == {"length"}
            used = sum(r.prompt_tokens + r.completion_tokens for r in records)
            assert await gw.charged(tenant["id"]) == (used, 0)

            strict, strict_key = await gw.tenant(ttft_target_s=1e-6)  # its own target beats its tier's
            _assert_slo_refusal(await gw.chat(strict_key))
            assert await gw.charged(strict["id"]) == (0, 0)
            assert (await gw.chat(key)).status_code == 200  # the others are not affected
    assert engine_idle(worker)


def engine_idle(worker) -> bool:
    return not worker.inflight and worker.engine.num_free_blocks == worker.engine.num_total_blocks
