"""A burst of lane entries enters the engine in one read per lane: Redis round trips per burst and
engine steps counted against real Redis, with the tiers' order and a dead worker's claims kept."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import redis as redislib
from worker_lanes import cleanup as _cleanup
from worker_lanes import lane_request as _request
from worker_lanes import pending as _pending
from worker_lanes import results as _results
from worker_lanes import run_until_done as _run_until_done

from gateway.lanes.keys import cancel_key, lane_key
from gateway.lanes.messages import LaneRequest
from gateway.worker.loop import Worker

TIERS = ["priority", "standard", "batch"]


class CountingConnection(redislib.Connection):
    """A connection that counts what it sends: one packet is one round trip (a pipeline is one)."""

    sent = 0

    def send_packed_command(self, command, check_health=True):
        CountingConnection.sent += 1
        super().send_packed_command(command, check_health)


@pytest.fixture
def counted(redis_url):
    pool = redislib.ConnectionPool.from_url(redis_url, connection_class=CountingConnection)
    client = redislib.Redis(connection_pool=pool)
    yield client
    client.close()


def _submit(redis, model, tier="standard", n=1, **kw) -> list[str]:
    """n requests XADDed in one MULTI/EXEC: a worker blocked on the lane wakes once for all."""
    requests = [_request(model, tier, **kw) for _ in range(n)]
    pipe = redis.pipeline(transaction=True)
    for request in requests:
        pipe.xadd(lane_key(model, tier), request.encode())
    pipe.execute()
    return [r.request_id for r in requests]


def _worker(engine, redis, model, worker_id="w1", **kw) -> Worker:
    worker = Worker(engine, redis, model=model, tiers=TIERS, worker_id=worker_id, block_ms=10, **kw)
    worker.setup()
    return worker


def _waiting_worker(engine, client, model) -> Worker:
    """A worker whose next iteration blocks on the lanes at once (its take left no backlog)."""
    worker = Worker(engine, client, model=model, tiers=TIERS, worker_id="w1", block_ms=3000)
    worker.setup()
    assert worker.lane_io.take(worker.engine.room(worker.lane_io.priorities)) == []  # loads the script
    return worker


def test_a_burst_of_32_costs_three_round_trips_and_one_step(tiny_engine_factory, counted, redis, model_name):
    engine = tiny_engine_factory(max_num_seqs=32, num_kv_blocks=128)
    worker = _worker(engine, counted, model_name)
    worker.run_once()  # idle: loads the script, waits on the lanes
    rids = _submit(redis, model_name, n=32)
    before, steps = CountingConnection.sent, engine.stats.steps
    worker.run_once()
    # idle, the worker starts with its blocking read (one entry); then that entry's cancel mark with
    # the take of the rest (one pipeline), their cancel marks (one pipeline), the step's publish
    assert CountingConnection.sent - before == 4
    assert engine.stats.steps == steps + 1
    assert all(_results(redis, rid)[-1].done for rid in rids)  # max_tokens=1: done in that step
    assert redis.xlen(lane_key(model_name, "standard")) == 0 and worker.inflight == {}
    _cleanup(redis, rids)


def test_a_burst_that_wakes_a_waiting_worker_starts_in_one_step(tiny_engine_factory, redis, model_name):
    """The blocked read returns one entry; the rest of the burst joins it before the engine steps."""
    engine = tiny_engine_factory(max_num_seqs=32, num_kv_blocks=128)
    worker = Worker(engine, redis, model=model_name, tiers=TIERS, worker_id="w1", block_ms=2000)
    worker.setup()
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    try:
        time.sleep(0.3)  # blocked on the lanes
        rids = _submit(redis, model_name, n=32)
        deadline = time.monotonic() + 30
        while not all(_results(redis, r) for r in rids) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert all(_results(redis, rid)[-1].done for rid in rids)
        assert engine.stats.steps == 1
    finally:
        stop.set()
        thread.join(timeout=10)
    _cleanup(redis, rids)


def test_a_single_request_that_wakes_the_worker_costs_no_round_trip_before_the_step(
    tiny_engine_factory, counted, redis, model_name
):
    worker = _waiting_worker(tiny_engine_factory(), counted, model_name)
    timer = threading.Timer(0.2, _submit, args=(redis, model_name))
    timer.start()
    before = CountingConnection.sent
    worker.run_once()
    timer.join()
    # the blocking wait (no take first: the last one left no backlog; the lanes' lengths with it),
    # then the step's publish, which reads the cancel mark (nothing else waits: no take)
    assert CountingConnection.sent - before == 2
    assert worker.inflight == {} and worker.engine.stats.steps == 1


def test_the_take_after_a_wake_loads_its_script_on_a_server_without_it(
    tiny_engine_factory, redis, model_name, monkeypatch
):
    from gateway.worker import lane_io

    monkeypatch.setattr(lane_io, "TAKE_LUA", lane_io.TAKE_LUA + f"\n-- {uuid.uuid4().hex}\n")  # unseen
    worker = _worker(tiny_engine_factory(), redis, model_name)
    rids = _submit(redis, model_name, n=3)
    priors, entries = worker.lane_io.priors([], take=worker.engine.room(worker.lane_io.priorities))
    assert priors == [] and [LaneRequest.decode(e.fields).request_id for e in entries] == rids
    _cleanup(redis, rids)


def test_one_read_takes_what_fits_highest_tier_first(tiny_engine_factory, counted, redis, model_name):
    worker = _worker(tiny_engine_factory(max_num_seqs=4), counted, model_name)
    worker.run_once()
    batch = _submit(redis, model_name, "batch", n=3, max_tokens=4)
    urgent = _submit(redis, model_name, "priority", n=3, max_tokens=4)
    before = CountingConnection.sent
    worker.run_once()  # the blocking read (one entry a lane), the take of the rest, cancel marks, publish
    assert CountingConnection.sent - before == 4
    assert set(worker.inflight) == {*urgent, batch[0]}  # room for 4: the 3 urgent, then the oldest batch
    assert _pending(redis, model_name, "batch") == 1  # the other two stay in the lane for any worker
    assert redis.xlen(lane_key(model_name, "batch")) == 3
    _run_until_done(worker, redis, batch + urgent)
    _cleanup(redis, batch + urgent)


def test_an_urgent_burst_displaces_as_many_as_the_engine_would(tiny_engine_factory, redis, model_name):
    worker = _worker(tiny_engine_factory(max_num_seqs=2, policy="priority"), redis, model_name)
    bulk = _submit(redis, model_name, "batch", n=2, max_tokens=60)
    worker.run_once()
    assert set(worker.inflight) == set(bulk) and worker.engine.num_running == 2
    urgent = _submit(redis, model_name, "priority", n=3, max_tokens=2)
    worker.run_once()  # two running batch sequences can be displaced: two urgent entries are taken
    assert len(set(worker.inflight) & set(urgent)) == 2 and _pending(redis, model_name, "priority") == 2
    _run_until_done(worker, redis, bulk + urgent)
    _cleanup(redis, bulk + urgent)


def test_a_light_tenant_is_taken_while_a_heavy_one_holds_every_slot(tiny_engine_factory, redis, model_name):
    """Under VTC the light tenant's entry is taken at the next step, beside the heavy tenant's
    backlog, and the engine starts it by displacing what the heavy tenant holds beyond its share."""
    worker = _worker(tiny_engine_factory(max_num_seqs=4, policy="vtc"), redis, model_name)
    heavy = _submit(redis, model_name, n=10, max_tokens=40, tenant="heavy")
    worker.run_once()
    assert set(worker.inflight) < set(heavy) and worker.engine.num_running == 4
    light = _submit(redis, model_name, n=1, max_tokens=2, tenant="light")
    worker.run_once()
    assert light[0] in worker.inflight and len(set(worker.inflight) & set(heavy)) == 4
    assert _results(redis, light[0])  # its first token came in that step
    _run_until_done(worker, redis, heavy + light)
    _cleanup(redis, heavy + light)


def test_under_vtc_a_burst_beyond_the_next_steps_tokens_waits_in_the_lane(
    tiny_engine_factory, redis, model_name
):
    """The take hands a VTC engine what its next step starts (its token budget), not a tenant's
    whole burst: the rest waits in the lane, where a second tenant's later burst is weighed against
    it, rather than in the engine's queue, where the second tenant's could not be."""
    engine = tiny_engine_factory(max_num_seqs=8, max_num_batched_tokens=32, policy="vtc")
    worker = _worker(engine, redis, model_name)
    a = _submit(redis, model_name, n=8, max_tokens=16, prompt=[5] * 8, tenant="a")
    worker.run_once()  # 4 prompts of 8 tokens fill the 32-token step
    first = set(worker.inflight)
    assert len(first) == 4 and first < set(a) and engine.num_running == 4 and engine.num_waiting == 0
    b = _submit(redis, model_name, n=8, max_tokens=16, prompt=[6] * 8, tenant="b")
    worker.run_once()  # 4 slots, 28 tokens left: b enters at a's counter, and they alternate
    taken = set(worker.inflight) - first
    assert len(taken & set(a)) == 2 and len(taken & set(b)) == 2
    _run_until_done(worker, redis, a + b)
    _cleanup(redis, a + b)


def test_cancelled_entries_of_a_burst_are_dropped_in_the_same_read(tiny_engine_factory, redis, model_name):
    worker = _worker(tiny_engine_factory(), redis, model_name)
    rids = _submit(redis, model_name, n=8, max_tokens=2)
    for rid in rids[::2]:
        redis.set(cancel_key(rid), b"1", ex=60)
    worker.run_once()
    assert set(worker.inflight) == set(rids[1::2])
    assert all(_results(redis, rid) == [] for rid in rids[::2])  # gone before a token: nothing to relay
    _run_until_done(worker, redis, rids[1::2])
    assert redis.xlen(lane_key(model_name, "standard")) == 0 and _pending(redis, model_name, "standard") == 0
    _cleanup(redis, rids)


def test_a_dead_workers_entries_are_claimed_in_one_read(tiny_engine_factory, counted, redis, model_name):
    dead = _worker(tiny_engine_factory(), redis, model_name, worker_id="dead")
    rids = _submit(redis, model_name, n=5, max_tokens=12)
    for _ in range(4):
        dead.run_once()  # then it stops: its entries stay pending with some tokens published
    survivor = _worker(tiny_engine_factory(), counted, model_name, worker_id="survivor", claim_idle_ms=400)
    survivor.run_once()
    assert survivor.inflight == {}
    time.sleep(0.5)
    before = CountingConnection.sent
    survivor.run_once()
    # take (claims in the same script call), the cancel marks and published tokens, the publish
    assert CountingConnection.sent - before == 3 and set(survivor.inflight) == set(rids)
    _run_until_done(survivor, redis, rids)
    for rid in rids:
        results = _results(redis, rid)
        assert [r.offset for r in results] == list(range(12)) and {r.worker for r in results} == {
            "dead",
            "survivor",
        }
    assert _pending(redis, model_name, "standard") == 0
    _cleanup(redis, rids)


def test_cancels_in_one_step_are_published_together(tiny_engine_factory, counted, redis, model_name):
    engine = tiny_engine_factory()
    worker = _worker(engine, counted, model_name)
    rids = _submit(redis, model_name, n=4, max_tokens=100)
    worker.run_once()
    for rid in rids:
        redis.set(cancel_key(rid), b"1", ex=60)
    before = CountingConnection.sent
    worker.run_once()  # the step's publish reads the marks
    assert worker.inflight == {} and not engine.has_unfinished()
    assert all(_results(redis, rid)[-1].finish_reason == "abort" for rid in rids)
    assert CountingConnection.sent - before == 3  # take, the step's publish, the 4 aborts together
    _cleanup(redis, rids)


class RecordingConnection(redislib.Connection):
    """A connection that keeps every packet it sends (a pipeline is one)."""

    packets: list[bytes] = []

    def send_packed_command(self, command, check_health=True):
        packet = command if isinstance(command, bytes) else b"".join(command)
        RecordingConnection.packets.append(packet)
        super().send_packed_command(command, check_health)


def test_a_lone_entry_that_wakes_the_worker_runs_without_a_take(
    tiny_engine_factory, redis_url, redis, model_name
):
    """The wait reads the lanes' lengths with its blocking read: a lane holding nothing but the entry
    that woke the worker leaves nothing for a take to find, and its cancel mark is read by the
    step's publish."""
    pool = redislib.ConnectionPool.from_url(redis_url, connection_class=RecordingConnection)
    client = redislib.Redis(connection_pool=pool)
    worker = _waiting_worker(tiny_engine_factory(), client, model_name)
    timer = threading.Timer(0.2, _submit, args=(redis, model_name), kwargs={"max_tokens": 2})
    timer.start()
    RecordingConnection.packets = []
    worker.run_once()
    timer.join()
    packets = [p.upper() for p in RecordingConnection.packets]
    assert [p for p in packets if b"EVALSHA" in p] == []
    assert len(packets) == 2 and b"XREADGROUP" in packets[0]
    assert b"MULTI" in packets[1] and b"MGET" in packets[1]  # the publish reads its cancel mark
    assert len(worker.inflight) == 1 and worker.engine.stats.steps == 1
    client.close()


def test_a_cancelled_lone_entry_that_wakes_the_worker_is_aborted_after_one_step(
    tiny_engine_factory, redis, model_name
):
    """A cancel mark set before the entry woke the worker is read by the first step's publish: the
    request is aborted there, its blocks freed, its entry gone from the lane."""
    engine = tiny_engine_factory()
    free = engine.num_free_blocks
    worker = _waiting_worker(engine, redis, model_name)
    ids: list[str] = []

    def cancelled_submit():
        request = _request(model_name, "standard", max_tokens=4)
        redis.set(cancel_key(request.request_id), b"1", ex=60)
        redis.xadd(lane_key(model_name, "standard"), request.encode())
        ids.append(request.request_id)

    timer = threading.Timer(0.2, cancelled_submit)
    timer.start()
    worker.run_once()
    timer.join()
    assert worker.inflight == {} and not engine.has_unfinished() and engine.stats.steps == 1
    assert engine.num_free_blocks == free
    assert _results(redis, ids[0])[-1].finish_reason == "abort"
    assert redis.xlen(lane_key(model_name, "standard")) == 0 and _pending(redis, model_name, "standard") == 0
    _cleanup(redis, ids)
