"""No priority inversion at the limits: when every slot (max_num_seqs) or every KV block is held by
lower tiers, a higher tier's arrival starts within one step, by preempting one of them; and
Scheduler.has_room_for tells a worker that such an arrival would start although has_room is False."""

from helpers import ids, make, run_step, seq

from engine.request import SequenceStatus


def fill(s, n, *, prompt=4, priority=0, tenant="default", max_tokens=64):
    held = [seq(f"b{i}", prompt, priority=priority, tenant=tenant, max_tokens=max_tokens) for i in range(n)]
    for q in held:
        s.add(q)
    run_step(s)
    return held


def test_every_slot_held_by_the_batch_tier():
    s = make("priority", max_num_seqs=4, num_blocks=64)
    held = fill(s, 4)
    assert len(s.running) == 4 and not s.has_room([])
    s.add(seq("hi", 6, priority=2))
    plan = run_step(s)
    assert "hi" in ids(plan.scheduled) and len(plan.preempted) == 1
    assert plan.preempted[0] in held and plan.preempted[0].status is SequenceStatus.WAITING


def test_every_kv_block_held_by_the_batch_tier():
    s = make("priority", max_num_seqs=16, num_blocks=8, block_size=4)
    fill(s, 4, prompt=7)  # 4 x 2 blocks: the cache is full
    assert s.block_manager.num_free_blocks == 0
    s.add(seq("hi", 6, priority=1))
    plan = run_step(s)
    assert "hi" in ids(plan.scheduled) and plan.preempted


def test_kv_thrash_among_the_batch_tier_does_not_hold_back_a_higher_tier():
    # every step one batch sequence needs a new block and preempts another batch sequence: a higher
    # tier's arrival still starts in the same step
    s = make("priority", max_num_seqs=16, num_blocks=8, block_size=4)
    fill(s, 4, prompt=8)  # 4 x 2 blocks full; each decode crosses into a third block
    s.add(seq("hi", 3, priority=1))
    plan = run_step(s)
    assert plan.preempted and "hi" in ids(plan.scheduled)


def test_every_slot_held_under_priority_vtc_and_slo():
    for policy in ("priority+vtc", "slo+priority"):
        s = make(policy, max_num_seqs=3, num_blocks=64)
        fill(s, 3)
        s.add(seq("hi", 5, priority=1))
        plan = run_step(s)
        assert "hi" in ids(plan.scheduled) and len(plan.preempted) == 1, policy


def test_has_room_for_a_higher_tier_at_the_sequence_cap():
    s = make("priority", max_num_seqs=2, num_blocks=64)
    fill(s, 2, priority=1)
    assert not s.has_room([])
    assert not s.has_room_for([], priority=1)  # equal tier: nobody to displace
    assert not s.has_room_for([], priority=0)
    assert s.has_room_for([], priority=2)
    # one urgent request already waiting takes the one displaceable... both are: two may be pulled
    waiting = [seq("w", 4, priority=2)]
    assert s.has_room_for(waiting, priority=2)
    waiting.append(seq("w2", 4, priority=2))
    assert not s.has_room_for(waiting, priority=2)


def test_has_room_for_a_higher_tier_at_the_kv_limit():
    s = make("priority", max_num_seqs=16, num_blocks=8, block_size=4)
    fill(s, 4, prompt=7)
    assert not s.has_room([])
    assert s.has_room_for([], priority=1) and not s.has_room_for([], priority=0)


def test_has_room_for_a_light_tenant_beside_a_heavy_one():
    s = make("vtc", max_num_seqs=4, num_blocks=64)
    fill(s, 4, tenant="heavy")
    assert not s.has_room([])
    assert s.has_room_for([], tenant="light")  # it holds nothing, heavy holds 4 of a share of 2
    assert not s.has_room_for([], tenant="heavy")


def test_has_room_for_is_has_room_under_fcfs():
    s = make("fcfs", max_num_seqs=2, num_blocks=64)
    fill(s, 2)
    assert not s.has_room_for([], priority=5, tenant="x")
    s.finish(s.running[0])
    assert s.has_room_for([], priority=0) == s.has_room([]) is True
