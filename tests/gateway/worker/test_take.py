"""take.lua against real Redis: inside a lane the least-served tenant's entries are taken first (a
virtual token counter per tenant, shared by every worker), a tenant that idled banks no credit, and
a dead worker's entries are still reclaimed, each entry held by exactly one worker."""

from __future__ import annotations

import time
import uuid

from engine import Room, SamplingParams
from gateway.lanes.keys import GROUP, lane_backlog_key, lane_counters_key, lane_key
from gateway.lanes.messages import LaneRequest
from gateway.worker.lane_io import LaneEntry, LaneIO

TIERS = ["priority", "standard", "batch"]
COST = 1.0 * 4  # w_in a prompt token, charged when taken (publish charges the output)


def _submit(redis, model, tenant, n, tier="standard", weight=1.0, prompt=4) -> list[str]:
    pipe = redis.pipeline(transaction=True)
    for _ in range(n):
        request = LaneRequest(
            request_id=f"req-{uuid.uuid4().hex[:12]}",
            model=model,
            tier=tier,
            tenant=tenant,
            prompt_token_ids=tuple(range(5, 5 + prompt)),
            sampling=SamplingParams(max_tokens=1, temperature=0.0),
            weight=weight,
        )
        pipe.xadd(lane_key(model, tier), request.encode())
    return [entry_id.decode() for entry_id in pipe.execute()]


def _io(redis, model, worker_id="w1", **kw) -> LaneIO:
    io = LaneIO(redis, model=model, tiers=TIERS, worker_id=worker_id, **kw)
    io.setup()
    return io


def _room(n: int) -> Room:
    return Room(free=n, displacing={}, tiers=True)


def _tenants(entries: list[LaneEntry]) -> list[str]:
    return [LaneRequest.decode(e.fields).tenant for e in entries]


def _counter(redis, model, tenant, tier="standard") -> float:
    return float(redis.hget(lane_counters_key(model, tier), tenant) or 0)


def test_a_light_tenant_is_taken_before_a_heavy_backlog_ahead_of_it(redis, model_name):
    _submit(redis, model_name, "heavy", 50)
    light = _submit(redis, model_name, "light", 2)
    io = _io(redis, model_name)
    taken = io.take(_room(4))
    assert len(taken) == 4 and {e.entry_id for e in taken} >= set(light)
    assert sorted(_tenants(taken)) == ["heavy", "heavy", "light", "light"]
    lane = lane_key(model_name, "standard")
    info = redis.xpending(lane, GROUP)
    assert info["pending"] == 4 and redis.xlen(lane) - info["pending"] == 48  # what waits, as /metrics says
    # the rest is the heavy tenant's, oldest first, for any worker
    rest = _io(redis, model_name, "w2").take(_room(100))
    assert len(rest) == 48 and set(_tenants(rest)) == {"heavy"}
    ids = [e.entry_id for e in rest]
    assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
    assert redis.zcard(lane_backlog_key(model_name, "standard")) == 0


def test_without_a_fair_policy_a_lane_is_taken_in_order(redis, model_name):
    heavy = _submit(redis, model_name, "heavy", 50)
    _submit(redis, model_name, "light", 2)
    taken = _io(redis, model_name, fair=False).take(_room(4))
    assert [e.entry_id for e in taken] == heavy[:4]


def test_published_output_is_charged_to_the_tenants_counter(redis, model_name):
    io = _io(redis, model_name)
    _submit(redis, model_name, "a", 3)
    _submit(redis, model_name, "b", 3)
    taken = io.take(_room(2))  # one each: 4 apiece
    lane = lane_key(model_name, "standard")
    io.publish(served={(lane, "a"): 30.0, (lane, "b"): 2.0})
    assert _counter(redis, model_name, "a") == 34 and _counter(redis, model_name, "b") == 6
    assert redis.zscore(lane_backlog_key(model_name, "standard"), "a") == 34  # it waits: ordered by it too
    assert _tenants(io.take(_room(2))) == ["b", "b"]  # b is 6, a 34
    assert len(taken) == 2


def test_a_tenant_weighs_its_share(redis, model_name):
    _submit(redis, model_name, "one", 12)
    _submit(redis, model_name, "two", 12, weight=2.0)
    taken = _io(redis, model_name).take(_room(9))
    assert _tenants(taken).count("two") == 6 and _tenants(taken).count("one") == 3


def test_a_returning_tenant_is_lifted_to_those_waiting(redis, model_name):
    io = _io(redis, model_name)
    _submit(redis, model_name, "b", 1)
    assert _tenants(io.take(_room(1))) == ["b"]  # b's counter: one entry's cost
    _submit(redis, model_name, "a", 10)
    assert len(io.take(_room(10))) == 10  # a alone, served 10 entries while b idled
    assert _counter(redis, model_name, "a") == 10 * COST
    _submit(redis, model_name, "a", 10)
    _submit(redis, model_name, "b", 10)
    taken = io.take(_room(4))
    # b enters at a's counter, not at its own: no burst of 9 entries' credit
    assert sorted(_tenants(taken)) == ["a", "a", "b", "b"]
    assert _counter(redis, model_name, "b") == _counter(redis, model_name, "a") == 12 * COST


def test_a_tenant_returning_to_an_empty_lane_enters_at_the_lane_virtual_time(redis, model_name):
    io = _io(redis, model_name)
    _submit(redis, model_name, "b", 1)
    io.take(_room(1))
    for _ in range(5):  # a alone, every entry taken at once: nothing ever waits
        _submit(redis, model_name, "a", 2)
        io.take(_room(2))
    _submit(redis, model_name, "b", 4)
    _submit(redis, model_name, "a", 4)
    taken = io.take(_room(4))
    assert _tenants(taken).count("b") <= 3  # b's credit is at most one entry, not nine
    assert _counter(redis, model_name, "b") >= 9 * COST


def test_entries_are_held_by_one_worker_each_and_a_dead_workers_are_reclaimed(redis, model_name):
    ids = set(_submit(redis, model_name, "a", 10) + _submit(redis, model_name, "b", 10))
    dead, survivor = _io(redis, model_name, "dead"), _io(redis, model_name, "survivor", claim_idle_ms=200)
    held = [e.entry_id for e in dead.take(_room(6))]
    survivor._claim_due()  # its next take claims only once claim_idle_ms / CLAIMS_PER_IDLE passed
    mine = [e.entry_id for e in survivor.take(_room(20))]
    assert len(held) == 6 and len(mine) == 14 and set(held) | set(mine) == ids and not set(held) & set(mine)
    lane = lane_key(model_name, "standard")
    pending = redis.xpending_range(lane, GROUP, min="-", max="+", count=100)
    assert {p["times_delivered"] for p in pending} == {1}
    assert {p["consumer"].decode() for p in pending} == {"dead", "survivor"}
    for entry_id in mine:
        redis.xack(lane, GROUP, entry_id)
        redis.xdel(lane, entry_id)
    time.sleep(0.3)  # the dead worker's entries idle past claim_idle_ms
    survivor._last_claim = 0.0
    claimed = survivor.take(_room(20))
    assert {e.entry_id for e in claimed} == set(held) and all(e.claimed for e in claimed)
    assert survivor.take(_room(20)) == []


def test_an_entry_deleted_while_it_waits_is_skipped_and_an_unreadable_one_taken(redis, model_name):
    a = _submit(redis, model_name, "a", 3)
    io = _io(redis, model_name)
    assert [e.entry_id for e in io.take(_room(1))] == a[:1]
    garbage = redis.xadd(lane_key(model_name, "standard"), {"v": "2", "body": "not json"}).decode()
    redis.xdel(lane_key(model_name, "standard"), a[1])  # an operator removed it
    taken = io.take(_room(3))
    assert {e.entry_id for e in taken} == {a[2], garbage}  # the worker drops what it cannot read


def test_with_no_room_a_tenant_below_its_share_is_taken_while_it_displaces(redis, model_name):
    _submit(redis, model_name, "heavy", 5)
    fresh = _submit(redis, model_name, "light", 2) + _submit(redis, model_name, "other", 1)
    io = _io(redis, model_name)  # standard is priority 2; the engine holds heavy's work only
    full = {3: 0, 2: 0, 1: 0}
    taken = io.take(Room(free=0, displacing=full, tiers=True, fresh={2: 2}, tenants={2: {"heavy": 0}}))
    assert {e.entry_id for e in taken} == {fresh[0], fresh[2]}  # one a tenant, as long as it displaces
    # light holds one sequence now, still below its share: its own count lets one more in
    room = Room(free=0, displacing=full, tiers=True, fresh={2: 0}, tenants={2: {"heavy": 0, "light": 1}})
    assert [e.entry_id for e in io.take(room)] == [fresh[1]]
    assert io.take(Room(free=0, displacing=full, tiers=True, fresh={2: 1}, tenants={2: {"heavy": 0}})) == []


def test_free_room_is_taken_only_until_the_prompts_use_up_the_next_steps_tokens(redis, model_name):
    # Room.tokens (the engine runs VTC): 25 prompt tokens left in its next step. Two 10-token
    # prompts fit, the third crosses the budget (its prompt is chunked): the rest of both
    # tenants' burst stays in the lane, weighed by their counters at the next take.
    _submit(redis, model_name, "a", 6, prompt=10)
    _submit(redis, model_name, "b", 6, prompt=10)
    io = _io(redis, model_name)
    taken = io.take(Room(free=20, displacing={}, tiers=True, tokens=25))
    assert sorted(_tenants(taken)) == ["a", "a", "b"] and io.backlogged
    assert io.take(Room(free=20, displacing={}, tiers=True, tokens=0)) == []  # spent: no round trip
    # a tenant below its share still starts by displacing, budget or not
    (light,) = _submit(redis, model_name, "light", 1, prompt=10)
    room = Room(free=20, displacing={}, tiers=True, fresh={2: 1}, tenants={2: {"a": 0, "b": 0}}, tokens=0)
    assert [e.entry_id for e in io.take(room)] == [light]
    rest = io.take(Room(free=20, displacing={}, tiers=True, tokens=1000))
    assert sorted(_tenants(rest)) == ["a"] * 4 + ["b"] * 5
    assert redis.zcard(lane_backlog_key(model_name, "standard")) == 0


def test_backlog_entries_without_their_prompt_length_are_still_taken(redis, model_name):
    # an entry a take before the prompt lengths were kept left in the backlog ("id cost"): it costs
    # its tenant as before and counts no tokens against the budget
    _submit(redis, model_name, "a", 3, prompt=10)
    io = _io(redis, model_name)
    assert len(io.take(_room(1))) == 1
    queue = lane_backlog_key(model_name, "standard") + ":a"
    for i, item in enumerate(redis.lrange(queue, 0, -1)):
        entry_id, charge, prompt = item.decode().split(" ")
        assert prompt == "10"
        redis.lset(queue, i, f"{entry_id} {charge}")
    assert len(io.take(Room(free=20, displacing={}, tiers=True, tokens=1))) == 2
    assert _counter(redis, model_name, "a") == 3 * 10.0
