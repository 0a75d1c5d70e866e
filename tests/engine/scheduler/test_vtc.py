"""VTC fairness: least-served tenant first, weights, the lift of a tenant returning from idle."""

from helpers import ids, make, run_step, seq


def test_least_served_tenant_is_admitted_first():
    s = make("vtc", max_num_seqs=1)
    s.add(seq("a1", 8, tenant="A")), s.add(seq("a2", 8, tenant="A")), s.add(seq("b1", 8, tenant="B"))
    plan = run_step(s)
    assert plan.scheduled[0].seq.request_id == "b1"  # a tie: the tenant with fewer active requests
    s.finish(plan.scheduled[0].seq)
    assert s.policy.peek().request_id == "a1"  # B has been served 8 input + 1 output token


def test_counters_grow_by_weighted_service_over_tenant_weight():
    s = make("vtc", vtc_input_weight=1.0, vtc_output_weight=2.0)
    s.add(seq("a", 8, tenant="A", weight=1.0)), s.add(seq("b", 8, tenant="B", weight=2.0))
    run_step(s)  # 8 prompt tokens and 1 output token each
    assert s.policy.vtc.counters == {"A": 8 + 2, "B": (8 + 2) / 2}


def ended_step(s, now: list[float]):
    """run_step as a step of one second on the clock ``now``: it starts at now[0] and the engine
    reports its end a second later (the counters are kept as of both)."""
    plan = run_step(s)
    now[0] += 1.0
    s.policy.observe(plan, 1.0)
    return plan


def test_returning_tenant_is_lifted_to_the_minimum_active_counter():
    now = [100.0]
    s = make("vtc", clock=lambda: now[0])
    s.add(seq("a", 8, tenant="A", arrival=now[0]))
    s.add(seq("b", 4, tenant="B", arrival=now[0]))
    ended_step(s, now)
    s.finish(s.running[1])  # B goes idle with a small counter
    for _ in range(3):
        ended_step(s, now)
    s.add(seq("b2", 4, tenant="B", arrival=now[0]))
    vtc = s.policy.vtc
    assert vtc.counters["B"] == vtc.counters["A"]  # no credit banked while idle


def test_a_request_that_waited_upstream_is_lifted_as_of_its_arrival():
    """B's request reached the gateway during a step of A's and waited in a lane for two steps: B
    is lifted to A's counter as it stood when that step started, and the service A got since is
    repaid to B first."""
    now = [100.0]
    s = make("vtc", max_num_seqs=8, clock=lambda: now[0])
    s.add(seq("a1", 8, tenant="A", arrival=now[0], max_tokens=64))
    s.add(seq("a2", 8, tenant="A", arrival=now[0], max_tokens=64))
    ended_step(s, now)
    vtc = s.policy.vtc
    then, arrived = vtc.counters["A"], now[0] + 0.5  # during the next step
    ended_step(s, now)
    ended_step(s, now)
    assert vtc.counters["A"] > then
    s.add(seq("b1", 8, tenant="B", arrival=arrived))
    assert vtc.counters["B"] == then < vtc.counters["A"]
    s.add(seq("a3", 8, tenant="A", arrival=now[0]))
    s.add(seq("b2", 8, tenant="B", arrival=now[0]))
    plan = run_step(s)
    prompts = [it.seq.request_id for it in plan.scheduled if it.seq.num_computed_tokens == it.num_tokens]
    assert prompts[:2] == ["b1", "b2"]  # B is owed A's service since it arrived: its prompts first


def test_a_tenant_idle_at_the_arrival_counts_as_it_became_active_after_it():
    """B's request reached the gateway while the engine was idle; A arrived after it, was served,
    went idle and came back before B's request reached the engine: B is lifted to A's counter as
    A first became active after B's arrival, so A's service since is repaid to B."""
    now = [100.0]
    s = make("vtc", max_num_seqs=8, clock=lambda: now[0])
    ended_step(s, now)  # nothing runs: the counters are kept empty as of now
    arrived = now[0] - 0.5
    s.add(seq("a1", 8, tenant="A", arrival=now[0]))
    vtc = s.policy.vtc
    first = vtc.counters["A"]
    ended_step(s, now)
    s.finish(s.running[0])  # A goes idle
    s.add(seq("a2", 8, tenant="A", arrival=now[0], max_tokens=64))
    ended_step(s, now)
    assert vtc.counters["A"] > first
    s.add(seq("b1", 8, tenant="B", arrival=arrived))
    assert vtc.counters["B"] == first


def test_an_arrival_older_than_the_kept_counters_is_lifted_as_of_now():
    now = [100.0]
    s = make("vtc", clock=lambda: now[0])
    s.add(seq("a", 8, tenant="A", arrival=now[0], max_tokens=64))
    for _ in range(3):
        ended_step(s, now)
    s.add(seq("b", 4, tenant="B", arrival=50.0))  # before every snapshot the counters keep
    assert s.policy.vtc.counters["B"] == s.policy.vtc.counters["A"]


def test_fairness_inside_a_tier_tiers_strict_above():
    s = make("priority+vtc", max_num_seqs=1)
    s.add(seq("hi", 4, tenant="A", priority=1))
    s.add(seq("lo", 4, tenant="B", priority=0))
    s.policy.vtc.counters["A"] = 1e9  # A is far more served, but its tier is higher
    assert s.policy.peek().request_id == "hi"


def test_vtc_victim_is_the_most_served_tenant():
    s = make("vtc", num_blocks=4, block_size=4, max_num_batched_tokens=64)
    a, b = seq("a", 8, tenant="A"), seq("b", 8, tenant="B")
    s.add(a), s.add(b)
    run_step(s)
    s.policy.vtc.counters["A"] += 100
    plan = run_step(s)
    assert [q.request_id for q in plan.preempted] == ["a"]


def test_less_served_tenant_defers_a_more_served_tenants_tokens_of_the_step():
    s = make("vtc", max_num_batched_tokens=8)
    a1, a2 = seq("a1", 4, tenant="A"), seq("a2", 4, tenant="A")
    s.add(a1), s.add(a2)
    run_step(s)  # A's two prompts fill the step
    s.policy.vtc.counters["A"] += 100  # A has been served far more than B will be
    s.add(seq("b", 6, tenant="B"))
    plan = run_step(s)
    # B's whole prompt (6) runs now: A's decodes give up their tokens for this step and keep their blocks
    assert ids(plan.scheduled)[-1] == "b" and plan.scheduled[-1].num_tokens == 6
    assert not plan.preempted and a1 in s.running and a2 in s.running


def test_no_deferral_for_a_tenant_that_would_then_be_the_more_served():
    s = make("vtc", max_num_batched_tokens=8)
    s.add(seq("a1", 4, tenant="A")), s.add(seq("a2", 4, tenant="A"))
    run_step(s)
    s.add(seq("b", 7, tenant="B"))
    s.policy.vtc.counters["B"] = s.policy.vtc.counters["A"] - 3  # less served, but not by its prompt (7)
    plan = run_step(s)
    assert ids(plan.scheduled) == ["a1", "a2", "b"]  # the decodes run; B's prompt is split
    assert plan.scheduled[-1].num_tokens == 6


def test_tenant_below_its_share_of_sequences_preempts_the_heavy_tenants_newest_work():
    s = make("vtc", max_num_seqs=4, max_num_batched_tokens=64)
    heavy = [seq(f"a{i}", 4, tenant="A") for i in range(4)]
    for q in heavy:
        s.add(q)
    run_step(s)
    run_step(s)  # a0..a3 hold every slot
    s.policy.vtc.counters["A"] += 100
    s.add(seq("b", 4, tenant="B"))
    plan = run_step(s)
    assert ids(plan.preempted) == ["a3"]  # A holds 4 of 4 (share 2): its least progress, newest
    assert "b" in ids(plan.scheduled)


def test_no_fairness_preemption_at_or_below_the_share():
    s = make("vtc", max_num_seqs=2, max_num_batched_tokens=64)
    s.add(seq("a0", 4, tenant="A")), s.add(seq("b0", 4, tenant="B"))
    run_step(s)  # one slot each: both at their share
    s.policy.vtc.counters["A"] += 100
    s.add(seq("b1", 4, tenant="B"))
    plan = run_step(s)
    assert not plan.preempted and "b1" not in ids(plan.scheduled)


def test_urgent_prefill_keeps_the_decodes_of_its_own_tier():
    # deferring a heavy tenant's decodes for a light tenant's prompt would break VTC's 2U bound
    # (engine/sim scenario 1): only lower tiers' decodes wait
    s = make("vtc", max_num_batched_tokens=64, max_num_seqs=8)
    for i in range(4):
        s.add(seq(f"h{i}", 8, tenant="heavy", max_tokens=64))
    run_step(s)
    run_step(s)  # heavy holds 4 sequences, all decoding
    s.add(seq("light", 8, tenant="light"))
    plan = run_step(s)
    assert sorted(ids(plan.scheduled)) == ["h0", "h1", "h2", "h3", "light"]


def test_a_light_tenants_prompt_is_not_split_behind_a_heavy_tenants_chunks():
    s = make("vtc", max_num_batched_tokens=32, max_num_seqs=8)
    for i in range(3):
        s.add(seq(f"h{i}", 40, tenant="heavy", max_tokens=64))
    run_step(s)  # heavy's prompts fill every step's budget in chunks
    s.add(seq("light", 24, tenant="light"))
    plan = run_step(s)
    # the chunks that isolation defers give their budget to the light prompt: all 24 tokens at once
    assert [(i.seq.request_id, i.num_tokens) for i in plan.scheduled if i.seq.tenant == "light"] == [
        ("light", 24)
    ]
    assert plan.num_tokens <= 32
