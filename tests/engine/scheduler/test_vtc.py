"""VTC fairness: least-served tenant first, weights, the lift of a tenant returning from idle."""
from helpers import make, run_step, seq


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


def test_returning_tenant_is_lifted_to_the_minimum_active_counter():
    s = make("vtc")
    s.add(seq("a", 8, tenant="A"))
    s.add(seq("b", 4, tenant="B"))
    run_step(s)
    s.finish(s.running[1])  # B goes idle with a small counter
    for _ in range(3):
        run_step(s)
    s.add(seq("b2", 4, tenant="B"))
    vtc = s.policy.vtc
    assert vtc.counters["B"] == vtc.counters["A"]  # no credit banked while idle


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
