"""The replica's one reader of result streams (ResultReader, behind LaneClient.results) on the real
Redis: 200 requests in flight relayed over one blocking read at a time, a request that starts
while the read blocks woken at once (not after the poll), a finished stream leaving the read before
its relay is closed, and a Redis error ending every read."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.lanes.client import LaneClient
from gateway.lanes.connect import async_client
from gateway.lanes.keys import out_key
from gateway.lanes.messages import LaneResult
from gateway.lanes.result_reader import ResultReader

POLL_MS = 2000  # long: a request that waited for the poll would show


@pytest.fixture
async def lanes(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    lanes = LaneClient(client, poll_ms=POLL_MS)
    yield lanes
    await lanes.aclose()
    await client.aclose()


async def _finish(lanes: LaneClient, request_id: str, tokens: tuple[int, ...]) -> None:
    result = LaneResult(
        request_id=request_id,
        token_ids=tokens,
        done=True,
        finish_reason="length",
        num_output_tokens=len(tokens),
    )
    await lanes.redis.xadd(out_key(request_id), result.encode())
    await lanes.redis.expire(out_key(request_id), 60)


async def _relay(lanes: LaneClient, request_id: str) -> tuple[list[int], float]:
    tokens: list[int] = []
    async for result in lanes.results(request_id, timeout_s=10):
        tokens += result.token_ids
    return tokens, time.monotonic()


async def test_200_requests_in_flight_share_one_reader_and_each_gets_its_own_results(lanes):
    ids = [uuid.uuid4().hex for _ in range(200)]
    relays = [asyncio.ensure_future(_relay(lanes, rid)) for rid in ids]
    await asyncio.sleep(0.2)  # every relay is waiting: the reader blocks on all 200 streams
    pool = lanes.redis.connection_pool
    in_use = len(getattr(pool, "_in_use_connections", ()))
    assert in_use <= 2  # the reader's blocking read (and at most one wake), not one per request
    for i, rid in enumerate(ids):
        await _finish(lanes, rid, (i, i + 1))
    results = await asyncio.wait_for(asyncio.gather(*relays), 10)
    assert [tokens for tokens, _ in results] == [[i, i + 1] for i in range(200)]
    assert lanes.reader._streams == {}  # every relay released its stream


async def test_a_request_starting_while_the_reader_blocks_is_not_left_for_the_poll(lanes):
    first = asyncio.ensure_future(_relay(lanes, uuid.uuid4().hex))  # keeps the reader blocked
    await asyncio.sleep(0.2)
    rid = uuid.uuid4().hex
    await _finish(lanes, rid, (7,))  # its result is there before it asks
    began = time.monotonic()
    tokens, ended = await asyncio.wait_for(_relay(lanes, rid), 5)
    assert tokens == [7] and ended - began < POLL_MS / 1000 / 2
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)


async def test_a_finished_stream_leaves_the_read_before_its_relay_is_closed(lanes):
    """As the gateway's relay does: read up to the last result and leave the generator open. The
    reader stops at once (no unfinished stream left), so the next request starts a read of its
    own: none of them has to wake a read that waits on finished streams."""
    open_relays = []
    for i in range(3):
        rid = uuid.uuid4().hex
        await _finish(lanes, rid, (i,))
        relay = lanes.results(rid, timeout_s=10)
        result = await asyncio.wait_for(anext(relay), 5)
        assert result is not None and result.done and result.token_ids == (i,)
        open_relays.append(relay)  # not closed: its stream is still registered with the reader
        await asyncio.sleep(0.05)
        assert lanes.reader._task is not None and lanes.reader._task.done()
    assert await lanes.redis.exists(lanes.reader.wake_key) == 0  # no wake was needed
    for relay in open_relays:
        await relay.aclose()
    assert lanes.reader._streams == {}


async def test_a_stream_asked_past_its_last_result_is_read_again(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    reader = ResultReader(client, batch=16, block_ms=POLL_MS, is_last=lambda fields: b"last" in fields)
    key = f"out:{uuid.uuid4().hex}"
    try:
        first = await client.xadd(key, {b"last": b"1"})
        assert (await asyncio.wait_for(reader.read(key, "0-0", POLL_MS), 5))[0][1][0][0] == first
        more = await client.xadd(key, {b"more": b"1"})
        assert (await asyncio.wait_for(reader.read(key, first, POLL_MS), 5))[0][1][0][0] == more
    finally:
        await reader.aclose()
        await client.delete(key)
        await client.aclose()


async def test_a_request_cancelled_in_the_step_its_entries_come_is_cancelled(redis_url):
    """The reader hands a request its entries in the very step the request is cancelled (its client
    gone, the server's drain): the read ends cancelled. Through asyncio.wait_for, Python 3.11 gave
    the read its entries instead, and the cancel was lost."""
    client = aioredis.Redis.from_url(redis_url)
    reader = ResultReader(client, batch=16, block_ms=POLL_MS)
    key = f"out:{uuid.uuid4().hex}"
    try:
        read = asyncio.ensure_future(reader.read(key, "0-0", POLL_MS))
        await asyncio.sleep(0.2)  # waiting for its entries
        waiting = reader._streams[key]
        waiting.entries.append((b"1-0", {b"x": b"1"}))
        waiting.ready.set()  # what the reader does when the entries come, and in the same step:
        read.cancel()
        with pytest.raises(asyncio.CancelledError):
            await read
    finally:
        await reader.aclose()
        await client.aclose()


def _named(client) -> str:
    """Name the client's connections (CLIENT SETNAME), so that this test finds its own among those
    of the tests running beside it on the same Redis."""
    name = f"reader-test-{uuid.uuid4().hex[:12]}"
    client.connection_pool.connection_kwargs["client_name"] = name
    return name


async def _blocked_reads(client, name: str) -> list[dict]:
    return [c for c in await client.client_list() if c["cmd"] == "xread" and c["name"] == name]


async def test_a_redis_error_ends_the_read_of_every_waiting_request(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    name = _named(client)
    reader = ResultReader(client, batch=16, block_ms=POLL_MS)
    reads = [asyncio.ensure_future(reader.read(f"out:{uuid.uuid4().hex}", "0-0", POLL_MS)) for _ in range(3)]
    await asyncio.sleep(0.2)
    blocked = await _blocked_reads(client, name)
    assert len(blocked) == 1  # the reader's one blocking read
    await client.client_kill_filter(_id=blocked[0]["id"])  # its connection drops under it
    outcomes = await asyncio.wait_for(asyncio.gather(*reads, return_exceptions=True), 10)
    await reader.aclose()
    await client.aclose()
    assert all(isinstance(o, RedisConnectionError) for o in outcomes), outcomes


async def test_a_client_that_retries_reads_on_after_its_connection_drops(redis_url):
    client = async_client(redis_url)
    name = _named(client)
    reader = ResultReader(client, batch=16, block_ms=POLL_MS)
    key = f"out:{uuid.uuid4().hex}"
    read = asyncio.ensure_future(reader.read(key, "0-0", 5000))
    await asyncio.sleep(0.2)
    blocked = await _blocked_reads(client, name)
    assert len(blocked) == 1
    await client.client_kill_filter(_id=blocked[0]["id"])
    await asyncio.sleep(0.3)  # the retry's backoff, and a new read
    await client.xadd(key, {"v": "1"})
    reply = await asyncio.wait_for(read, 5)
    await reader.aclose()
    await client.aclose()
    assert reply[0][0] == key and reply[0][1][0][1] == {b"v": b"1"}


async def test_200_relays_whose_poll_times_out_together_share_one_epoch_check(redis_url):
    """A slow host: every relay's read ends empty in the same poll and each asks whether Redis was
    restarted; that must be one GET, not one pool connection per relay (16 here for 200 relays)."""
    client = aioredis.Redis.from_url(redis_url, max_connections=16)
    lanes = LaneClient(client, poll_ms=100)
    try:
        ids = [uuid.uuid4().hex for _ in range(200)]
        relays = [asyncio.ensure_future(_relay(lanes, rid)) for rid in ids]
        await asyncio.sleep(0.5)  # several empty polls, every relay checking the epoch after each
        assert not any(r.done() for r in relays)  # none failed for want of a connection
        for i, rid in enumerate(ids):
            await _finish(lanes, rid, (i,))
        results = await asyncio.wait_for(asyncio.gather(*relays), 10)
        assert [tokens for tokens, _ in results] == [[i] for i in range(200)]
    finally:
        await lanes.aclose()
        await client.aclose()
