"""The request path runs one way: what the request asks is checked against the context before the
quota admission (nothing charged, nothing queued), and the engine keys fairness by the tenant's id."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import pytest
from gateway_test_helpers import (
    admin_headers,
    assert_openai_error,
    inproc_gateway,
    inproc_worker,
    make_tenant_key,
)

from gateway.lanes.keys import lane_key, model_info_key, workers_key
from gateway.lanes.messages import LaneRequest

CONTEXT = 256  # the tiny model's max_position_embeddings
TIERS = ("priority", "standard", "batch")


@pytest.fixture
def quota_settings(settings, redis):
    """Quotas under a key prefix of their own (tenant ids repeat across test databases)."""
    prefix = f"fltest:path:{uuid.uuid4().hex[:10]}"
    yield settings.model_copy(update={"quota_key_prefix": prefix})
    for key in redis.scan_iter(match=f"{prefix}:*", count=1000):
        redis.delete(key)


def _lane_lengths(redis, model: str) -> list[int]:
    return [redis.xlen(lane_key(model, tier)) for tier in TIERS]


async def test_over_the_context_is_refused_before_admission(quota_settings, redis):
    model = quota_settings.model_name
    # A worker that announces itself and the context but consumes nothing: an entry would stay.
    redis.zadd(workers_key(model), {"announced-only": time.time()})
    redis.hset(model_info_key(model), "max_model_len", CONTEXT)
    async with inproc_gateway(quota_settings) as gw:
        tenant, key = await make_tenant_key(gw.http, "ctx", allowed_tiers=list(TIERS))
        quota = {"requests_per_minute": 10, "tokens_per_minute": 100_000, "daily_token_budget": 100_000}
        put = await gw.http.put(f"/admin/tenants/{tenant['id']}/quota", json=quota, headers=admin_headers())
        assert put.status_code == 200, put.text

        over = await gw.complete(key, [1] * 200, max_tokens=100)  # 300 > 256
        error = assert_openai_error(over, 400, param="max_tokens", code="context_length_exceeded")
        assert "maximum context length is 256" in error["message"] and "200 in the prompt" in error["message"]
        chat_over = await gw.chat(key, messages=[{"role": "user", "content": "x" * 300}])  # the prompt alone
        assert_openai_error(chat_over, 400, param="messages", code="context_length_exceeded")
        usage = await gw.quota_usage(tenant["id"])
        assert (
            usage["requests"]["remaining"] == 10 and usage["daily"]["used"] == 0 and usage["in_flight"] == 0
        )
        assert _lane_lengths(redis, model) == [0, 0, 0] and gw.records(tenant["id"]) == []

        # The same request within the context is charged and queued: the check above could fail.
        fits = asyncio.create_task(gw.complete(key, [1] * 200, max_tokens=56))
        for _ in range(100):
            if sum(_lane_lengths(redis, model)):
                break
            await asyncio.sleep(0.05)
        ((_, fields),) = redis.xrange(lane_key(model, "standard"))
        assert LaneRequest.decode(fields).sampling.max_tokens == 56
        usage = await gw.quota_usage(tenant["id"])
        assert usage["requests"]["remaining"] == 9
        fits.cancel()  # never ran: refunded in full
        with contextlib.suppress(asyncio.CancelledError):
            await fits
        usage = await gw.quota_usage(tenant["id"])
        assert usage["requests"]["remaining"] == 10 and usage["in_flight"] == 0


async def test_a_tenant_renamed_mid_load_keeps_its_fairness_key(settings, tiny_engine_factory):
    engine = tiny_engine_factory(policy="vtc", num_threads=None)
    async with inproc_gateway(settings) as gw:
        with inproc_worker(engine, settings) as (worker, _client):
            tenant, key = await make_tenant_key(gw.http, "before-rename")
            seen: set[str] = set()

            async def watch(requests: list[asyncio.Task]) -> None:
                """The engine's tenant key of every sequence this worker runs, while it runs them."""
                while not all(r.done() for r in requests):
                    with worker.lock:
                        ids = list(worker.inflight)
                    seen.update(seq.tenant for seq in map(engine.seqs.get, ids) if seq is not None)
                    await asyncio.sleep(0.005)

            long_request = dict(max_tokens=48, ignore_eos=True)
            first = [asyncio.create_task(gw.complete(key, [5] * 16, **long_request)) for _ in range(2)]
            watcher = asyncio.create_task(watch(first))
            while not seen:  # running under the old name
                await asyncio.sleep(0.005)
            renamed = await gw.http.patch(
                f"/admin/tenants/{tenant['id']}", json={"name": "after-rename"}, headers=admin_headers()
            )
            assert renamed.status_code == 200 and renamed.json()["name"] == "after-rename"
            second = [asyncio.create_task(gw.complete(key, [6] * 16, **long_request)) for _ in range(2)]
            await watch(second)
            await watcher
            assert [r.result().status_code for r in first + second] == [200] * 4
    assert seen == {str(tenant["id"])}  # one key before and after the rename: one VTC counter
