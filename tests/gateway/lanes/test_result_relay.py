"""The gateway's relay of a request's results (LaneClient.results) on the real Redis: chunks in
order, a chunk seen twice relayed once, and a gap (results lost, e.g. with a Redis restarted
empty while a worker kept publishing) ends the relay with QueueUnavailable, never silently."""

from __future__ import annotations

import time
import uuid

import pytest
import redis.asyncio as aioredis

from gateway.lanes.client import LaneClient, QueueUnavailable, ResultTimeout
from gateway.lanes.keys import out_key, workers_key
from gateway.lanes.messages import LaneResult


@pytest.fixture
async def lanes(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    yield LaneClient(client, poll_ms=20)
    await client.aclose()


async def _publish(
    lanes: LaneClient, request_id: str, chunks: list[tuple[int, tuple[int, ...], bool]]
) -> None:
    for offset, tokens, finished in chunks:
        result = LaneResult(
            request_id=request_id,
            token_ids=tokens,
            text="".join(f" t{t}" for t in tokens),
            offset=offset,
            done=finished,
            finish_reason="length" if finished else None,
            num_output_tokens=offset + len(tokens),
        )
        await lanes.redis.xadd(out_key(request_id), result.encode())
    await lanes.redis.expire(out_key(request_id), 60)


async def _relay(lanes: LaneClient, request_id: str) -> list[int]:
    tokens: list[int] = []
    async for result in lanes.results(request_id, timeout_s=5):
        tokens += result.token_ids
    return tokens


async def test_every_token_once_in_order(lanes):
    rid = uuid.uuid4().hex
    await _publish(lanes, rid, [(0, (1, 2), False), (2, (3,), False), (2, (3,), False), (3, (4, 5), True)])
    assert await _relay(lanes, rid) == [1, 2, 3, 4, 5]  # the chunk published twice (a retried EXEC) once


async def test_a_gap_in_the_results_ends_the_relay(lanes):
    rid = uuid.uuid4().hex
    await _publish(lanes, rid, [(0, (1, 2), False), (3, (4,), False), (4, (5,), True)])  # token 3 is gone
    relayed: list[int] = []
    with pytest.raises(QueueUnavailable, match="lost"):
        async for result in lanes.results(rid, timeout_s=5):
            relayed += result.token_ids
    assert relayed == [1, 2]


async def test_no_first_result_and_no_live_worker_ends_the_wait_after_the_idle_timeout(lanes):
    """A request queued as its only worker died, the worker crash-looping: the wait for its first
    result went on for the whole request timeout (600 s by default) with nobody to run it."""
    model, rid = f"m-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    began = time.monotonic()
    with pytest.raises(ResultTimeout, match="no live worker serves"):
        async for _ in lanes.results(rid, timeout_s=30, idle_timeout_s=0.3, model=model):
            pass
    assert time.monotonic() - began < 5


async def test_no_first_result_with_a_live_worker_waits_the_request_timeout(lanes):
    """A request queued behind others on a live worker waits its whole request timeout."""
    model, rid = f"m-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    now_s, _ = await lanes.redis.time()
    await lanes.redis.zadd(workers_key(model), {"w1": now_s + 60})  # beats "in the future": alive
    try:
        with pytest.raises(ResultTimeout, match=r"in 1 s$"):
            async for _ in lanes.results(rid, timeout_s=1.2, idle_timeout_s=0.3, model=model):
                pass
    finally:
        await lanes.redis.delete(workers_key(model))
