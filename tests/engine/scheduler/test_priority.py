"""Priority tiers: order, preemption of lower tiers at the KV limit and at the sequence cap,
victim choice, place keeping, the minimum-share starvation guard."""

from helpers import ids, make, run_step, seq

from engine.request import SequenceStatus


def test_higher_tier_first_fifo_inside_a_tier():
    s = make("priority", max_num_seqs=1)
    for r in (
        seq("lo1", 2, priority=0),
        seq("hi1", 2, priority=1),
        seq("lo2", 2, priority=0),
        seq("hi2", 2, priority=1),
    ):
        s.add(r)
    order = []
    while s.has_unfinished():
        plan = run_step(s)
        for it in plan.scheduled:
            if it.seq.request_id not in order:
                order.append(it.seq.request_id)
            s.finish(it.seq)
    assert order == ["hi1", "hi2", "lo1", "lo2"]


def test_preempts_lower_tier_at_the_sequence_cap():
    s = make("priority", max_num_seqs=2)
    a, b = seq("a", 4, priority=0), seq("b", 8, priority=0)
    s.add(a), s.add(b)
    run_step(s)
    hi = seq("hi", 3, priority=2)
    s.add(hi)
    plan = run_step(s)
    assert ids(plan.preempted) == ["a"]  # lowest tier, then least progress lost (a has 5 tokens in KV, b 9)
    assert "hi" in ids(plan.scheduled) and a.status is SequenceStatus.WAITING
    assert s.policy.peek() is a


def test_preempts_lower_tier_at_the_kv_limit():
    s = make("priority", num_blocks=4, block_size=4, max_num_batched_tokens=64)
    low = seq("low", 12, priority=0)
    s.add(low)
    run_step(s)  # 3 blocks of 4
    hi = seq("hi", 6, priority=1)  # needs 2 blocks, 1 is free
    s.add(hi)
    plan = run_step(s)
    assert ids(plan.preempted) == ["low"] and ids(plan.scheduled) == ["hi"]


def test_equal_tier_never_preempts_and_fcfs_keeps_its_behaviour():
    s = make("priority", max_num_seqs=1)
    s.add(seq("a", 2, priority=1))
    run_step(s)
    s.add(seq("b", 2, priority=1))
    plan = run_step(s)
    assert not plan.preempted and ids(plan.scheduled) == ["a"]


def test_preempted_keeps_its_place_ahead_of_later_arrivals_of_its_tier():
    s = make("priority", max_num_seqs=1)
    a = seq("a", 4, priority=0, arrival=1.0)
    s.add(a)
    run_step(s)
    s.add(seq("later", 4, priority=0, arrival=5.0))
    s.add(seq("hi", 2, priority=1, arrival=6.0))
    plan = run_step(s)
    assert ids(plan.preempted) == ["a"]
    s.finish(s.running[0])  # hi is done
    assert s.policy.peek() is a  # ahead of "later", which arrived after it


def test_victim_under_kv_pressure_is_lowest_tier_not_newest():
    s = make("priority", num_blocks=4, block_size=4, max_num_batched_tokens=64)
    lo, hi = seq("lo", 8, priority=0), seq("hi", 8, priority=1)
    s.add(lo), s.add(hi)
    run_step(s)  # all 4 blocks used; both now hold 9 tokens
    plan = run_step(s)  # hi is served first and needs a third block: lo (older, lower) goes
    assert ids(plan.preempted) == ["lo"] and ids(plan.scheduled) == ["hi"]


def test_budget_is_taken_from_lower_tier_prefill_for_a_higher_tier_prompt():
    s = make("priority", max_num_batched_tokens=8, num_blocks=64)
    low = seq("low", 40, priority=0)
    s.add(low)
    run_step(s)  # low is prefilling in chunks of 8
    s.add(seq("hi", 6, priority=1))
    plan = run_step(s)
    assert [(i.seq.request_id, i.num_tokens) for i in plan.scheduled] == [("hi", 6)]  # low waits a step
    assert not plan.preempted and low.status is SequenceStatus.RUNNING


def test_minimum_share_serves_a_starving_lower_tier():
    s = make("priority", max_num_seqs=1, tier_min_share=0.2)
    for i in range(80):
        s.add(seq(f"hi{i}", 2, priority=1, max_tokens=2))
    s.add(seq("lo", 2, priority=0, max_tokens=2))
    started = []
    for _ in range(120):
        plan = run_step(s)
        for it in plan.scheduled:
            if it.seq.num_output_tokens >= 2:
                s.finish(it.seq)
            if it.seq.request_id not in started:
                started.append(it.seq.request_id)
    assert "lo" in started and started.index("lo") < 60  # long before the high tier ran dry


def test_an_urgent_prefill_runs_beside_decodes_only():
    s = make("priority", max_num_batched_tokens=64)
    s.add(seq("b0", 8, priority=0))
    run_step(s)  # b0 decodes from now on
    s.add(seq("b1", 40, priority=0))
    s.add(seq("hi", 8, priority=1))
    plan = run_step(s)
    # the high tier's prompt and b0's decode run; b1's prompt waits a step (batch work is still queued)
    assert sorted(ids(plan.scheduled)) == ["b0", "hi"]
    plan = run_step(s)
    assert "b1" in ids(plan.scheduled)


def test_without_isolation_the_step_is_filled():
    s = make("priority", max_num_batched_tokens=64, isolate_urgent_prefill=False)
    s.add(seq("b0", 8, priority=0))
    run_step(s)
    s.add(seq("b1", 40, priority=0))
    s.add(seq("hi", 8, priority=1))
    plan = run_step(s)
    assert sorted(ids(plan.scheduled)) == ["b0", "b1", "hi"]


def test_urgent_prefill_can_defer_lower_tier_decodes():
    # CPU-like step costs: steps beside urgent work are kept to 32 tokens (test_urgent_steps.py)
    s = make("priority", max_num_batched_tokens=64, cost_step_s=0.0041, cost_prefill_token_s=0.000375)
    s.add(seq("b0", 8, priority=0))
    s.add(seq("h0", 4, priority=1))
    run_step(s), run_step(s)  # h0's prompt, then b0's: both decode from now on
    s.add(seq("hi", 40, priority=1))
    plan = run_step(s)
    # the urgent prompt runs beside its own tier's decode only; b0's decode waits a step
    assert sorted(ids(plan.scheduled)) == ["h0", "hi"]
    assert sorted(ids(run_step(s).scheduled)) == ["b0", "h0", "hi"]
