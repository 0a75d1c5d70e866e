"""The admission's end of a request that never reached it: an in-process gateway on the real Redis
and database, a model whose only worker is announced and never reads its lane."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from gateway_test_helpers import inproc_gateway
from prometheus_client import REGISTRY
from quota_gateway import QuotaGateway

from gateway.lanes.keys import lane_key, workers_key


def _settlements() -> list[tuple[dict, float]]:
    return [
        (s.labels, s.value)
        for metric in REGISTRY.collect()
        for s in metric.samples
        if s.name == "fairlane_quota_settlements_total"
    ]


async def test_cancelled_before_its_admission_is_reported_and_charges_nothing(quota_settings, redis, caplog):
    """A request cut while its checks wait (the server stopping, say) gets its request log line,
    cancelled with no tokens, and nothing else: no settlement, no usage record, no lane entry."""
    caplog.set_level(logging.INFO, logger="fairlane.request")
    settings = quota_settings.model_copy(update={"served_model_name": f"test-{uuid.uuid4().hex[:10]}"})
    model = settings.model_name
    redis.zadd(workers_key(model), {"announced-only": time.time()})
    try:
        async with inproc_gateway(settings, QuotaGateway) as gw:
            tenant, key, _ = await gw.tenant(daily_token_budget=10**6)
            lanes, asked, never = gw.app.state.gateway.lanes, asyncio.Event(), asyncio.Event()
            has_worker = lanes.has_worker

            async def has_worker_held(model, **kwargs):  # the worker check, held until cancelled
                asked.set()
                await never.wait()
                return await has_worker(model, **kwargs)

            lanes.has_worker = has_worker_held
            before, logged = _settlements(), len(caplog.records)
            waiting = asyncio.create_task(gw.chat(key))
            await asyncio.wait_for(asked.wait(), 10)
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            lines = [r for r in caplog.records[logged:] if r.name == "fairlane.request"]
            assert [(r.status, r.prompt_tokens, r.completion_tokens) for r in lines] == [("cancelled", 0, 0)]
            assert _settlements() == before
            usage = await gw.quota_usage(tenant["id"])
            assert usage["in_flight"] == 0 and usage["daily"]["used"] == 0
            assert gw.records(tenant["id"]) == []
            assert redis.xlen(lane_key(model, "standard")) == 0
    finally:
        for name in redis.scan_iter(match=f"*{model}*", count=1000):
            redis.delete(name)
