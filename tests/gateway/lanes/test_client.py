"""LaneClient's discard of relayed requests' result streams on the real Redis: the streams of
requests that end together go in one command, what is still to drop is dropped at shutdown, and an
unreachable Redis leaves the streams to expire without failing anyone."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import redis.asyncio as aioredis

from gateway.lanes.client import DISCARD_EVERY_S, LaneClient
from gateway.lanes.connect import async_client
from gateway.lanes.keys import out_key


class CountingConnection(aioredis.Connection):
    """A connection that counts what it sends: one packet is one command (or one pipeline)."""

    sent = 0

    async def send_packed_command(self, command, check_health=True):
        CountingConnection.sent += 1
        await super().send_packed_command(command, check_health)


async def _streams(client, n: int) -> list[str]:
    ids = [uuid.uuid4().hex for _ in range(n)]
    for rid in ids:
        await client.xadd(out_key(rid), {"v": "1"})
    return ids


async def test_streams_of_requests_ending_together_go_in_one_command(redis_url):
    pool = aioredis.ConnectionPool.from_url(redis_url, connection_class=CountingConnection)
    client = aioredis.Redis(connection_pool=pool)
    lanes = LaneClient(client)
    try:
        ids = await _streams(client, 20)
        before = CountingConnection.sent
        for rid in ids:
            lanes.discard_soon(rid)
        await asyncio.sleep(4 * DISCARD_EVERY_S)
        assert CountingConnection.sent - before == 1
        assert await client.exists(*(out_key(rid) for rid in ids)) == 0
    finally:
        await lanes.aclose()
        await client.aclose()


async def test_streams_still_to_discard_are_dropped_at_shutdown(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    lanes = LaneClient(client)
    ids = await _streams(client, 3)
    for rid in ids:
        lanes.discard_soon(rid)
    await lanes.aclose()  # before the discard was due
    assert await client.exists(*(out_key(rid) for rid in ids)) == 0
    await client.aclose()


async def test_an_unreachable_redis_leaves_the_streams_to_expire(free_tcp_port, caplog):
    client = async_client(f"redis://127.0.0.1:{free_tcp_port}/0")  # the gateway's, with its retries
    lanes = LaneClient(client)
    with caplog.at_level(logging.WARNING, logger="gateway.lanes.client"):
        lanes.discard_soon(uuid.uuid4().hex)
        await asyncio.wait_for(lanes._discarder, 10)
        await lanes.aclose()
    assert any("left to expire" in r.getMessage() for r in caplog.records)
    await client.aclose()


async def test_a_relay_whose_cancellation_was_swallowed_stops_as_cancelled(redis_url):
    """Python 3.11's wait_for (redis-py's send under a socket timeout) can return instead of
    raising when its task is cancelled as the awaited work ends: the relay that follows must still
    end cancelled, not wait out its timeout (the request would be settled as timed out)."""
    client = async_client(redis_url)
    lanes = LaneClient(client, poll_ms=100)
    asleep = asyncio.Event()

    async def request() -> None:
        try:
            asleep.set()
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            pass  # what wait_for does when the awaited work is done as the cancel comes
        async for _ in lanes.results(uuid.uuid4().hex, timeout_s=1):
            pass

    try:
        task = asyncio.create_task(request())
        await asleep.wait()
        task.cancel()
        (outcome,) = await asyncio.gather(task, return_exceptions=True)
        assert isinstance(outcome, asyncio.CancelledError), repr(outcome)
    finally:
        await lanes.aclose()
        await client.aclose()


async def test_a_models_only_live_worker_is_hinted_while_nothing_else_is_relayed(redis_url):
    from engine import SamplingParams
    from gateway.lanes import hints
    from gateway.lanes.keys import WORKER_INBOX_FIELD, lane_key, worker_info_key, workers_key
    from gateway.lanes.messages import LaneRequest

    if not hints.supported():
        return
    client = async_client(redis_url)
    lanes = LaneClient(client, early_start=True)
    model, inbox = f"m-{uuid.uuid4().hex[:8]}", hints.open_inbox()
    assert inbox is not None
    request = LaneRequest("r1", model, "standard", "1", (1, 2), SamplingParams(max_tokens=1))
    lane, fields = lane_key(model, "standard"), request.encode()
    try:
        now, _ = await client.time()
        await client.zadd(workers_key(model), {"w1": now})
        await client.hset(worker_info_key(model, "w1"), WORKER_INBOX_FIELD, inbox.address)
        assert await lanes.has_worker(model, fresh=True)
        assert lanes.hint(request, lane, fields)
        lanes.unhint(request)
        start, drop = inbox.receive()
        reply_to = lanes.reader.echo_address  # where the worker echoes the request's results
        assert reply_to.startswith("fairlane-gateway-")
        assert hints.parse_start(start) == hints.StartHint(
            lane, "r1", b"2", fields["body"].encode(), reply_to
        )
        assert hints.parse_drop(drop) == "r1"

        # a tenant refused at admission is not hinted for its retry-after (1 s at least), others are
        lanes.unhint(request, refused_for_s=0.0)
        assert inbox.receive() == [hints.drop_hint("r1")]
        assert not lanes.hint(request, lane, fields)
        other = LaneRequest("r2", model, "standard", "2", (1, 2), SamplingParams(max_tokens=1))
        assert lanes.hint(other, *lanes.entry(other)) and len(inbox.receive()) == 1
        lanes._held[request.tenant] = time.monotonic()  # its time is up
        assert lanes.hint(request, lane, fields) and len(inbox.receive()) == 1
        # a prompt too long for the head start to matter is never hinted
        long = LaneRequest("r3", model, "standard", "1", tuple(range(300)), SamplingParams(max_tokens=1))
        assert not lanes.hint(long, *lanes.entry(long)) and inbox.receive() == []

        relayed = asyncio.ensure_future(lanes.reader.read(out_key("other"), "0-0", 5000))
        await asyncio.sleep(0.05)  # another request of this replica waits for its results
        assert not lanes.hint(request, lane, fields)
        relayed.cancel()
        lanes.reader.release(out_key("other"))
        assert lanes.hint(request, lane, fields) and len(inbox.receive()) == 1

        await client.zadd(workers_key(model), {"w2": now})  # two live workers: no hint to either
        assert await lanes.has_worker(model, fresh=True)
        assert not lanes.hint(request, lane, fields)
        assert not LaneClient(client).hint(request, lane, fields)  # early starts off: never
        assert inbox.receive() == []
    finally:
        await client.delete(workers_key(model), worker_info_key(model, "w1"))
        await lanes.aclose()
        await client.aclose()
        inbox.close()
