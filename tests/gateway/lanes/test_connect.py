"""The gateway's Redis client holds one connection per request waiting on its results: more
requests in flight than redis-py's default pool (100) must still all be served."""

from __future__ import annotations

import asyncio
import uuid

from gateway.lanes.client import LaneClient
from gateway.lanes.connect import async_client
from gateway.lanes.keys import out_key
from gateway.lanes.messages import LaneResult

REDIS_URL = "redis://127.0.0.1:6379/0"
IN_FLIGHT = 150


async def test_more_requests_waiting_on_results_than_the_default_pool_holds():
    redis = async_client(REDIS_URL, max_connections=256)
    lanes = LaneClient(redis, result_ttl_s=30)
    ids = [f"test-connect-{uuid.uuid4().hex}" for _ in range(IN_FLIGHT)]

    async def wait(request_id: str) -> list[str]:
        return [r.finish_reason async for r in lanes.results(request_id, timeout_s=20) if r is not None]

    try:
        waiters = [asyncio.create_task(wait(i)) for i in ids]
        await asyncio.sleep(0.5)  # every waiter is blocked in its XREAD, each on its own connection
        for request_id in ids:
            await redis.xadd(
                out_key(request_id),
                LaneResult(
                    request_id=request_id, token_ids=(7,), text="x", done=True, finish_reason="stop"
                ).encode(),
            )
        finished = await asyncio.gather(*waiters)
    finally:
        await redis.delete(*(out_key(i) for i in ids))
        await redis.aclose()
    assert finished == [["stop"]] * IN_FLIGHT
