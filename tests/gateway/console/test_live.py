"""The console's lane view against real Redis: entries queued and running, and the wait of the
oldest entry no worker holds (workers take a lane's entries least-served tenant first, not in order)."""

from __future__ import annotations

import time
import uuid

import redis.asyncio as aioredis

from engine import Room, SamplingParams
from gateway.console.live import read_lanes
from gateway.lanes.keys import lane_key
from gateway.lanes.messages import LaneRequest
from gateway.worker.lane_io import LaneIO

TIERS = ["priority", "standard", "batch"]


def _submit(redis, model, tenant) -> str:
    request = LaneRequest(
        request_id=f"req-{uuid.uuid4().hex[:12]}",
        model=model,
        tier="standard",
        tenant=tenant,
        prompt_token_ids=(5, 6, 7, 8),
        sampling=SamplingParams(max_tokens=1),
    )
    return redis.xadd(lane_key(model, "standard"), request.encode()).decode()


async def test_the_oldest_wait_is_of_the_oldest_entry_no_worker_holds(redis, redis_url, model_name):
    io = LaneIO(redis, model=model_name, tiers=TIERS, worker_id="w1")
    io.setup()
    _submit(redis, model_name, "heavy")
    _submit(redis, model_name, "heavy")
    time.sleep(0.3)
    light = _submit(redis, model_name, "light")
    taken = io.take(Room(free=2, displacing={}, tiers=True))  # the light one and the first heavy one
    assert light in {e.entry_id for e in taken}
    client = aioredis.Redis.from_url(redis_url)
    try:
        views = {view.tier: view for view in await read_lanes(client, model_name, TIERS)}
    finally:
        await client.aclose()
    standard = views["standard"]
    assert standard.queued == 1 and standard.running == 2
    assert standard.oldest_wait_s is not None and standard.oldest_wait_s >= 0.3  # the second heavy one
    assert views["batch"].queued == 0 and views["batch"].oldest_wait_s is None
