"""Scheduler.room counts what has_room_for answers one request at a time: a worker that reads
Room.count entries of a lane in one go takes what the one by one loop would take (one-token
prompts), never more than it would (longer prompts)."""

import pytest
from helpers import make, run_step, seq

from engine.request import SequenceStatus

PRIORITIES = [3, 2, 1]  # lanes, highest tier first


def one_by_one(s, waiting, lanes, *, prompt=1):
    """What a worker asking has_room_for before every entry takes: lane -> count, highest first."""
    waiting, taken = list(waiting), {}
    for p in lanes:
        taken[p] = 0
        while s.has_room_for(waiting, priority=p) and taken[p] < 100:
            waiting.append(seq(f"x{p}-{taken[p]}", prompt, priority=p))
            taken[p] += 1
    return taken


def counted(s, waiting, lanes):
    room, taken, counts = s.room(waiting, lanes), [], {}
    for p in lanes:
        counts[p] = room.count(p, taken)
        taken += [p] * counts[p]
    return counts


def state(policy, *, running, running_priority, waiting, max_num_seqs=8, num_blocks=64):
    s = make(policy, max_num_seqs=max_num_seqs, num_blocks=num_blocks)
    for i in range(running):
        s.add(seq(f"r{i}", 4, priority=running_priority, max_tokens=64))
    run_step(s)
    return s, [seq(f"w{i}", 4, priority=p) for i, p in enumerate(waiting)]


@pytest.mark.parametrize("policy", ["fcfs", "priority", "vtc", "priority+vtc", "priority+vtc+slo"])
@pytest.mark.parametrize(
    "running, running_priority, waiting, max_num_seqs, num_blocks",
    [
        (0, 1, [], 8, 64),  # empty: the sequence cap
        (3, 1, [2], 8, 64),
        (8, 1, [], 8, 64),  # every slot held by the lowest tier: urgent lanes displace it
        (8, 2, [3], 8, 64),
        (6, 1, [3, 1], 8, 64),
        (2, 1, [], 16, 8),  # the KV blocks bound it, not the cap
        (4, 1, [2, 2], 16, 12),
    ],
)
def test_room_counts_what_has_room_for_admits_one_at_a_time(
    policy, running, running_priority, waiting, max_num_seqs, num_blocks
):
    s, queued = state(
        policy,
        running=running,
        running_priority=running_priority,
        waiting=waiting,
        max_num_seqs=max_num_seqs,
        num_blocks=num_blocks,
    )
    assert counted(s, queued, PRIORITIES) == one_by_one(s, queued, PRIORITIES)


def test_longer_prompts_take_no_more_than_the_count():
    s, queued = state("priority", running=2, running_priority=1, waiting=[], max_num_seqs=16, num_blocks=12)
    exact = one_by_one(s, queued, PRIORITIES, prompt=9)  # three blocks each
    bound = counted(s, queued, PRIORITIES)
    assert all(exact[p] <= bound[p] for p in PRIORITIES) and exact != bound


def test_count_after_higher_tiers_were_taken():
    s, _ = state("priority", running=4, running_priority=1, waiting=[], max_num_seqs=4)
    room = s.room([], [3, 2, 1])
    assert room.free == 0 and room.count(3) == 4 and room.count(1) == 0
    assert room.count(3, [3, 3]) == 2 and room.count(2, [3, 3, 3]) == 1  # they claim the same victims
    assert room.count(3, [1, 1]) == 4  # lower tiers taken do not wait ahead of it


def test_the_room_after_some_were_taken_counts_the_same():
    s, queued = state("priority+vtc", running=6, running_priority=1, waiting=[3, 2])
    room = s.room(queued, PRIORITIES)
    for taken in ([], [3], [3, 2, 2], [1, 1, 3]):
        assert [room.after(taken).count(p) for p in PRIORITIES] == [room.count(p, taken) for p in PRIORITIES]


@pytest.mark.parametrize("policy", ["fcfs", "priority", "vtc", "priority+vtc", "priority+vtc+slo"])
@pytest.mark.parametrize("tenant", ["light", "heavy", "new"])
def test_a_tenants_count_is_what_has_room_for_admits_for_it_one_at_a_time(policy, tenant):
    """Every slot is held, 7 by one tenant: under VTC a tenant below its share would start by
    displacing what the heavy one holds beyond its share; without VTC, nothing would start."""
    s = make(policy, max_num_seqs=8, num_blocks=64)
    for i in range(8):
        s.add(seq(f"r{i}", 4, priority=1, max_tokens=64, tenant="light" if i == 0 else "heavy"))
    run_step(s)
    room = s.room([], PRIORITIES)
    assert set(room.tenants[1]) == {"light", "heavy"} and room.tenants[3] == (
        {} if s.policy.tiers else room.tenants[1]
    )
    waiting, n = [], 0
    while s.has_room_for(waiting, priority=1, tenant=tenant) and n < 100:
        waiting.append(seq(f"n{n}", 1, priority=1, tenant=tenant))
        n += 1
    assert room.count(1, tenant=tenant) == n and room.count(1) == 0
    assert (n > 0) == ("vtc" in policy and tenant != "heavy")
    assert room.most(1) == max(room.count(1, tenant=t) for t in ("light", "heavy", "new"))


@pytest.mark.parametrize("policy", ["vtc", "priority+vtc", "priority+vtc+slo"])
@pytest.mark.parametrize("tenant", ["light", "new"])
def test_a_heavy_tenants_queue_in_the_engine_is_not_ahead_of_a_lighter_tenant(policy, tenant):
    """Every slot is held, 7 by a heavy tenant whose further requests wait in the engine's queue:
    VTC starts a lighter tenant's request before them, by displacing what the heavy one holds beyond
    its share, so the worker's count for that tenant is not spent on the heavy tenant's queue; and
    what the count says starts, starts at the next step."""
    s = make(policy, max_num_seqs=8, num_blocks=64)
    for i in range(8):
        s.add(seq(f"r{i}", 4, priority=1, max_tokens=64, tenant="light" if i == 0 else "heavy"))
    run_step(s)
    queued = [seq(f"q{i}", 4, priority=1, max_tokens=64, tenant="heavy") for i in range(6)]
    for q in queued:
        s.add(q)
    run_step(s)
    assert all(q.status is SequenceStatus.WAITING for q in queued)  # no slot for them
    room = s.room(queued, PRIORITIES)
    assert room.count(1) == 0 and room.count(1, tenant="heavy") == 0
    n = room.count(1, tenant=tenant)
    assert n > 0
    arrivals = [seq(f"{tenant}{i}", 4, priority=1, tenant=tenant) for i in range(n)]
    for x in arrivals:
        s.add(x)
    run_step(s)
    assert all(x.status is SequenceStatus.RUNNING for x in arrivals)
    assert all(q.status is SequenceStatus.WAITING for q in queued)


@pytest.mark.parametrize("policy", ["vtc", "priority+vtc", "priority+vtc+slo"])
def test_a_tenant_new_to_the_engine_is_not_behind_the_only_busy_tenants_queue(policy):
    """One tenant holds every slot and queues more in the engine: a tenant with no work enters
    VTC at that tenant's counter and, holding fewer requests, goes first on the tie; so the count
    for it is not spent on the busy tenant's queue. What the count says starts before any of that
    queue: the first at the next step, the rest as the busy tenant's decodes pass their prompts'
    charge (a step later)."""
    s = make(policy, max_num_seqs=8, num_blocks=64)
    for i in range(8):
        s.add(seq(f"r{i}", 4, priority=1, max_tokens=64, tenant="heavy"))
    run_step(s)
    queued = [seq(f"q{i}", 4, priority=1, max_tokens=64, tenant="heavy") for i in range(6)]
    for q in queued:
        s.add(q)
    run_step(s)
    assert all(q.status is SequenceStatus.WAITING for q in queued)
    room = s.room(queued, PRIORITIES)
    assert room.count(1) == 0 and room.count(1, tenant="heavy") == 0
    n = room.count(1, tenant="new")
    assert n > 0
    arrivals = [seq(f"new{i}", 4, priority=1, tenant="new") for i in range(n)]
    for x in arrivals:
        s.add(x)
    run_step(s)
    assert arrivals[0].status is SequenceStatus.RUNNING
    run_step(s)
    assert all(x.status is SequenceStatus.RUNNING for x in arrivals)
    assert all(q.status is SequenceStatus.WAITING for q in queued)


def test_under_vtc_the_room_is_bounded_by_the_next_steps_token_budget():
    # 3 running decodes take 3 of 32 tokens; a waiting 20-token prompt takes 20: 9 left for prompts
    # not in the engine yet, so entries that start without displacing anyone are taken only while
    # their prompts have not used those up (take.lua); the rest stays in the lanes
    s = make("vtc", max_num_seqs=16, num_blocks=64, max_num_batched_tokens=32)
    for i in range(3):
        s.add(seq(f"r{i}", 4, tenant="a", max_tokens=64))
    run_step(s)
    waiting = [seq("w", 20, tenant="b")]
    room = s.room(waiting, [0])
    assert room.tokens == 32 - 3 - 20 and room.free > 0 and room.count(0) == room.free
    assert room.after([0], tokens=9).count(0) == 0  # spent: nothing more starts for free
    assert s.room(waiting + [seq("w2", 9)], [0]).count(0) == 0
    assert s.room([seq("long", 40, tenant="b")], [0]).tokens == 32 - 3 - 40


def test_a_tenant_below_its_share_displaces_whatever_the_token_budget():
    s = make("vtc", max_num_seqs=3, num_blocks=64, max_num_batched_tokens=32)
    for i in range(3):
        s.add(seq(f"r{i}", 4, tenant="heavy", max_tokens=64))
    run_step(s)
    room = s.room([seq("w", 40, tenant="heavy")], [0])
    assert room.tokens < 0 and room.count(0) == 0 and room.count(0, tenant="heavy") == 0
    assert room.count(0, tenant="light") == 1 and room.most(0) == 1  # a worker still reads the lane


@pytest.mark.parametrize(
    "policy, batching", [("fcfs", "continuous"), ("priority+slo", "continuous"), ("vtc", "static")]
)
def test_without_vtc_or_with_whole_batches_the_room_has_no_token_bound(policy, batching):
    # FCFS and priority order a burst in the engine as the lane would; an SLO-aware policy refuses
    # on arrival what it sees cannot meet its target; a static batch starts whole
    s = make(policy, max_num_seqs=16, num_blocks=64, max_num_batched_tokens=32, batching=batching)
    room = s.room([seq("w", 100)], [0])
    assert room.tokens is None and room.count(0) == room.free > 0
