"""Result echoes (gateway/lanes/hints.py) at the gateway's result reader, on the real Redis and real
datagram sockets: a request gets each result once, its last from whichever copy comes first; the
Redis copy stays the record (a stream answered from an echo is read on until Redis shows its last
result, and the next admission waits for that); an echo that is lost, late or not a last result
changes nothing."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace

import pytest
import redis.asyncio as aioredis

from gateway.lanes import hints, result_reader
from gateway.lanes.client import LaneClient
from gateway.lanes.keys import out_key
from gateway.lanes.messages import LaneResult

pytestmark = pytest.mark.skipif(not hints.supported(), reason="abstract Unix sockets: Linux only")
POLL_MS = 2000


@pytest.fixture
async def lanes(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    lanes = LaneClient(client, poll_ms=POLL_MS, early_start=True)
    sender = hints.Sender()
    yield lanes, sender
    sender.close()
    await lanes.aclose()
    await client.aclose()


def _results(request_id: str) -> list[LaneResult]:
    """A request's two results: a token, then its last (another token)."""
    return [
        LaneResult(request_id=request_id, token_ids=(11,), num_output_tokens=1),
        LaneResult(
            request_id=request_id,
            token_ids=(12,),
            offset=1,
            done=True,
            finish_reason="length",
            num_output_tokens=2,
            quota_settled=True,
        ),
    ]


def _echo(lanes: LaneClient, sender: hints.Sender, result: LaneResult, seq: int) -> None:
    payload = hints.result_echo(result.request_id, seq, result.encode())
    assert sender.send(lanes.reader.echo_address, payload)


async def _publish(lanes: LaneClient, result: LaneResult) -> None:
    await lanes.redis.xadd(out_key(result.request_id), result.encode())
    await lanes.redis.expire(out_key(result.request_id), 60)


async def _relay(lanes: LaneClient, request_id: str) -> list[LaneResult]:
    return [r async for r in lanes.results(request_id, timeout_s=10) if r is not None]


async def test_an_echo_answers_the_request_and_its_next_admission_waits_for_the_redis_copy(lanes):
    lanes, sender = lanes
    rid = uuid.uuid4().hex
    first, last = _results(rid)
    relay = asyncio.ensure_future(_relay(lanes, rid))
    await asyncio.sleep(0.1)  # registered: the reader blocks on its stream
    await _publish(lanes, first)
    _echo(lanes, sender, last, 1)
    got = await asyncio.wait_for(relay, 1)  # long before the read's 2 s block ends: from the echo
    assert [r.token_ids for r in got] == [(11,), (12,)] and got[-1].quota_settled
    assert await lanes.redis.xlen(out_key(rid)) == 1  # Redis has only the first
    assert not lanes.reader.relaying  # answered: the next request may be hinted

    settled = asyncio.ensure_future(lanes.settled())  # the next admission
    await asyncio.sleep(0.2)
    assert not settled.done()  # its settlement rides with the last result, not yet in Redis
    await _publish(lanes, last)
    await asyncio.wait_for(settled, 1)
    await asyncio.sleep(0.05)
    assert lanes.reader._streams == {}  # read until Redis showed it, then forgotten


async def test_an_echo_of_a_result_that_is_not_the_last_is_not_handed(lanes):
    """Only a last result is taken from an echo: an earlier one, handed ahead of Redis, could differ
    from what another worker resumes from if the worker died between its echo and its publish."""
    lanes, sender = lanes
    rid = uuid.uuid4().hex
    first, last = _results(rid)
    relay = asyncio.ensure_future(_relay(lanes, rid))
    await asyncio.sleep(0.1)
    _echo(lanes, sender, first, 0)
    await asyncio.sleep(0.1)
    assert not relay.done() and lanes.reader._streams[out_key(rid)].handed == 0
    await _publish(lanes, first)
    await _publish(lanes, last)
    got = await asyncio.wait_for(relay, 1)
    assert [r.token_ids for r in got] == [(11,), (12,)]


async def test_a_result_redis_shows_first_is_not_handed_again_by_its_late_echo(lanes):
    lanes, sender = lanes
    rid = uuid.uuid4().hex
    first, last = _results(rid)
    got: list[LaneResult] = []

    async def relay():
        async for result in lanes.results(rid, timeout_s=10):
            got.append(result)

    relaying = asyncio.ensure_future(relay())
    await asyncio.sleep(0.1)
    await _publish(lanes, first)
    for _ in range(100):
        if got:
            break
        await asyncio.sleep(0.01)
    _echo(lanes, sender, first, 0)  # late: Redis handed it already
    _echo(lanes, sender, last, 1)
    await asyncio.wait_for(relaying, 1)
    await _publish(lanes, last)
    await asyncio.wait_for(lanes.settled(), 1)
    assert [r.token_ids for r in got] == [(11,), (12,)]


async def test_an_echo_lost_on_the_way_leaves_its_results_to_redis(lanes):
    lanes, sender = lanes
    rid = uuid.uuid4().hex
    first, last = _results(rid)
    relay = asyncio.ensure_future(_relay(lanes, rid))
    await asyncio.sleep(0.1)
    _echo(lanes, sender, last, 1)  # the echo of the first result never came: this one is not next
    await asyncio.sleep(0.1)
    assert not relay.done()
    await _publish(lanes, first)
    await _publish(lanes, last)
    got = await asyncio.wait_for(relay, 1)
    assert [r.token_ids for r in got] == [(11,), (12,)]
    assert lanes.reader._echoed_last == set()  # nothing of it came from an echo: nothing to wait for
    await asyncio.wait_for(lanes.settled(), 0.01)


async def test_echoes_that_come_before_their_request_asks_are_handed_when_it_does(lanes):
    """The step ended before the admission's reply was back: the request asks for its results after
    its echoes came. Echoes of requests that never ask are forgotten, the oldest first."""
    lanes, sender = lanes
    rid = uuid.uuid4().hex
    only = replace(_results(rid)[1], offset=0)  # one result, the last
    lanes.reader._ensure_running()  # the inbox is read
    _echo(lanes, sender, only, 0)
    await asyncio.sleep(0.1)
    assert lanes.reader._streams == {} and lanes.reader._echoed_last == set()
    await asyncio.wait_for(lanes.settled(), 0.01)  # nothing handed yet: nothing to wait for
    got = await asyncio.wait_for(_relay(lanes, rid), 0.5)
    assert [r.token_ids for r in got] == [(12,)]
    await _publish(lanes, only)
    await asyncio.wait_for(lanes.settled(), 1)

    chatty = _results(uuid.uuid4().hex)[0]  # a request that never asks, its results kept up to a bound
    for seq in range(result_reader.UNCLAIMED_MAX + 5):
        _echo(lanes, sender, chatty, seq)
        await asyncio.sleep(0.002)
    await asyncio.sleep(0.05)
    assert len(lanes.reader._unclaimed[out_key(chatty.request_id)]) == result_reader.UNCLAIMED_MAX
    never = [uuid.uuid4().hex for _ in range(result_reader.UNCLAIMED_MAX + 1)]
    for other in never:
        _echo(lanes, sender, _results(other)[0], 0)
        await asyncio.sleep(0.002)  # read as they come (an inbox queues 10 datagrams by default)
    await asyncio.sleep(0.1)
    assert list(lanes.reader._unclaimed) == [out_key(other) for other in never[1:]]


async def test_an_admission_waits_a_bounded_time_for_a_redis_copy_that_never_comes(lanes, monkeypatch):
    """The worker died between its echo and its publish: the next admission waits SETTLED_WAIT_S at
    most, and the stream is read ECHO_CONFIRM_S at most."""
    monkeypatch.setattr(result_reader, "SETTLED_WAIT_S", 0.2)
    monkeypatch.setattr(result_reader, "ECHO_CONFIRM_S", 0.3)
    lanes, sender = lanes
    lanes.reader.block_ms = 100
    rid = uuid.uuid4().hex
    relay = asyncio.ensure_future(_relay(lanes, rid))
    await asyncio.sleep(0.1)
    _echo(lanes, sender, replace(_results(rid)[1], offset=0), 0)
    assert len(await asyncio.wait_for(relay, 1)) == 1
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(lanes.settled(), 2)
    assert 0.15 < loop.time() - started < 1.0
    await asyncio.sleep(0.5)  # past ECHO_CONFIRM_S and a read's block: given up
    assert lanes.reader._streams == {} and lanes.reader._echoed_last == set()
    await asyncio.wait_for(lanes.settled(), 0.01)


async def test_without_echoes_the_hint_names_no_inbox(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    lanes = LaneClient(client, early_start=True, result_echoes=False)
    try:
        assert lanes.reader.echo_address == ""
    finally:
        await lanes.aclose()
        await client.aclose()
