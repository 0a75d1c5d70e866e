"""The worker's writes to its lanes (LaneOut, gateway/worker/lane_out.py) as Redis sees them, apart
from the engine: the publish's MULTI/EXEC (quota settlements in it, an error reply inside it, a
connection Redis closed before it), and beside it the idle worker's read (LaneIO.wait), on
redis-py's default client and a RESP2 one."""

from __future__ import annotations

import threading

import pytest
import redis as redislib
from worker_lanes import cleanup as _cleanup
from worker_lanes import lane_request as _request
from worker_lanes import pending as _pending

from gateway.lanes.keys import cancel_key, lane_key, out_key
from gateway.lanes.messages import LaneRequest, LaneResult
from gateway.worker.lane_io import LaneIO

TIERS = ["priority", "standard", "batch"]


async def test_a_publish_settles_quotas_and_loads_the_script_where_redis_lost_it(start_valkey):
    """Settlements ride the publish's MULTI/EXEC (EVALSHA); on a server that does not know the
    script (new, restarted or flushed: NOSCRIPT) the worker settles with its text right after."""
    from quotas import Demand, Enqueue, KeySpace, Limiter, QuotaLimits, connect
    from quotas import settlement as quota_settlement

    server = start_valkey()
    client = connect(server.connection_url)
    sync = redislib.Redis.from_url(server.connection_url)
    try:
        limiter = Limiter(client, keys=KeySpace("t"))
        await limiter.store.put("acme", QuotaLimits(max_concurrency=2, daily_token_budget=1000))
        io = LaneIO(sync, model="m", tiers=TIERS, worker_id="w")
        for attempt in range(2):  # the script unknown to the server, then known (EVAL loaded it)
            assert bool(sync.script_exists(quota_settlement.SHA)[0]) == (attempt == 1)
            decision = await limiter.admit(
                Demand("acme", 10, 20), enqueue=Enqueue("lane", {"body": "x"}, settlement=True)
            )
            spec = dict(sync.xrange("lane", decision.entry_id, decision.entry_id)[0][1])[b"settle"]
            io.publish([LaneResult(request_id=f"r{attempt}", done=True)], settlements=[(spec, 10 + 5)])
            assert await limiter.settle(decision.reservation, 10 + 5) == "unknown"  # settled once
        usage = await limiter.store.usage("acme")
        assert usage.in_flight == 0 and usage.daily_used == 2 * 15
        assert len(sync.xrange(out_key("r1"))) == 1
    finally:
        await client.aclose()
        sync.close()
        server.stop()


@pytest.mark.parametrize("protocol", [None, 2])
def test_the_wait_and_the_publish_read_and_write_the_same_on_either_protocol(
    redis_url, redis, model_name, protocol
):
    """redis-py's default client (RESP3 on the wire, replies in RESP2's shapes) and a RESP2 one get
    the same entries from the idle worker's read, and their publishes write the same."""
    client = redislib.Redis.from_url(redis_url, **({} if protocol is None else {"protocol": protocol}))
    try:
        io = LaneIO(client, model=model_name, tiers=TIERS, worker_id="w1", block_ms=50)
        io.setup()
        assert io.wait() == [] and not io.more  # nothing came: the read timed out
        request = _request(model_name, "standard")
        second = _request(model_name, "standard")
        lane = lane_key(model_name, "standard")
        redis.xadd(lane, request.encode())
        redis.xadd(lane, second.encode())
        (woke,) = io.wait()
        assert (woke.lane, woke.claimed) == (lane, False)
        assert woke.fields == {k.encode(): v.encode() for k, v in request.encode().items()}
        assert LaneRequest.decode(woke.fields) == request and io.more  # the second still waits
        redis.set(cancel_key(second.request_id), 1)
        first = LaneResult(request_id=request.request_id, token_ids=(1, 2), text="hi", done=True)
        io.fair = True
        flags = io.publish(
            [first],
            done=[(lane, woke.entry_id)],
            load="load-1",
            watch=[request.request_id, second.request_id],
            served={(lane, "acme"): 1.5},
        )
        assert flags == [False, True]
        (published,) = redis.xrange(out_key(request.request_id))
        assert LaneResult.decode(published[1]) == first
        assert 0 < redis.ttl(out_key(request.request_id)) <= io.result_ttl_s
        assert redis.xlen(lane) == 1 and _pending(redis, model_name, "standard") == 0  # ACKed, deleted
        assert redis.hget(io.load_key, "w1") == b"load-1"
        assert float(redis.hget(io.fair_keys[lane][1], "acme")) == 1.5  # the tenant's counter
    finally:
        client.close()
        _cleanup(redis, [request.request_id, second.request_id])


def test_an_error_reply_inside_the_publish_is_raised_once_the_rest_ran(redis, model_name):
    """A command that fails inside the MULTI/EXEC (a load key of the wrong type) does not undo the
    others (Redis transactions do not roll back): the result is out, the error raised, and the
    connection stays in step for the next publish."""
    io = LaneIO(redis, model=model_name, tiers=TIERS, worker_id="w1")
    redis.set(io.load_key, "not a hash")
    try:
        with pytest.raises(redislib.ResponseError, match="WRONGTYPE"):
            io.publish([LaneResult(request_id="r-wrongtype", done=True)], load="load")
        assert len(redis.xrange(out_key("r-wrongtype"))) == 1
        redis.delete(io.load_key)
        assert io.publish([LaneResult(request_id="r-after", done=True)], load="load", watch=["r-after"]) == [
            False
        ]
        assert redis.hget(io.load_key, "w1") == b"load"
    finally:
        _cleanup(redis, ["r-wrongtype", "r-after"])


def test_a_publish_on_a_connection_redis_closed_goes_out_once_on_a_new_one(redis_url, redis, model_name):
    """The worker's pooled connection killed by the server (a restart, a CLIENT KILL) between two
    publishes: the next publish reconnects and its result is appended once."""
    client = redislib.Redis.from_url(redis_url, client_name=f"w-{model_name}")
    try:
        io = LaneIO(client, model=model_name, tiers=TIERS, worker_id="w1")
        io.stop = threading.Event()
        assert io.publish([LaneResult(request_id=f"{model_name}-a")]) == []
        (ours,) = [c["id"] for c in redis.client_list() if c["name"] == f"w-{model_name}"]
        assert redis.client_kill_filter(_id=ours) == 1  # only this test's connection (others share Redis)
        io.publish([LaneResult(request_id=f"{model_name}-b", done=True)])
        assert len(redis.xrange(out_key(f"{model_name}-b"))) == 1
    finally:
        client.close()
        _cleanup(redis, [f"{model_name}-a", f"{model_name}-b"])
